"""KV-cache truth side by side: server-reported, Prometheus, ideal and LRU hits per run,
session tree and request, and which misses explain slow TTFT. Pure (the trace comes in
as an argument). See docs/metrics.md#kv-cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis.metrics import (
    NAN,
    FloatArray,
    column,
    hit_rate,
    kept_column,
    measured_ok,
    percentile,
    plain_column,
    server_prompt,
)
from analysis.results import CacheMisses
from traces.cache import CacheRequest, lru_hits
from traces.model import HashIds, Trace

REQUEST_COLUMNS = (
    "session_id",
    "root_session_id",
    "request_index",
    "start_ns",
    "ttft_ms",
    "prompt_tokens",
    "server_prompt_tokens",
    "cached_tokens",
    "ideal_cached_tokens",
    "lru_cached_tokens",
    "missed_tokens",
)


def trace_blocks(trace: Trace) -> dict[tuple[str, int], tuple[str, HashIds]]:
    """(session_id, request_index) → (cache namespace, hash ids) for every request.

    The namespace is the root session for ``hash_id_scope: "local"`` and one shared
    namespace for ``"global"`` (``Session.hash_namespace``, as the replayer uses).
    """
    out: dict[tuple[str, int], tuple[str, HashIds]] = {}
    for root in trace.sessions:
        ns = root.hash_namespace()
        for session, index, request in root.ordered_requests():
            out[(session.session_id, index)] = (ns, request.hash_ids)
    return out


def lru_cached_tokens(
    df: pd.DataFrame,
    trace: Trace,
    *,
    block_size: int,
    capacity_tokens: int,
    host_capacity_tokens: int | None = None,
) -> npt.NDArray[np.float64]:
    """LRU-estimated hit tokens per row (NaN for rows not simulated).

    Formula: ``traces.cache.lru_hits`` over the rows in the run's actual start order
    (start_ns, ties by row order), each row's trace hash ids with ``block_size``
    tokens per block (the run's ``block_tokens``, else the trace's block size) and
    its prompt_tokens sent. Population: rows that were sent (start_ns not null), any
    status and warm-up included, since they all filled the server's cache; rows the
    trace does not know are skipped.
    """
    blocks = trace_blocks(trace)
    start = column(df, "start_ns")
    order = np.argsort(start, kind="stable")
    order = order[~np.isnan(start[order])]
    sids = df["session_id"].astype("object").to_numpy()
    idx = column(df, "request_index")
    prompt = column(df, "prompt_tokens")
    known: list[int] = []

    def requests() -> Iterator[CacheRequest]:
        for row in order.tolist():
            hit = blocks.get((sids[row], int(idx[row])))
            if hit is not None:
                known.append(row)
                yield hit[0], hit[1], int(prompt[row])

    hits = lru_hits(
        requests(),
        block_size=block_size,
        capacity_tokens=capacity_tokens,
        host_capacity_tokens=host_capacity_tokens,
    )
    out = np.full(len(df), NAN)
    out[np.asarray(known, dtype=np.int64)] = hits
    return out


def request_cache(
    df: pd.DataFrame,
    lru: npt.NDArray[np.float64] | None = None,
    *,
    reporting_only: bool = False,
    columns: Sequence[str] = REQUEST_COLUMNS,
) -> pd.DataFrame:
    """Per request: cached (server), ideal and LRU hit tokens, and the miss.

    ``missed_tokens`` = ideal_cached_tokens - cached_tokens, null where the server
    did not report cached_tokens. Population: ok, measured rows (only those that
    report cached_tokens with ``reporting_only``). ``columns``: a subset of
    :data:`REQUEST_COLUMNS` to build.
    """
    keep = measured_ok(df)
    cached = plain_column(df, "cached_tokens") if reporting_only else None
    if reporting_only and (cached is None or cached.dtype.kind == "f"):
        keep &= ~np.isnan(column(df, "cached_tokens"))  # (integers: no NaN)

    def kept(name: str, scale: float = 1.0) -> FloatArray:
        return kept_column(df, name, keep, scale)

    build: dict[str, Callable[[], Any]] = {
        # Categoricals stay categoricals: no per-row Python strings.
        "session_id": lambda: df["session_id"][keep].reset_index(drop=True),
        "root_session_id": lambda: df["root_session_id"][keep].reset_index(drop=True),
        "request_index": lambda: kept("request_index"),
        "start_ns": lambda: kept("start_ns"),
        "ttft_ms": lambda: kept("ttft_ns", 1e6),
        "prompt_tokens": lambda: kept("prompt_tokens"),
        "server_prompt_tokens": lambda: server_prompt(df, keep),
        "cached_tokens": lambda: kept("cached_tokens"),
        "ideal_cached_tokens": lambda: kept("ideal_cached_tokens"),
        "lru_cached_tokens": lambda: (
            lru[keep] if lru is not None else np.full(int(keep.sum()), NAN)
        ),
        "missed_tokens": lambda: _less(
            kept("ideal_cached_tokens"), kept("cached_tokens")
        ),
    }
    # copy=False keeps one block per column instead of copying into one 2-D block.
    return pd.DataFrame({c: build[c]() for c in columns}, copy=False)


def _less(a: FloatArray, b: FloatArray) -> FloatArray:
    """``a - b``, into ``a`` (the caller's): one array fewer held."""
    a -= b
    return a


def tree_cache(requests: pd.DataFrame) -> pd.DataFrame:
    """Hit rates per session tree from :func:`request_cache` rows.

    ``server`` = Σ cached / Σ server prompt over rows reporting cached_tokens (NaN if
    none); ``ideal`` = Σ ideal / Σ prompt_tokens; ``lru`` = Σ LRU hits / Σ
    prompt_tokens over simulated rows (each by ``metrics.hit_rate``, as the run's
    figures). Population: the tree's ok, measured rows.
    """
    out = []
    for root, g in requests.groupby("root_session_id", sort=True, observed=True):
        out.append(
            {
                "root_session_id": root,
                "requests": len(g),
                "server": hit_rate(g["cached_tokens"], g["server_prompt_tokens"]),
                "ideal": hit_rate(g["ideal_cached_tokens"], g["prompt_tokens"]),
                "lru": hit_rate(g["lru_cached_tokens"], g["prompt_tokens"]),
            }
        )
    cols = ["root_session_id", "requests", "server", "ideal", "lru"]
    return pd.DataFrame(out, columns=cols)


def miss_impact(requests: pd.DataFrame, *, tolerance_tokens: int) -> CacheMisses:
    """Which requests missed what the trace allowed, and how much P90 TTFT they explain.

    A miss: missed_tokens > ``tolerance_tokens`` (one server block: servers cache
    whole blocks of their own size, so a shortfall up to one is rounding).
    Population: rows of :func:`request_cache` that report cached_tokens (when none
    does, ``requests_reporting`` is 0, the counts None and the figures NaN).
    ``missed_tokens``: the tokens missed by the rows with a miss; ``ttft_p90_ms``:
    P90 TTFT of all of them; ``ttft_p90_ms_full_hit``/``_with_miss``: of the rows
    without/with a miss; ``slow_with_miss_fraction``: of rows with TTFT at or above
    the P90, the share with a miss.
    """
    reporting = requests["cached_tokens"].notna()
    rep = requests if reporting.all() else requests[reporting]  # no copy of them all
    if rep.empty:
        return CacheMisses(
            tolerance_tokens=tolerance_tokens,
            requests_reporting=0,
            requests_with_miss=None,
            missed_tokens=None,
            ttft_p90_ms=NAN,
            ttft_p90_ms_full_hit=NAN,
            ttft_p90_ms_with_miss=NAN,
            slow_with_miss_fraction=NAN,
        )
    missed = rep["missed_tokens"].clip(lower=0)
    miss = (missed > tolerance_tokens).to_numpy()
    ttft = rep["ttft_ms"].to_numpy()
    p90 = percentile(ttft, 90)
    slow = ttft >= p90
    return CacheMisses(
        tolerance_tokens=tolerance_tokens,
        requests_reporting=len(rep),
        requests_with_miss=int(miss.sum()),
        missed_tokens=float(missed[miss].sum()),
        ttft_p90_ms=p90,
        ttft_p90_ms_full_hit=percentile(ttft[~miss], 90),
        ttft_p90_ms_with_miss=percentile(ttft[miss], 90),
        slow_with_miss_fraction=float(miss[slow].mean()) if slow.any() else NAN,
    )
