"""Trace statistics and the ideal prefix-cache hit of every request.

Ideal hit of a request: the longest leading run of its blocks already seen earlier in
its namespace, in tokens, capped at its input length. The namespace is the session tree
for ``hash_id_scope: "local"`` and the whole trace for ``"global"``; "earlier" follows
the trace's own order (``Session.ordered_requests``), so the figure is a property of
the trace, not of one run's timing.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from traces.model import Request, Session, Trace

RequestKey = tuple[str, int]  # (session_id, request_index)


def _runs(ids: npt.NDArray[np.int64]) -> tuple[list[int], list[int]]:
    """Runs of consecutive ids: (starts, lengths). Traces number blocks in order, so
    a request of thousands of blocks is usually a handful of runs."""
    prev, nxt = ids[:-1], ids[1:]
    with np.errstate(over="ignore"):  # b > a rules out a wrapped difference of 1
        consecutive = (nxt > prev) & (nxt - prev == 1)
    breaks = np.flatnonzero(~consecutive) + 1
    bounds = np.concatenate(([0], breaks, [ids.size]))
    return ids[bounds[:-1]].tolist(), np.diff(bounds).tolist()


def _leading_seen_blocks(
    ids: list[npt.NDArray[np.int64]],
) -> npt.NDArray[np.int64]:
    """For requests in order, how many leading blocks each had seen before it.

    The seen ids are kept as sorted disjoint intervals [lo, hi), so the cost is per
    run of consecutive ids, not per block: a 350M-block corpus takes seconds.
    """
    out = np.zeros(len(ids), dtype=np.int64)
    lo_list: list[int] = []  # interval starts, sorted
    hi_list: list[int] = []  # matching ends (exclusive)
    for r, arr in enumerate(ids):
        if arr.size == 0:
            continue
        starts, lengths = _runs(arr)
        hit = 0
        for a, n in zip(starts, lengths, strict=True):
            k = bisect.bisect_right(lo_list, a) - 1
            covered = min(n, hi_list[k] - a) if k >= 0 and hi_list[k] > a else 0
            hit += covered
            if covered < n:
                break
        out[r] = hit
        for a, n in zip(starts, lengths, strict=True):
            _add_interval(lo_list, hi_list, a, a + n)
    return out


def _add_interval(lo_list: list[int], hi_list: list[int], lo: int, hi: int) -> None:
    """Insert [lo, hi) into sorted disjoint intervals, merging overlaps/neighbours."""
    i = bisect.bisect_left(hi_list, lo)  # first interval ending at or after lo
    j = bisect.bisect_right(lo_list, hi)  # past the last starting at or before hi
    if i < j:
        lo = min(lo, lo_list[i])
        hi = max(hi, hi_list[j - 1])
    lo_list[i:j] = [lo]
    hi_list[i:j] = [hi]


def _namespaces(trace: Trace) -> Iterable[list[tuple[Session, int, Request]]]:
    global_ns: list[tuple[Session, int, Request]] = []
    for root in trace.sessions:
        ordered = list(root.ordered_requests())
        if root.hash_id_scope == "global":
            global_ns.extend(ordered)
        else:
            yield ordered
    if global_ns:
        yield global_ns


def ideal_cached_tokens(trace: Trace) -> dict[RequestKey, int]:
    """Ideal (infinite prefix cache) hit in tokens of every request of ``trace``."""
    out: dict[RequestKey, int] = {}
    for ns in _namespaces(trace):
        blocks = _leading_seen_blocks([r.hash_ids for _, _, r in ns])
        for (s, i, r), b in zip(ns, blocks.tolist(), strict=True):
            out[(s.session_id, i)] = min(b * s.block_size, r.input_tokens)
    return out


def ideal_hit_totals(
    trace: Trace, hits: dict[RequestKey, int] | None = None
) -> tuple[int, int]:
    """(Σ ideal hit tokens, Σ input tokens) over all requests (``hits``: the result
    of :func:`ideal_cached_tokens` when the caller already has it)."""
    if hits is None:
        hits = ideal_cached_tokens(trace)
    total_in = sum(r.input_tokens for _, _, r in _all_requests(trace))
    return sum(hits.values()), total_in


def _all_requests(trace: Trace) -> Iterable[tuple[Session, int, Request]]:
    for root in trace.sessions:
        yield from root.ordered_requests()


# numpy's name for the interpolation every percentile of the project uses.
PERCENTILE_METHOD: Final = "linear"


def percentiles(values: npt.ArrayLike, qs: Sequence[float]) -> list[float]:
    """Percentiles ``qs`` (each in [0, 100]) of ``values``: numpy's linear
    interpolation, NaNs dropped, NaN for no data. The project's one percentile
    definition (analysis and the engine's summary line use it too)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return [float("nan")] * len(qs)
    return [float(x) for x in np.percentile(arr, list(qs), method=PERCENTILE_METHOD)]


def _summary(values: npt.NDArray[Any]) -> dict[str, float]:
    if values.size == 0:
        nan = float("nan")
        return {"mean": nan, "p50": nan, "p90": nan, "p99": nan, "max": nan}
    p50, p90, p99 = percentiles(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceStats:
    """Summary statistics of a trace (all requests, subagents included)."""

    sessions: int  # root sessions (session trees)
    requests: int
    sessions_with_subagents: int
    subagent_sessions: int
    input_tokens: dict[str, float]
    output_tokens: dict[str, float]
    requests_per_session: dict[str, float]  # per tree, subagents included
    think_time_s: dict[str, float]  # gaps before each request after the first
    total_input_tokens: int
    total_output_tokens: int
    ideal_cache_hit_rate: float
    block_sizes: list[int]
    hash_id_scopes: list[str]
    source_format: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; the keys are the `trace stats --json` contract."""
        return {
            "sessions": self.sessions,
            "requests": self.requests,
            "sessions_with_subagents": self.sessions_with_subagents,
            "subagent_sessions": self.subagent_sessions,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "requests_per_session": self.requests_per_session,
            "think_time_s": self.think_time_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "ideal_cache_hit_rate": self.ideal_cache_hit_rate,
            "block_sizes": self.block_sizes,
            "hash_id_scopes": self.hash_id_scopes,
            "source_format": self.source_format,
        }


def trace_stats(trace: Trace) -> TraceStats:
    """Compute :class:`TraceStats` for ``trace``."""
    reqs = [r for _, _, r in _all_requests(trace)]
    ins = np.fromiter((r.input_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    outs = np.fromiter((r.output_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    thinks = np.array(
        [r.think_time_s for s, _ in trace.all_sessions() for r in s.requests[1:]],
        dtype=np.float64,
    )
    per_tree = np.array([s.request_count() for s in trace.sessions], dtype=np.int64)
    hits, total_in = ideal_hit_totals(trace)
    sessions = list(trace.all_sessions())
    return TraceStats(
        sessions=len(trace.sessions),
        requests=len(reqs),
        sessions_with_subagents=sum(1 for s in trace.sessions if s.subagents),
        subagent_sessions=sum(1 for _, depth in sessions if depth > 0),
        input_tokens=_summary(ins),
        output_tokens=_summary(outs),
        requests_per_session=_summary(per_tree),
        think_time_s=_summary(thinks),
        total_input_tokens=int(ins.sum()),
        total_output_tokens=int(outs.sum()),
        ideal_cache_hit_rate=hits / total_in if total_in else float("nan"),
        block_sizes=sorted({s.block_size for s, _ in sessions}),
        hash_id_scopes=sorted({s.hash_id_scope for s, _ in sessions}),
        source_format=trace.source_format,
    )
