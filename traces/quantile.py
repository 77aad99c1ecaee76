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
BLOCK = 1 << 16  # values compared at a time: the block's masks stay in cache


def order_statistics(x: FloatArray, ranks: Sequence[int]) -> dict[int, float] | None:
    """``sorted(x)[k]`` for each k in ``ranks`` (0 <= k < x.size; no NaN in ``x``),
    without sorting or partitioning ``x``, which is left as it is.

    A strided sample brackets each rank between two values; one pass, a cache-sized
    block of ``x`` at a time, counts the values below each bracket and takes those
    inside it, and a partition of those few gives the exact value (the values below
    are exactly the ranks before). None when a rank fell outside its bracket (the
    caller partitions instead): a sample brackets with a margin of 5 standard
    deviations, so this is rare.
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
    below = [0] * len(windows)
    inside: list[list[FloatArray]] = [[] for _ in windows]
    # A window of one value (ties: a constant column) keeps counts only: every value
    # inside it is that value (and, for 0, the count of -0.0 tells its sign).
    point = [lo == hi for lo, hi, _ in windows]
    equal = [0] * len(windows)
    signed = [0] * len(windows)
    low = np.empty(min(n, BLOCK), dtype=bool)
    keep = np.empty(min(n, BLOCK), dtype=bool)
    for at in range(0, n, BLOCK):
        block = x[at : at + BLOCK]
        lt, le = low[: block.size], keep[: block.size]
        for w, (lo, hi, _) in enumerate(windows):
            if point[w]:
                np.less(block, lo, out=lt)
                below[w] += int(np.count_nonzero(lt))
                np.equal(block, lo, out=le)
                equal[w] += int(np.count_nonzero(le))
                if lo == 0:
                    np.logical_and(np.signbit(block, out=lt), le, out=lt)
                    signed[w] += int(np.count_nonzero(lt))
                continue
            if hi == math.inf:
                if lo == -math.inf:
                    inside[w].append(block.copy())
                    continue
                np.greater_equal(block, lo, out=le)
                below[w] += block.size - int(np.count_nonzero(le))
            else:
                np.less_equal(block, hi, out=le)
                if lo != -math.inf:
                    np.less(block, lo, out=lt)
                    below[w] += int(np.count_nonzero(lt))
                    np.greater(le, lt, out=le)  # <= hi and not < lo
            chosen = block[le]
            if chosen.size:
                inside[w].append(chosen)
    out: dict[int, float] = {}
    for w, (lo, _, ks) in enumerate(windows):
        rel = [k - below[w] for k in ks]
        size = equal[w] if point[w] else sum(p.size for p in inside[w])
        if not all(0 <= r < size for r in rel):
            return None
        if point[w] and signed[w] in (0, size):
            value = -0.0 if lo == 0 and signed[w] else abs(lo) if lo == 0 else lo
            out.update((k, value) for k in ks)
            continue
        values = (
            x[x == lo]  # +0.0 and -0.0 mixed: which one a rank holds, as before
            if point[w]
            else np.concatenate(inside[w])
        )
        values.partition(rel)
        out.update((k, float(values[r])) for k, r in zip(ks, rel, strict=True))
    return out


def linear_percentiles(x: FloatArray, qs: Sequence[float]) -> list[float] | None:
    """``np.percentile(x, qs, method="linear")`` for a large NaN-free ``x``, from
    :func:`order_statistics`: numpy's own virtual index, neighbours, gamma and
    interpolation, applied to the same two order statistics numpy's partition would
    find, so the same floats. ``x`` is not reordered. None: ``x`` is small, or
    numpy's steps are not where they were (call np.percentile)."""
    plan = LinearPlan.of(x.size, qs)
    if plan is None:
        return None
    found = order_statistics(x, plan.ranks)
    return None if found is None else plan.percentiles(found)


class LinearPlan:
    """The order statistics numpy's "linear" percentiles ``qs`` of ``n`` values
    interpolate (:attr:`ranks`), and the percentiles from them: a caller that needs
    other ranks of the same array finds them all in one :func:`order_statistics`."""

    def __init__(self, n: int, qs: Sequence[float]) -> None:
        assert _LINEAR is not None
        self.n = n
        q = np.asanyarray(np.true_divide(list(qs), 100))
        self.virtual = np.asanyarray(_LINEAR["get_virtual_index"](n, q))
        # _get_indexes reads only the array's dtype (for its NaN check).
        self.below, self.above = _np_quantile._get_indexes(np.zeros(0), self.virtual, n)
        self.ranks = [int(i) % n for i in (*self.below, *self.above)]

    @classmethod
    def of(cls, n: int, qs: Sequence[float]) -> LinearPlan | None:
        """The plan for a large array; None: small (numpy's partition is as fast),
        or numpy's steps are not where they were (call np.percentile)."""
        return cls(n, qs) if _LINEAR is not None and n >= MIN_SIZE else None

    def percentiles(self, found: dict[int, float]) -> list[float]:
        """The percentiles, from :func:`order_statistics` of (at least) the ranks."""
        n = self.n
        low = np.array([found[int(i) % n] for i in self.below])
        high = np.array([found[int(i) % n] for i in self.above])
        gamma = _np_quantile._get_gamma(self.virtual, self.below, _LINEAR)
        result = _np_quantile._lerp(low, high, gamma.reshape(self.virtual.shape))
        return [float(v) for v in np.atleast_1d(result)]
