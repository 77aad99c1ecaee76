"""Exact order statistics of large arrays in a few vectorized passes instead of numpy's
partition, and numpy's "linear" percentiles from them, the same to the last bit (numpy's
own index and interpolation code). See docs/metrics.md#percentiles."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

_np_quantile: Any = None
_LINEAR: dict[str, Any] | None = None
try:  # numpy's own index and interpolation steps; np.percentile when they move
    _np_quantile = importlib.import_module("numpy.lib._function_base_impl")
    _LINEAR = _np_quantile._QuantileMethods["linear"]
    for _step in ("_get_indexes", "_get_gamma", "_lerp"):
        getattr(_np_quantile, _step)
except (ImportError, AttributeError, KeyError):  # pragma: no cover
    _LINEAR = None

FloatArray = npt.NDArray[np.float64]
SAMPLE = 1 << 16  # values sampled to bracket each rank
MIN_SIZE = 1 << 16  # below this, numpy's partition is as fast


def order_statistics(x: FloatArray, ranks: Sequence[int]) -> dict[int, float] | None:
    """``sorted(x)[k]`` for each k in ``ranks`` (0 <= k < x.size; no NaN in ``x``),
    without sorting or partitioning ``x``, which is left as it is.

    A strided sample brackets each rank between two values; one pass counts the
    values below a bracket and takes those inside it, and a partition of those few
    gives the exact value (the values below are exactly the ranks before). None
    when a rank fell outside its bracket (the caller partitions instead): a sample
    brackets with a margin of 5 standard deviations, so this is rare.
    """
    n = x.size
    sample = np.sort(x[:: max(1, n // SAMPLE)])
    m = sample.size
    windows: list[tuple[float, float, list[int]]] = []
    for k in sorted(set(ranks)):
        p = k / max(n - 1, 1)
        margin = 5 * math.sqrt(m * p * (1 - p)) + 16
        a, b = math.floor(p * (m - 1) - margin), math.ceil(p * (m - 1) + margin)
        lo = float(sample[a]) if a > 0 else -math.inf
        hi = float(sample[b]) if b < m - 1 else math.inf
        if windows and lo <= windows[-1][1]:  # overlapping brackets: one window
            w_lo, w_hi, ks = windows[-1]
            windows[-1] = (w_lo, max(w_hi, hi), [*ks, k])
        else:
            windows.append((lo, hi, [k]))
    out: dict[int, float] = {}
    for lo, hi, ks in windows:
        if lo == -math.inf:
            below = 0
            inside = x[x <= hi] if hi != math.inf else x.copy()
        else:
            mask = x < lo
            below = int(np.count_nonzero(mask))
            np.logical_not(mask, out=mask)
            if hi != math.inf:
                mask &= x <= hi
            inside = x[mask]
        rel = [k - below for k in ks]
        if not all(0 <= r < inside.size for r in rel):
            return None
        inside.partition(rel)
        out.update((k, float(inside[r])) for k, r in zip(ks, rel, strict=True))
    return out


def linear_percentiles(x: FloatArray, qs: Sequence[float]) -> list[float] | None:
    """``np.percentile(x, qs, method="linear")`` for a large NaN-free ``x``, from
    :func:`order_statistics`: numpy's own virtual index, neighbours, gamma and
    interpolation, applied to the same two order statistics numpy's partition would
    find, so the same floats. ``x`` is not reordered. None: ``x`` is small, or
    numpy's steps are not where they were (call np.percentile)."""
    n = x.size
    if _LINEAR is None or n < MIN_SIZE:
        return None
    q = np.asanyarray(np.true_divide(list(qs), 100))
    virtual = np.asanyarray(_LINEAR["get_virtual_index"](n, q))
    below, above = _np_quantile._get_indexes(x, virtual, n)
    found = order_statistics(x, [int(i) % n for i in (*below, *above)])
    if found is None:
        return None
    low = np.array([found[int(i) % n] for i in below])
    high = np.array([found[int(i) % n] for i in above])
    gamma = _np_quantile._get_gamma(virtual, below, _LINEAR).reshape(virtual.shape)
    result = _np_quantile._lerp(low, high, gamma)
    return [float(v) for v in np.atleast_1d(result)]
