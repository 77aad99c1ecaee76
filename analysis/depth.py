"""Figures by position in the session: by turn (the request's index within its
session, in power-of-two buckets) and by subagent depth, as SGLang's HiCache plots
show them. Long agent sessions hit the prefix cache more turn after turn, until
eviction catches up; subagents start with a cold, shorter context.

Pure: a numeric request frame (``metrics.numeric_view``) in, table rows out.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m

_NS_PER_MS = 1e6


def turn_bucket(request_index: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Bucket of each turn index: 0, 1, 2-3, 4-7, 8-15, ... (bucket k >= 1 holds
    indices 2^(k-1) to 2^k - 1)."""
    idx = np.nan_to_num(request_index, nan=0.0).astype(np.int64)
    out = np.zeros(idx.size, dtype=np.int64)
    pos = idx > 0
    out[pos] = np.floor(np.log2(idx[pos])).astype(np.int64) + 1
    return out


def _bucket_label(k: int) -> str:
    if k == 0:
        return "0"
    lo, hi = 1 << (k - 1), (1 << k) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _rows(
    df: pd.DataFrame,
    groups: npt.NDArray[np.int64],
    labels: dict[int, str],
    lru: npt.NDArray[np.float64] | None,
) -> list[dict[str, Any]]:
    # The kept rows grouped by one stable sort: each column is gathered once and
    # every group is a slice of it (not a pass over all rows per group).
    rows = np.flatnonzero(m.measured_ok(df))
    g = groups[rows]
    if g.size and g.min() >= 0 and g.max() < 2**15:
        g = g.astype(np.int16)  # small keys: numpy's stable sort is a radix sort
    order = rows[np.argsort(g, kind="stable")]
    g_sorted = groups[order]
    bounds = np.flatnonzero(np.diff(g_sorted)) + 1
    cuts = [0, *bounds.tolist(), order.size]

    def kept(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return values[order]

    ttft = kept(m.column(df, "ttft_ns")) / _NS_PER_MS
    e2e = kept(m.column(df, "e2e_ns")) / _NS_PER_MS
    cached = kept(m.column(df, "cached_tokens"))
    ideal = kept(m.column(df, "ideal_cached_tokens"))
    prompt = kept(m.column(df, "prompt_tokens"))
    server_prompt = kept(m.server_prompt(df))
    lru_k = kept(lru) if lru is not None else None
    out = []
    for a, b in itertools.pairwise(cuts):
        if a == b:
            continue
        sel = slice(a, b)
        p50, p90 = m.percentiles(ttft[sel], [50, 90])
        e50, e90 = m.percentiles(e2e[sel], [50, 90])
        row: dict[str, Any] = {
            "group": labels[int(g_sorted[a])],
            "requests": b - a,
            "ttft_ms_p50": p50,
            "ttft_ms_p90": p90,
            "e2e_ms_p50": e50,
            "e2e_ms_p90": e90,
            "prompt_tokens_mean": float(np.nanmean(prompt[sel])),
            "hit_rate_server": m.hit_rate(cached[sel], server_prompt[sel]),
            "hit_rate_ideal": m.hit_rate(ideal[sel], prompt[sel]),
        }
        if lru_k is not None:
            row["hit_rate_lru"] = m.hit_rate(lru_k[sel], prompt[sel])
        out.append(row)
    return out


def by_turn(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> list[dict[str, Any]]:
    """Per turn bucket (see :func:`turn_bucket`): requests, TTFT and E2E p50/p90,
    mean prompt, and the prefix hit rates side by side (server: Σ cached / Σ server
    prompt over rows reporting cached_tokens; ideal: Σ ideal / Σ prompt; LRU with
    an estimate). Population: ok, measured rows. Hit rates by
    :func:`metrics.hit_rate` (NaN, never 0, when unknown)."""
    groups = turn_bucket(m.column(df, "request_index"))
    labels = {int(k): _bucket_label(int(k)) for k in np.unique(groups)}
    return _rows(df, groups, labels, lru)


def by_depth(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> list[dict[str, Any]]:
    """The same figures per subagent depth (0 = root sessions, 1 = their
    subagents, …). Population: ok, measured rows."""
    groups = np.nan_to_num(m.column(df, "agent_depth"), nan=0.0).astype(np.int64)
    labels = {int(k): str(int(k)) for k in np.unique(groups)}
    return _rows(df, groups, labels, lru)
