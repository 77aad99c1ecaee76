"""traces.quantile: order statistics and "linear" percentiles bit for bit equal to
numpy's, and the fallback when a strided sample misleads."""

from __future__ import annotations

import numpy as np
import pytest

from traces.quantile import MIN_SIZE, linear_percentiles, order_statistics
from traces.stats import percentiles

QS = ([50, 90, 99], [0, 100], [50, 99.9], [12.5, 37.3, 62.5], [90])


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    n = MIN_SIZE * 3 + 7
    return {
        "ms": rng.integers(20, 3000, n) * 1_000_000 / 1e6,
        "uniform": rng.random(n) * 1e3 - 500,
        "ties": rng.integers(0, 3, n).astype(np.float64),
        "heavy": rng.pareto(1.2, n),
        "smallest": rng.random(MIN_SIZE),
        "constant": np.full(n, 2.5),  # one-value windows: counted, not gathered
        "mostly zero": np.where(rng.random(n) < 0.97, 0.0, rng.random(n)),
        "signed zeros": np.where(rng.random(n) < 0.5, 0.0, -0.0),
    }


@pytest.mark.parametrize("name", sorted(_arrays()))
def test_the_same_floats_as_numpy(name: str) -> None:
    x = _arrays()[name]
    before = x.copy()
    for qs in QS:
        got = linear_percentiles(x, qs)
        assert got is not None
        want = np.percentile(x, qs, method="linear")
        assert got == [float(v) for v in want], qs  # bit for bit
        assert percentiles(x, qs) == got
    assert np.array_equal(x, before)  # not reordered
    ranks = [0, 1, x.size // 2, x.size - 2, x.size - 1]
    found = order_statistics(x, ranks)
    assert found is not None
    assert found == {k: float(np.sort(x)[k]) for k in ranks}


def test_small_arrays_are_numpys() -> None:
    assert linear_percentiles(np.arange(10.0), [50]) is None
    assert percentiles(np.arange(10.0), [50]) == [4.5]


def test_a_misleading_sample_falls_back_to_numpy() -> None:
    n = MIN_SIZE * 4
    x = np.zeros(n)
    x[:: n // (MIN_SIZE)] = 1e9  # the strided sample sees only these
    assert order_statistics(x, [n // 2]) is None
    assert percentiles(x, [50, 99.99]) == [
        float(v) for v in np.percentile(x, [50, 99.99], method="linear")
    ]
