"""Figures by position in the session: by turn (power-of-two buckets) and by subagent
depth, as SGLang's HiCache plots show them. Pure: a numeric request frame in, table
rows out. See docs/metrics.md#kv-cache."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from analysis.results import PositionRow

_NS_PER_MS = 1e6
FloatArray = npt.NDArray[np.float64]


def turn_bucket(request_index: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Bucket of each turn index: 0, 1, 2-3, 4-7, 8-15, ... (bucket k >= 1 holds
    indices 2^(k-1) to 2^k - 1)."""
    idx = np.floor(request_index)  # NaN (unknown) stays NaN: bucket 0
    # The bucket is the index's bit length: frexp's exponent (exact, unlike log2).
    exponent = np.frexp(idx)[1].astype(np.int64)
    out: npt.NDArray[np.int64] = np.where(idx >= 1, exponent, 0)
    return out


def _bucket_label(k: int) -> str:
    if k == 0:
        return "0"
    lo, hi = 1 << (k - 1), (1 << k) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


class _Kept(NamedTuple):
    """The columns the tables read, over the ok, measured rows (taken once for
    both tables)."""

    prompt: FloatArray
    cached: FloatArray
    server_prompt: FloatArray
    ideal: FloatArray
    lru: FloatArray | None
    ttft_ms: FloatArray
    e2e_ms: FloatArray

    @classmethod
    def of(cls, df: pd.DataFrame, keep: npt.NDArray[np.bool_],
           lru: FloatArray | None) -> _Kept:  # fmt: skip
        return cls(
            prompt=m.column(df, "prompt_tokens")[keep],
            cached=m.column(df, "cached_tokens")[keep],
            server_prompt=m.server_prompt(df)[keep],
            ideal=m.column(df, "ideal_cached_tokens")[keep],
            lru=lru[keep] if lru is not None else None,
            ttft_ms=m.column(df, "ttft_ns")[keep] / _NS_PER_MS,
            e2e_ms=m.column(df, "e2e_ns")[keep] / _NS_PER_MS,
        )


def _rows(
    cols: _Kept, g: npt.NDArray[np.int64], labels: dict[int, str]
) -> tuple[PositionRow, ...]:
    """The table rows of groups ``g`` (one per kept row)."""
    if g.size == 0:
        return ()
    n = int(g.max()) + 1
    count = np.bincount(g, minlength=n)

    def rates(values: FloatArray, prompt: FloatArray | None) -> list[float]:
        """Per group, Σ values / Σ prompt (NaN prompts as 0) over the rows whose
        value is known (not NaN): :func:`metrics.hit_rate`; with no ``prompt``, the
        mean of the known values. NaN where nothing is known. Token counts are
        whole numbers, so these sums are exact in any order."""
        nan = np.isnan(values)
        known = ~nan if nan.any() else None
        gk, v = (g, values) if known is None else (g[known], values[known])
        if prompt is None:
            den = np.bincount(gk, minlength=n)
        else:
            p = prompt if known is None else prompt[known]
            p_nan = np.isnan(p)
            den = np.bincount(
                gk, weights=np.where(p_nan, 0.0, p) if p_nan.any() else p, minlength=n
            )
        num = np.bincount(gk, weights=v, minlength=n)
        return [
            float(x / d) if d > 0 else math.nan for x, d in zip(num, den, strict=True)
        ]

    prompt_mean = rates(cols.prompt, None)
    server = rates(cols.cached, cols.server_prompt)
    ideal = rates(cols.ideal, cols.prompt)
    lru_rates = rates(cols.lru, cols.prompt) if cols.lru is not None else None
    # The latencies grouped by one stable sort (small keys: a radix sort); each
    # group's percentiles are then taken on a slice.
    order = np.argsort(g.astype(np.int16) if n < 2**15 else g, kind="stable")
    cuts = np.concatenate([[0], np.cumsum(count)]).tolist()
    ttft = cols.ttft_ms[order]
    e2e = cols.e2e_ms[order]
    out = []
    for k in np.flatnonzero(count).tolist():
        sel = slice(cuts[k], cuts[k + 1])
        p50, p90 = m.percentiles(ttft[sel], [50, 90])
        e50, e90 = m.percentiles(e2e[sel], [50, 90])
        out.append(
            PositionRow(
                group=labels[k],
                requests=int(count[k]),
                ttft_ms_p50=p50,
                ttft_ms_p90=p90,
                e2e_ms_p50=e50,
                e2e_ms_p90=e90,
                prompt_tokens_mean=prompt_mean[k],
                hit_rate_server=server[k],
                hit_rate_ideal=ideal[k],
                hit_rate_lru=None if lru_rates is None else lru_rates[k],
            )
        )
    return tuple(out)


def _turn_groups(df: pd.DataFrame) -> tuple[npt.NDArray[np.int64], dict[int, str]]:
    groups = turn_bucket(m.column(df, "request_index"))
    return groups, {k: _bucket_label(k) for k in range(int(groups.max(initial=0)) + 1)}


# Depths up to this are their own group number; any other (a negative or huge
# agent_depth from a foreign writer) is numbered by its rank among the depths.
_DENSE_DEPTHS = 2**15


def _depth_groups(df: pd.DataFrame) -> tuple[npt.NDArray[np.int64], dict[int, str]]:
    depth = np.nan_to_num(m.column(df, "agent_depth"), nan=0.0).astype(np.int64)
    if depth.min(initial=0) >= 0 and depth.max(initial=0) < _DENSE_DEPTHS:
        return depth, {k: str(k) for k in range(int(depth.max(initial=0)) + 1)}
    values, groups = np.unique(depth, return_inverse=True)
    return groups.astype(np.int64), {k: str(v) for k, v in enumerate(values.tolist())}


def by_turn(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[PositionRow, ...]:
    """Per turn bucket (see :func:`turn_bucket`): requests, TTFT and E2E p50/p90,
    mean prompt, and the prefix hit rates side by side (server: Σ cached / Σ server
    prompt over rows reporting cached_tokens; ideal: Σ ideal / Σ prompt; LRU with
    an estimate). Population: ok, measured rows. Hit rates by
    :func:`metrics.hit_rate` (NaN, never 0, when unknown).

    Figures by position in the session: by turn (the request's index within its session,
    in power-of-two buckets) and by subagent depth, as SGLang's HiCache plots show them.
    Long agent sessions hit the prefix cache more turn after turn, until eviction
    catches up; subagents start with a cold, shorter context.
    """
    return by_turn_and_depth(df, lru)[0]


def by_depth(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[PositionRow, ...]:
    """The same figures per subagent depth (0 = root sessions, 1 = their
    subagents, …). Population: ok, measured rows."""
    return by_turn_and_depth(df, lru)[1]


def by_turn_and_depth(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[tuple[PositionRow, ...], tuple[PositionRow, ...]]:
    """(:func:`by_turn`, :func:`by_depth`), the kept columns taken once."""
    keep = m.measured_ok(df)
    cols = _Kept.of(df, keep, lru)
    tables = []
    for groups, labels in (_turn_groups(df), _depth_groups(df)):
        tables.append(_rows(cols, groups[keep], labels))
    return tables[0], tables[1]
