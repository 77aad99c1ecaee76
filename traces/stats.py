"""Trace statistics, the ideal prefix-cache hit of every request, and the steady-state
window's statistics. See docs/traces.md#inspecting-a-trace."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from traces.model import HashIds, Session, Trace
from traces.quantile import linear_percentiles
from traces.table import (
    FloatArray,
    IntArray,
    RequestTable,
    Rows,
    part_column,
    session_rows,
)

RequestKey = tuple[str, int]  # (session_id, request_index)
_Range = tuple[Session, int, int]  # requests [start, stop) of one session


def _ordered_ranges(session: Session) -> Iterator[_Range]:
    """``Session.ordered_requests`` as contiguous index ranges of each session."""
    by_anchor: dict[int, list[Session]] = {}
    for sub in session.subagents:
        by_anchor.setdefault(sub.anchor_index, []).append(sub.session)
    for sub_session in by_anchor.get(-1, ()):
        yield from _ordered_ranges(sub_session)
    n = len(session.requests)
    start = 0
    for anchor in sorted(a for a in by_anchor if 0 <= a < n):
        yield session, start, anchor + 1
        start = anchor + 1
        for sub_session in by_anchor[anchor]:
            yield from _ordered_ranges(sub_session)
    if start < n:
        yield session, start, n


def _namespaces(trace: Trace) -> Iterable[list[_Range]]:
    """Each cache namespace's requests in the trace's order; the namespace is the
    model's (``Session.hash_namespace``, as the replayer and analysis use)."""
    by_namespace: dict[str, list[_Range]] = {}
    for root in trace.sessions:
        by_namespace.setdefault(root.hash_namespace(), []).extend(_ordered_ranges(root))
    return by_namespace.values()


def _runs(blocks: HashIds) -> tuple[list[int], list[int]]:
    """Maximal runs of consecutive ids in ``blocks``: (positions, first ids). Traces
    number blocks in order, so a buffer of millions of blocks is a few thousand runs."""
    if blocks.size == 0:
        return [], []
    prev, nxt = blocks[:-1], blocks[1:]
    with np.errstate(over="ignore"):  # b > a rules out a wrapped difference of 1
        consecutive = (nxt > prev) & (nxt - prev == 1)
    pos = np.concatenate(([0], np.flatnonzero(~consecutive) + 1))
    return pos.tolist(), blocks[pos].tolist()


class _SeenBlocks:
    """Block ids seen so far in one namespace, as sorted disjoint intervals [lo, hi),
    plus how much of each prompt chain has been seen (a chain is identified by the
    address of its first block: requests that start there share their leading blocks),
    so a request costs its new blocks only."""

    def __init__(self, runs: dict[int, tuple[list[int], list[int]]]) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.chain_seen: dict[int, int] = {}
        self.runs = runs  # of each block buffer (by id), shared by the namespaces

    def hits(self, table: RequestTable, start: int, stop: int) -> list[int]:
        """Leading seen blocks of rows [start, stop) of ``table``, in order; then
        their blocks count as seen."""
        blocks = table.blocks
        key = id(blocks)
        if key not in self.runs:
            self.runs[key] = _runs(blocks)
        run_pos, run_val = self.runs[key]
        n_runs, size = len(run_pos), blocks.size
        base = int(blocks.__array_interface__["data"][0])
        lo_list, hi_list, chain_seen = self.lo, self.hi, self.chain_seen
        out: list[int] = []
        offs = table.ids_offset[start:stop].tolist()
        lens = table.n_blocks[start:stop].tolist()
        for off, n in zip(offs, lens, strict=True):
            chain = base + 8 * off
            hit = chain_seen.get(chain, 0)
            if n <= hit:
                out.append(n)
                continue
            p, end = off + hit, off + n
            k = bisect.bisect_right(run_pos, p) - 1
            checking = True
            while p < end:
                q = min(run_pos[k + 1] if k + 1 < n_runs else size, end)
                v = run_val[k] + (p - run_pos[k])
                m = q - p
                if checking:
                    j = bisect.bisect_right(lo_list, v) - 1
                    covered = hi_list[j] - v if j >= 0 and hi_list[j] > v else 0
                    if covered >= m:  # seen already: nothing to add
                        hit += m
                        p, k = q, k + 1
                        continue
                    hit += covered
                    checking = False  # prefix caching cannot use a block after a miss
                _add_interval(lo_list, hi_list, v, v + m)
                p, k = q, k + 1
            chain_seen[chain] = n
            out.append(hit)
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


def _rows_by_session(trace: Trace) -> dict[int, Rows]:
    sessions = [s for s, _ in trace.all_sessions()]
    return {id(s): r for s, r in zip(sessions, session_rows(sessions), strict=True)}


def ideal_hit_tokens(
    trace: Trace, rows: Mapping[int, Rows] | None = None
) -> list[tuple[Session, IntArray]]:
    """Ideal (infinite prefix cache) hit in tokens of every request of ``trace``, as
    one array per session (index = request index), sessions in ``all_sessions``
    order. ``rows``: each session's rows by ``id(session)``, when the caller has
    them.

    Ideal hit of a request: the longest leading run of its blocks already seen earlier
    in its namespace, in tokens, capped at its input length. The namespace is the
    session tree for ``hash_id_scope: "local"`` and the whole trace for ``"global"``;
    "earlier" follows the trace's own order (``Session.ordered_requests``), so the
    figure is a property of the trace, not of one run's timing. Both work on the request
    columns (``traces.table``), so the ideal-hit pass costs the blocks a trace stores
    (each prompt chain once), not the sum of its prompt lengths.
    """
    if rows is None:
        rows = _rows_by_session(trace)
    out = {
        key: np.zeros(stop - start, dtype=np.int64)
        for key, (_, start, stop) in rows.items()
    }
    runs: dict[int, tuple[list[int], list[int]]] = {}
    for ns in _namespaces(trace):
        seen = _SeenBlocks(runs)
        for session, a, b in ns:
            table, first, _ = rows[id(session)]
            hit = seen.hits(table, first + a, first + b)
            blocks = np.asarray(hit, dtype=np.int64)
            ins = table.input_tokens[first + a : first + b]
            out[id(session)][a:b] = np.minimum(blocks * session.block_size, ins)
    return [(s, out[id(s)]) for s, _ in trace.all_sessions()]


def ideal_cached_tokens(trace: Trace) -> dict[RequestKey, int]:
    """Ideal (infinite prefix cache) hit in tokens of every request of ``trace``."""
    out: dict[RequestKey, int] = {}
    for session, hits in ideal_hit_tokens(trace):
        sid = session.session_id
        out.update(((sid, i), h) for i, h in enumerate(hits.tolist()))
    return out


def ideal_hit_totals(
    trace: Trace, hits: dict[RequestKey, int] | None = None
) -> tuple[int, int]:
    """(Σ ideal hit tokens, Σ input tokens) over all requests (``hits``: the result
    of :func:`ideal_cached_tokens` when the caller already has it)."""
    rows = _rows_by_session(trace)
    total_in = sum(int(t.input_tokens[a:b].sum()) for t, a, b in rows.values())
    if hits is not None:
        return sum(hits.values()), total_in
    total_hit = sum(int(h.sum()) for _, h in ideal_hit_tokens(trace, rows))
    return total_hit, total_in


# numpy's name for the interpolation every percentile of the project uses.
PERCENTILE_METHOD: Final = "linear"


def percentiles(
    values: npt.ArrayLike, qs: Sequence[float], *, scratch: bool = False
) -> list[float]:
    """Percentiles ``qs`` (each in [0, 100]) of ``values``: numpy's linear
    interpolation, NaNs dropped, NaN for no data. The project's one percentile
    definition (analysis and the engine's summary line use it too). ``scratch``:
    ``values`` is the caller's to spend (reordered in place, no copy taken)."""
    arr = np.asarray(values, dtype=np.float64)
    nan = np.isnan(arr)
    own = scratch
    if nan.any():  # a copy of our own, which numpy may reorder in place
        arr = arr[~nan]
        own = True
    if arr.size == 0:
        return [float("nan")] * len(qs)
    fast = linear_percentiles(arr, qs)  # the same floats, without a partition
    if fast is not None:
        return fast
    found = np.percentile(arr, list(qs), method=PERCENTILE_METHOD, overwrite_input=own)
    return [float(x) for x in found]


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
    # The gaps whose parts the trace knows (imported agent logs; traces.model.Request)
    # and their parts: tool time, the rest (non-tool), and the rest's human and other
    # parts; the share of their time spent in tools. None: no gap's parts known.
    gaps_with_parts: int
    tool_wait_s: dict[str, float] | None
    non_tool_wait_s: dict[str, float] | None
    human_wait_s: dict[str, float] | None
    other_wait_s: dict[str, float] | None
    tool_time_share: float | None
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
            "gaps_with_parts": self.gaps_with_parts,
            "tool_wait_s": self.tool_wait_s,
            "non_tool_wait_s": self.non_tool_wait_s,
            "human_wait_s": self.human_wait_s,
            "other_wait_s": self.other_wait_s,
            "tool_time_share": self.tool_time_share,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "ideal_cache_hit_rate": self.ideal_cache_hit_rate,
            "block_sizes": self.block_sizes,
            "hash_id_scopes": self.hash_id_scopes,
            "source_format": self.source_format,
        }


def _part_column(name: str, spans: Sequence[tuple[Rows, int, int]]) -> FloatArray:
    """One think-gap part over ``spans`` (NaN where not known)."""
    parts = [part_column(t, name, s0 + a, s0 + b) for (t, s0, _), a, b in spans]
    return np.concatenate(parts) if parts else np.zeros(0)


def trace_stats(trace: Trace) -> TraceStats:
    """Compute :class:`TraceStats` for ``trace``."""
    sessions = list(trace.all_sessions())
    rows = _rows_by_session(trace)
    ordered = [
        (rows[id(s)], a, b)
        for root in trace.sessions
        for s, a, b in _ordered_ranges(root)
    ]

    def column(name: str, spans: Sequence[tuple[Rows, int, int]]) -> npt.NDArray[Any]:
        parts = [getattr(t, name)[s0 + a : s0 + b] for (t, s0, _), a, b in spans]
        return np.concatenate(parts) if parts else np.zeros(0)

    ins = column("input_tokens", ordered).astype(np.int64)
    outs = column("output_tokens", ordered).astype(np.int64)
    after_first = [
        (rows[id(s)], 1, len(s.requests)) for s, _ in sessions if len(s.requests) > 1
    ]
    thinks = column("think_time_s", after_first).astype(np.float64)
    tool, human = (
        _part_column(name, after_first) for name in ("tool_wait_s", "human_wait_s")
    )
    known = ~(np.isnan(tool) & np.isnan(human))
    tool_k = np.nan_to_num(tool[known])
    non_tool = np.maximum(thinks[known] - tool_k, 0.0)
    human_k = np.nan_to_num(human[known])
    gap_total = float(thinks[known].sum())

    def part(values: npt.NDArray[Any]) -> dict[str, float] | None:
        return _summary(values) if known.any() else None

    per_tree = np.array([s.request_count() for s in trace.sessions], dtype=np.int64)
    total_hit = sum(int(h.sum()) for _, h in ideal_hit_tokens(trace, rows))
    total_in = int(ins.sum())
    return TraceStats(
        sessions=len(trace.sessions),
        requests=int(ins.size),
        sessions_with_subagents=sum(1 for s in trace.sessions if s.subagents),
        subagent_sessions=sum(1 for _, depth in sessions if depth > 0),
        input_tokens=_summary(ins),
        output_tokens=_summary(outs),
        requests_per_session=_summary(per_tree),
        think_time_s=_summary(thinks),
        gaps_with_parts=int(known.sum()),
        tool_wait_s=part(tool_k),
        non_tool_wait_s=part(non_tool),
        human_wait_s=part(human_k),
        other_wait_s=part(np.maximum(non_tool - human_k, 0.0)),
        tool_time_share=float(tool_k.sum()) / gap_total if gap_total else None,
        total_input_tokens=total_in,
        total_output_tokens=int(outs.sum()),
        ideal_cache_hit_rate=total_hit / total_in if total_in else float("nan"),
        block_sizes=sorted({s.block_size for s, _ in sessions}),
        hash_id_scopes=sorted({s.hash_id_scope for s, _ in sessions}),
        source_format=trace.source_format,
    )


_MIN_STEADY_ROWS = 20


class SteadySpan(NamedTuple):
    """A run's steady span (ns, run-relative) and the bins its load was read in."""

    start: int  # window start (= run_start when no ramp-up was found)
    end: int  # window end (= run_end when no drain tail was found)
    run_start: int  # first request sent
    run_end: int  # last request ended
    bins: int  # 0: too few requests, the whole span kept


def steady_span(start_ns: npt.ArrayLike, end_ns: npt.ArrayLike) -> SteadySpan | None:
    """The steady-state span of requests sent at ``start_ns`` and ended at
    ``end_ns`` (run-relative; rows with either missing are ignored; None: none left).

    The span from the first send to the last end is cut into bins (5 per 10
    requests, between 50 and 500, a multiple of 5), and the load is the number of
    requests in flight at each bin's middle: it climbs while lanes fill (or while a
    queue builds) and falls while the run drains. The head and the tail cut are
    chosen together (:func:`mser_cuts`): MSER-5 over every (head, tail) pair that
    cuts at most half the bins, then each cut moved out to where the load first
    (last) reaches the steady level's band. One minimum over all pairs, no
    alternation: two one-sided cuts made in turn settled, on the README's Weka
    run, on the whole drain kept and 18 s of steady load dropped. Completions per
    bin, the other obvious signal, were tried and left out: being a count of
    random events, their noise drew MSER to spurious late cuts.
    Fewer than 20 requests: the whole span, ``bins`` 0.
    """
    s = np.asarray(start_ns, dtype=np.float64)
    e = np.asarray(end_ns, dtype=np.float64)
    keep = ~(np.isnan(s) | np.isnan(e))
    if not keep.all():  # else no copies of millions of rows
        s, e = s[keep], e[keep]
    del keep
    if s.size == 0:
        return None
    lo, hi = int(s.min()), int(e.max())
    if s.size < _MIN_STEADY_ROWS or hi <= lo:
        return SteadySpan(start=lo, end=max(lo, hi), run_start=lo, run_end=hi, bins=0)
    nb = min(500, max(50, s.size // 10 * 5)) // 5 * 5
    edges = np.linspace(lo, hi, nb + 1)
    # Sent minus ended before each bin's middle: cumulative counts over bins that
    # end at the middles (uniform bins: histograms in O(n), no sort).
    w = (hi - lo) / nb
    span = (lo - w / 2, hi - w / 2)
    inflight = (
        np.cumsum(np.histogram(s, bins=nb, range=span)[0])
        - np.cumsum(np.histogram(e, bins=nb, range=span)[0])
    ).astype(np.float64)
    head, tail = mser_cuts(inflight)
    return SteadySpan(
        start=int(edges[head]),
        end=int(edges[nb - tail]),
        run_start=lo,
        run_end=hi,
        bins=nb,
    )


def mser_cuts(y: npt.NDArray[np.float64], batch: int = 5) -> tuple[int, int]:
    """(head, tail): how many leading and trailing points of ``y`` to cut, jointly.

    ``y`` (a multiple of ``batch`` points long) is cut into means of ``batch``
    points Z_1..Z_k. For every head d and tail t with d + t ≤ k/2
    (MSER's customary bound, over both ends: more than half the run cut is not a
    transient but the run),

        MSER(d, t) = Σ_{d<j≤k-t} (Z_j - mean(Z_{d+1..k-t}))² / (k - d - t)²

    and the pair with the least statistic wins; among pairs within round-off of
    it, the one cutting least, then the one with the shorter head. Then each cut
    shrinks to the band step below. Fewer than two batches: nothing is cut.
    """
    k = y.size // batch
    if k < 2:
        return 0, 0
    z = y[: k * batch].reshape(k, batch).mean(axis=1)
    c1 = np.r_[0.0, np.cumsum(z)]
    c2 = np.r_[0.0, np.cumsum(z * z)]
    d, t = np.meshgrid(np.arange(k // 2 + 1), np.arange(k // 2 + 1), indexing="ij")
    ok = d + t <= k // 2
    d, t = d[ok], t[ok]
    hi = k - t
    m = hi - d
    s1 = c1[hi] - c1[d]
    sse = np.maximum(c2[hi] - c2[d] - s1 * s1 / m, 0.0)
    mser = sse / (m * m)
    # Round-off in the prefix sums makes equal MSERs (a flat series) differ in the
    # last bits: values within 1e-10 of the series' own scale tie.
    tol = 1e-10 * float(c2[-1]) / (k * k)
    tied = np.flatnonzero(mser <= float(mser.min()) + tol)
    best = tied[np.lexsort((d[tied], (d + t)[tied]))[0]]
    head, tail = int(d[best]), int(t[best])
    # MSER over-cuts a noisy plateau (dropping a stretch of it lowers the squared
    # deviations more than it costs in points), so its window only measures the
    # steady level: the ramp ends where the load first reaches that level's band
    # (mean - 2 standard deviations of the window's batches), the drain starts
    # after it last leaves it. Dips inside the run are load, not transients, and
    # so is load above the band (subagent bursts early in sessions): a ramp and a
    # drain lie below the steady level, and the MSER cut alone dropped such
    # bursts as a transient.
    kept = z[head : k - tail]
    inside = np.flatnonzero(z >= kept.mean() - 2 * kept.std())
    head = min(head, int(inside[0]))
    tail = min(tail, k - 1 - int(inside[-1]))
    return head * batch, tail * batch
