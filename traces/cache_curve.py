"""Prefix-cache hit rate against KV budget: LRU, Belady and the infinite ceiling, for
requests in one order (a replay's send order: ``traces.sendorder``).
See docs/capacity.md#the-knee-from-the-trace."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from traces.cache import CacheRequest
from traces.errors import TraceError
from traces.gaps import GapRule
from traces.model import Trace
from traces.sendorder import SentRequest, send_order
from traces.stats import _rows_by_session, _runs, ideal_hit_tokens
from traces.table import IntArray, request_column

KNEE_POINTS = 0.05  # the knee: where the LRU hit falls this far below the ceiling
DEFAULT_BUDGETS = 20

Run = tuple[int, int]  # (first hash id, blocks) of consecutive ids


@dataclass(frozen=True, slots=True)
class _Req:
    namespace: Hashable
    runs: list[Run]  # the request's blocks, in order, as runs of consecutive ids
    useful_blocks: int  # leading blocks inside the input length
    last_tokens: int  # tokens of the last useful block (<= block size)
    input_tokens: int


class _Fenwick:
    """Prefix sums over a fixed number of slots."""

    __slots__ = ("_n", "_tree")

    def __init__(self, n: int) -> None:
        self._n = n
        self._tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        tree, n = self._tree, self._n
        i += 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of slots 0..i."""
        tree = self._tree
        i += 1
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


class _IdMap:
    """Disjoint sorted id intervals [lo, hi) of one namespace, each with its segment."""

    __slots__ = ("hi", "lo", "seg")

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.seg: list[int] = []

    def assign(self, a: int, b: int, seg: int) -> list[tuple[int, int, int]]:
        """Give [a, b) to ``seg``; return the (lo, hi, segment) parts taken over."""
        lo, hi, sg = self.lo, self.hi, self.seg
        i = bisect.bisect_right(hi, a)
        j = bisect.bisect_left(lo, b, i)
        taken = [(max(lo[k], a), min(hi[k], b), sg[k]) for k in range(i, j)]
        new_lo, new_hi, new_sg = [a], [b], [seg]
        if i < j and lo[i] < a:
            new_lo.insert(0, lo[i])
            new_hi.insert(0, a)
            new_sg.insert(0, sg[i])
        if i < j and hi[j - 1] > b:
            new_lo.append(b)
            new_hi.append(hi[j - 1])
            new_sg.append(sg[j - 1])
        lo[i:j] = new_lo
        hi[i:j] = new_hi
        sg[i:j] = new_sg
        return taken


class _Looked:
    """The ids one request has looked up, as disjoint sorted intervals [lo, hi)."""

    __slots__ = ("hi", "lo")

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """Add [a, b); return it cut into (lo, hi, seen before) parts, in order."""
        lo, hi = self.lo, self.hi
        i = bisect.bisect_right(hi, a)
        j = bisect.bisect_left(lo, b, i)
        if i == j:  # the usual case: ids not looked up before
            lo.insert(i, a)
            hi.insert(i, b)
            return [(a, b, False)]
        parts: list[tuple[int, int, bool]] = []
        x = a
        for k in range(i, j):
            if lo[k] > x:
                parts.append((x, lo[k], False))
            y = min(hi[k], b)
            if y > max(x, lo[k]):
                parts.append((max(x, lo[k]), y, True))
            x = max(x, y)
        if x < b:
            parts.append((x, b, False))
        lo[i:j] = [min(lo[i], a)]
        hi[i:j] = [max(hi[j - 1], b)]
        return parts


@dataclass(frozen=True, slots=True, eq=False)
class CacheModel:
    """The sweep's result for one request order: LRU hits at any budget and Belady
    at the budgets asked, in trace tokens, over ``input_tokens``."""

    block_size: int  # trace tokens per block
    requests: int
    input_tokens: int
    # LRU: the block at each prefix-max value v hits at budgets >= v blocks. Ranges
    # of values [lo, hi] weigh block_size tokens per value; points weigh their own.
    range_lo: IntArray
    range_hi: IntArray
    point_v: IntArray
    point_tokens: IntArray
    # Belady's reuse groups: ``count`` blocks touched by request ``prev`` and next
    # looked up by request ``next`` at block ``pos``.
    group_prev: IntArray
    group_next: IntArray
    group_pos: IntArray
    group_count: IntArray
    # An echo group repeats ids its request looked up earlier (at a smaller pos): the
    # same blocks, so it holds nothing and hits whenever the leading run reaches it.
    group_echo: npt.NDArray[np.bool_]
    request_input: IntArray  # per request, in order

    def lru_hit_tokens(self, budget_blocks: int) -> int:
        """Σ LRU hit tokens with a cache of ``budget_blocks`` blocks."""
        c = budget_blocks
        pts = int(self.point_tokens[self.point_v <= c].sum())
        span = np.minimum(self.range_hi, c) - self.range_lo + 1
        return pts + self.block_size * int(np.clip(span, 0, None).sum())

    def lru_unbounded_tokens(self) -> int:
        """Σ LRU hit tokens with no limit (every seen block cached)."""
        return self.lru_hit_tokens(self.max_rank())

    def max_rank(self) -> int:
        """The budget (blocks) from which LRU hits everything it ever will."""
        top = [int(a.max()) for a in (self.range_hi, self.point_v) if a.size]
        return max(top, default=0)

    def belady_hit_tokens(self, budget_blocks: int) -> int:
        """Σ hit tokens of Belady's MIN with a cache of ``budget_blocks`` blocks."""
        kept = _belady_kept(self, budget_blocks)
        hits = np.minimum(kept * self.block_size, self.request_input)
        return int(hits.sum())

    def smallest_budget(self, hit_tokens: float) -> int | None:
        """Smallest budget (blocks) where LRU hits at least ``hit_tokens``; None if
        no budget does."""
        lo, hi = 0, self.max_rank()
        if self.lru_hit_tokens(hi) < hit_tokens:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.lru_hit_tokens(mid) >= hit_tokens:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _belady_kept(model: CacheModel, budget_blocks: int) -> IntArray:
    """Blocks each request finds in Belady's cache of ``budget_blocks`` blocks."""
    n_req = model.requests
    kept = np.zeros(n_req, dtype=np.int64)
    prev, nxt = model.group_prev, model.group_next
    if budget_blocks <= 0 or prev.size == 0:
        return kept
    cap = budget_blocks
    if _max_held(model) <= cap:  # everything fits: every reuse hits
        np.add.at(kept, nxt, model.group_count)
        return kept
    echo = model.group_echo
    held_groups = np.flatnonzero(~echo)
    by_prev = held_groups[np.argsort(prev[held_groups], kind="stable")]
    starts = np.searchsorted(prev[by_prev], np.arange(n_req + 1)).tolist()
    by_next = np.searchsorted(nxt, np.arange(n_req + 1)).tolist()  # nxt is sorted
    order, neg_next = by_prev.tolist(), (-nxt).tolist()
    neg_pos, count = (-model.group_pos).tolist(), model.group_count.tolist()
    echoes = set(np.flatnonzero(echo).tolist())
    left = [0] * len(count)  # blocks of each group in the cache
    out = [0] * n_req
    held = 0
    heap: list[tuple[int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    for e in range(n_req):
        g0, g1 = by_next[e], by_next[e + 1]
        if g0 < g1 and not echoes:  # request e looks up its groups: what is left hits
            hit = sum(left[g0:g1])  # (a prefix of the request: see the module doc)
            out[e] = hit
            held -= hit
            left[g0:g1] = [0] * (g1 - g0)
        elif g0 < g1:  # the same, walking the groups in pos order past the echoes
            hit = 0
            run = True
            for g in range(g0, g1):
                if g in echoes:
                    hit += count[g] if run else 0
                    continue
                have = left[g]
                held -= have
                left[g] = 0
                if run:
                    hit += have
                    run = have == count[g]
            out[e] = hit
        for g in order[starts[e] : starts[e + 1]]:  # blocks e touched, used again
            left[g] = count[g]
            held += count[g]
            push(heap, (neg_next[g], neg_pos[g], g))
        while held > cap:  # drop the blocks used last (and deepest in their request)
            g = heap[0][2]
            if left[g] <= held - cap:
                held -= left[g]
                left[g] = 0
                pop(heap)
            else:
                left[g] -= held - cap
                held = cap
        while heap and left[heap[0][2]] == 0:
            pop(heap)
    kept[:] = out
    return kept


def _max_held(model: CacheModel) -> int:
    """Most blocks Belady would ever hold with no limit (all reuses kept)."""
    delta = np.zeros(model.requests + 1, dtype=np.int64)
    held = ~model.group_echo
    count = model.group_count[held]
    np.add.at(delta, model.group_prev[held], count)
    np.add.at(delta, model.group_next[held], -count)
    return int(np.cumsum(delta).max(initial=0))


def _sweep(reqs: Sequence[_Req], block_size: int) -> CacheModel:
    """The one LRU pass over ``reqs`` in order (see the module docstring)."""
    bs = block_size
    fen = _Fenwick(sum(len(r.runs) for r in reqs))
    seg_lo: list[int] = []
    seg_req: list[int] = []
    held = 0  # distinct blocks seen so far
    maps: dict[Hashable, _IdMap] = {}
    r_lo: list[int] = []
    r_hi: list[int] = []
    p_v: list[int] = []
    p_t: list[int] = []
    g_prev: list[int] = []
    g_next: list[int] = []
    g_pos: list[int] = []
    g_cnt: list[int] = []
    g_echo: list[bool] = []
    for e, req in enumerate(reqs):
        idmap = maps.get(req.namespace)
        if idmap is None:
            idmap = maps[req.namespace] = _IdMap()
        lo, hi, sg = idmap.lo, idmap.hi, idmap.seg
        useful = req.useful_blocks
        looked = _Looked()  # the ids this request has looked up so far
        pos = 0  # blocks of the request looked up so far
        top = 0  # the prefix maximum of the ranks
        for v, m in req.runs:
            if pos >= useful:
                break
            a, b = v, v + min(m, useful - pos)
            k = bisect.bisect_right(hi, a)
            if k == len(lo) or lo[k] > a:
                break  # an unseen block: nothing after it can hit
            while pos < useful and a < b and k < len(lo) and lo[k] <= a:
                s = sg[k]
                y = min(hi[k], b)
                n = y - a
                # Rank of block a: blocks held by later segments, plus blocks of its
                # own segment up to it (used after it: ids descend in time there).
                within = a - lo[k] + 1
                j, first = k - 1, seg_lo[s]
                while j >= 0 and lo[j] >= first:
                    if sg[j] == s:
                        within += hi[j] - lo[j]
                    j -= 1
                r0 = held - fen.prefix(s) + within
                last = r0 + n - 1
                if last <= top:
                    p_v.append(top)
                    p_t.append(n * bs)
                else:
                    below = max(0, top - r0 + 1)
                    if below:
                        p_v.append(top)
                        p_t.append(below * bs)
                    r_lo.append(r0 + below)
                    r_hi.append(last)
                    top = last
                for x0, x1, echo in looked.add(a, y):
                    g_prev.append(seg_req[s])
                    g_next.append(e)
                    g_pos.append(pos + x0 - a)
                    g_cnt.append(x1 - x0)
                    g_echo.append(echo)
                pos += n
                a = y
                k += 1
            if a < b:
                break
        if pos >= useful > 0 and req.last_tokens < bs:
            p_v.append(top)  # the last block is partial: it weighs less
            p_t.append(req.last_tokens - bs)
        for v, m in reversed(req.runs):  # then touch: last run first, head last
            s = len(seg_lo)
            seg_lo.append(v)
            seg_req.append(e)
            for x, y, old in idmap.assign(v, v + m, s):
                fen.add(old, x - y)
                held -= y - x
            fen.add(s, m)
            held += m

    def arr(values: list[int]) -> IntArray:
        return np.asarray(values, dtype=np.int64)

    return CacheModel(
        block_size=bs,
        requests=len(reqs),
        input_tokens=sum(r.input_tokens for r in reqs),
        range_lo=arr(r_lo),
        range_hi=arr(r_hi),
        point_v=arr(p_v),
        point_tokens=arr(p_t),
        group_prev=arr(g_prev),
        group_next=arr(g_next),
        group_pos=arr(g_pos),
        group_count=arr(g_cnt),
        group_echo=np.asarray(g_echo, dtype=bool),
        request_input=arr([r.input_tokens for r in reqs]),
    )


def _req(
    namespace: Hashable, runs: list[Run], n_blocks: int, input_tokens: int, bs: int
) -> _Req:
    useful = min(n_blocks, -(-max(input_tokens, 0) // bs))
    last = input_tokens - (useful - 1) * bs if useful else 0
    return _Req(namespace, runs, useful, last, input_tokens)


def model_of_requests(
    requests_in_order: Iterable[CacheRequest], *, block_size: int
) -> CacheModel:
    """The cache model of requests in the given order (``lru_hits``'s input)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    reqs = []
    for namespace, hash_ids, input_tokens in requests_in_order:
        ids = np.asarray(hash_ids, dtype=np.int64)
        pos, first = _runs(ids)
        ends = [*pos[1:], ids.size] if pos else []
        runs = [(v, e - p) for p, v, e in zip(pos, first, ends, strict=True)]
        reqs.append(_req(namespace, runs, ids.size, int(input_tokens), block_size))
    return _sweep(reqs, block_size)


def _block_size(trace: Trace) -> int:
    sizes = sorted({s.block_size for s, _ in trace.all_sessions()})
    if len(sizes) > 1:
        raise TraceError(
            f"cache-curve needs one block size; the trace has {sizes} tokens"
        )
    return sizes[0] if sizes else 1


def trace_model(
    trace: Trace,
    *,
    concurrency: int,
    think_scale: float = 1.0,
    think_cap_s: float | None = None,
    max_inflight: int | None = None,
    tool_scale: float = 1.0,
) -> CacheModel:
    """The cache model of ``trace`` sent as a replay at ``concurrency`` lanes (at most
    ``max_inflight`` requests in flight) would send it (``traces.sendorder``)."""
    rule = GapRule(think_scale, think_cap_s, tool_scale)
    return _ordered_model(trace, concurrency, rule, max_inflight)[1]


def _ordered_model(
    trace: Trace,
    concurrency: int,
    rule: GapRule,
    max_inflight: int | None,
) -> tuple[list[SentRequest], CacheModel]:
    """The send order and its cache model."""
    bs = _block_size(trace)
    order = send_order(
        trace,
        concurrency=concurrency,
        think_scale=rule.think_scale,
        think_cap_s=rule.think_cap_s,
        max_inflight=max_inflight,
        tool_scale=rule.tool_scale,
    )
    rows = _rows_by_session(trace)
    runs_of: dict[int, tuple[list[int], list[int]]] = {}
    reqs: list[_Req] = []
    roots = trace.sessions
    for sent in order:
        table, first, _ = rows[id(sent.session)]
        key = id(table.blocks)
        if key not in runs_of:
            runs_of[key] = _runs(table.blocks)
        run_pos, run_val = runs_of[key]
        row = first + sent.index
        off, n = int(table.ids_offset[row]), int(table.n_blocks[row])
        runs: list[Run] = []
        p, end = off, off + n
        k = bisect.bisect_right(run_pos, p) - 1
        while p < end:
            q = min(run_pos[k + 1] if k + 1 < len(run_pos) else table.blocks.size, end)
            runs.append((run_val[k] + (p - run_pos[k]), q - p))
            p, k = q, k + 1
        root = roots[sent.root_index]
        ns = "global" if root.hash_id_scope == "global" else sent.root_index
        reqs.append(_req(ns, runs, n, int(table.input_tokens[row]), bs))
    return order, _sweep(reqs, bs)


INFLIGHT_PERCENTILE = 90


def inflight_tokens(
    order: Sequence[SentRequest], *, block_size: int, block_tokens: int
) -> int:
    """What the requests in flight hold on the server, in its tokens: the
    ``INFLIGHT_PERCENTILE``-th percentile, over requests, of the prompt (input tokens
    scaled by ``block_tokens / block_size``, as ``replayer run --block-tokens`` sends
    them) + output tokens of the requests in flight when it is sent (sent at or before
    it, ending after it), itself included."""
    if not order:
        return 0
    cols: dict[int, tuple[IntArray, IntArray]] = {}
    held, send, end = [], [], []
    scale = block_tokens / block_size
    for sent in order:
        key = id(sent.session)
        if key not in cols:
            reqs = sent.session.requests
            cols[key] = (
                request_column(reqs, "input_tokens"),
                request_column(reqs, "output_tokens"),
            )
        inp, out = cols[key]
        held.append(float(inp[sent.index]) * scale + float(out[sent.index]))
        send.append(sent.send_s)
        end.append(sent.end_s)
    h = np.asarray(held)
    e = np.asarray(end)
    by_end = np.argsort(e, kind="stable")
    ended = np.concatenate([[0.0], np.cumsum(h[by_end])])
    # ``order`` is in send order: request k's in-flight set is 0..k minus the ended.
    done = np.searchsorted(e[by_end], np.asarray(send), side="right")
    live = np.cumsum(h) - ended[done]
    live = np.maximum(live, h)  # itself, even with a zero duration
    return round(float(np.percentile(live, INFLIGHT_PERCENTILE)))


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    """Hit rates at one KV budget."""

    budget_tokens: int  # in tokens of ``block_tokens`` per block
    lru_hit_rate: float
    belady_hit_rate: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheCurve:
    """Hit rate against KV budget for one replay order of a trace."""

    concurrency: int
    think_scale: float
    think_cap_s: float | None
    block_tokens: int  # tokens per block on the server (budgets count these)
    requests: int
    input_tokens: int
    ceiling_hit_rate: float  # infinite budget = `trace stats`' ideal hit
    lru_unbounded_hit_rate: float  # LRU with no limit (= ceiling for chained ids)
    points: tuple[CurvePoint, ...]
    knee_tokens: int | None  # smallest budget with LRU >= ceiling - 5 points
    inflight_tokens: int = 0  # what the requests in flight hold (p90; see module doc)
    max_inflight: int | None = None
    server_kv_tokens: int | None = None
    server: CurvePoint | None = None  # the curve at the server's KV size
    tool_scale: float = 1.0  # the gaps' tool time (traces.gaps)

    @property
    def server_above_knee(self) -> bool | None:
        """Whether the server's KV size reaches the knee (None: no server or knee)."""
        if self.server_kv_tokens is None or self.knee_tokens is None:
            return None
        return self.server_kv_tokens >= self.knee_tokens

    def below_inflight(self, budget_tokens: int) -> bool:
        """Whether a KV size is below what the requests in flight hold, where a
        server queues them and hits less than this LRU (see the module docstring)."""
        return budget_tokens < self.inflight_tokens


def default_budgets(model: CacheModel, n: int = DEFAULT_BUDGETS) -> list[int]:
    """``n`` budgets (blocks), geometric up to the one from which LRU hits all it
    ever will, from 1/1024 of it (or the smallest budget with any hit, if larger)."""
    finite = [int(a.min()) for a in (model.range_lo, model.point_v) if a.size]
    hi = max(1, model.max_rank())
    lo = max(1, min(finite, default=1), hi // 1024)
    if hi <= lo:
        return [hi]
    grid = np.geomspace(lo, hi, n)
    return sorted({round(float(x)) for x in grid})


def cache_curve(
    trace: Trace,
    *,
    concurrency: int,
    think_scale: float = 1.0,
    think_cap_s: float | None = None,
    budgets_tokens: Sequence[int] | None = None,
    block_tokens: int | None = None,
    server_kv_tokens: int | None = None,
    max_inflight: int | None = None,
    tool_scale: float = 1.0,
) -> CacheCurve:
    """LRU, Belady and the ceiling at each budget (tokens of ``block_tokens`` per
    block: the server's tokens per trace block, default the trace's block size), the
    LRU knee, and the curve at the server's KV size when given. Budgets round down to
    whole blocks; the default is :func:`default_budgets`.

    The cache model is ``traces.cache.lru_hits``'s, at request granularity: a request
    looks up its blocks, hits the leading run of cached ones (prefix caching cannot use
    a block after a miss), in tokens capped at its input length; then all its blocks
    become most recently used, its first block last, so eviction trims a prefix from its
    tail. A block is (namespace, hash id); a budget of C blocks holds C blocks between
    requests.

    **LRU, every budget in one pass.** An LRU cache of C blocks holds exactly the C most
    recently used blocks, so block j of a request is cached iff its recency rank d_j (1
    = most recent, unseen = infinite) is <= C, and the request hits #{j : max(d_1..d_j)
    <= C} blocks. One sweep collects every request's prefix maxima as a histogram; the
    hit at any budget is then a sum over it. The sweep works on runs of consecutive hash
    ids (traces number a prompt's blocks in order, so a request is a few runs, not 10^5
    blocks): a run touched by one request is one *segment*; within a segment, ranks grow
    by one per block, so a run costs one rank query (a Fenwick tree of blocks held per
    segment, in time order). Exact: it equals ``lru_hits`` at every budget (the tests
    check this).

    **Belady.** Belady's MIN at the same granularity, with bypass: after each request
    the cache keeps the C blocks whose next use is soonest (ties: the one nearer the
    start of the request that uses it), dropping blocks that are never used again. Only
    blocks of the leading seen run of their next request are kept (others cannot hit
    under the prefix rule). With chained hash ids (equal id => equal prefix, as real
    traces have) it maximizes the number of block hits among all policies under this
    model (LRU's hits are such a schedule), so Belady >= LRU, except that hit tokens
    weigh a partial last block less; the kept blocks of a request always form a prefix
    of it, so the prefix rule costs Belady nothing. With ids that do not chain
    (arbitrary or repeated inside a request) it stays >= LRU (the tests draw such
    orders) but is a heuristic, not the exact optimum. Belady is simulated once per
    budget (a heap of reuse groups: blocks that move together from one request to their
    next). An id that a request repeats (``[1, 1]``; chained prefix hashes never do) is
    one block: held once, and its later positions hit whenever the leading run reaches
    them, as ``lru_hits`` counts them.

    **Ceiling.** The infinite budget: ``traces.stats.ideal_hit_tokens``, the ideal hit
    ``trace stats`` reports. With chained hash ids (equal id ⇒ equal prefix) a request's
    misses are exactly the first sightings of its blocks, so the unbounded LRU equals it
    in any order.
    """
    rule = GapRule(think_scale, think_cap_s, tool_scale)
    order, model = _ordered_model(trace, concurrency, rule, max_inflight)
    bt = block_tokens or model.block_size
    if bt < 1:
        raise ValueError(f"block_tokens must be >= 1 (got {bt})")
    total = model.input_tokens
    rows = _rows_by_session(trace)
    ideal = sum(int(h.sum()) for _, h in ideal_hit_tokens(trace, rows))

    def rate(tokens: int) -> float:
        return tokens / total if total else math.nan

    def point(budget_tokens: int) -> CurvePoint:
        blocks = budget_tokens // bt
        return CurvePoint(
            budget_tokens=budget_tokens,
            lru_hit_rate=rate(model.lru_hit_tokens(blocks)),
            belady_hit_rate=rate(model.belady_hit_tokens(blocks)),
        )

    if budgets_tokens is None:
        budgets_tokens = [b * bt for b in default_budgets(model)]
    for b in budgets_tokens:
        if b < 0:
            raise ValueError(f"a KV budget must be >= 0 tokens (got {b})")
    knee = model.smallest_budget(ideal - KNEE_POINTS * total) if total else None
    return CacheCurve(
        concurrency=concurrency,
        think_scale=think_scale,
        think_cap_s=think_cap_s,
        block_tokens=bt,
        requests=model.requests,
        input_tokens=total,
        ceiling_hit_rate=rate(ideal),
        lru_unbounded_hit_rate=rate(model.lru_unbounded_tokens()),
        points=tuple(point(b) for b in sorted(budgets_tokens)),
        knee_tokens=None if knee is None else knee * bt,
        inflight_tokens=inflight_tokens(
            order, block_size=model.block_size, block_tokens=bt
        ),
        max_inflight=max_inflight,
        server_kv_tokens=server_kv_tokens,
        server=None if server_kv_tokens is None else point(server_kv_tokens),
        tool_scale=tool_scale,
    )
