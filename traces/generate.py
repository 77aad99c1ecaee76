"""The seeded synthetic generator of agentic session trees: :class:`GeneratorConfig`,
``PRESETS`` and :func:`generate_trace`. Fitting lives in ``traces.fit``, files in
``traces.io``. See docs/traces.md#synthetic-traces."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from traces.distributions import (
    Distribution,
    Empirical,
    Gamma,
    LogNormal,
    construct,
    dist_from_dict,
    dist_to_dict,
    draw,
)
from traces.errors import TraceError
from traces.model import Scope, Session, Subagent, Trace
from traces.table import Labels, RequestTable, frozen

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratorConfig:
    """Everything the generator draws from; presets are instances of it.

    GeneratorConfig(output_tokens=LogNormal(median=444, sigma=1.0), ...)
    replace(PRESETS["agentx"], session_rate_per_s=0.5)
    """

    name: str = "custom"
    default_sessions: int = 100  # root sessions when the caller does not say
    block_size: int = 64  # tokens per hash block (Weka: 64)
    model: str = "claude-opus-4-5-20251101"
    subagent_model: str = "claude-haiku-4-5-20251001"
    subagent_types: tuple[str, ...] = ("Explore", "general-purpose", "Plan")

    # Tree size, subagents included (a count; drawn stratified, rounded, >= 1).
    requests_per_session: Distribution = field(
        default_factory=lambda: LogNormal(median=67, sigma=1.7, low=1, high=5000)
    )
    # Subagents.
    subagent_session_fraction: float = 0.44  # of root sessions; exact after rounding
    subagent_groups_per_session: Distribution = field(
        default_factory=lambda: Empirical(values=(1, 1, 1, 2, 2, 2, 2, 3, 5))
    )
    agents_per_group: Distribution = field(  # subagents spawned together, in parallel
        default_factory=lambda: Empirical(values=(1, 1, 1, 2, 2, 3, 3, 3))
    )
    subagent_turns: Distribution = field(  # requests of one subagent
        default_factory=lambda: LogNormal(median=11, sigma=0.5, low=2, high=60)
    )
    # Probability that a tree's last group runs in the background (no join); Weka can
    # express that only after the parent's last request.
    background_fraction: float = 0.0

    # Prompt prefixes (tokens): system prompt and tool definitions.
    system_tokens: int = 2800
    tool_tokens: int = 12400
    subagent_system_tokens: int = 1000
    subagent_tool_tokens: int = 7800
    global_prefix: bool = False  # True: hash_id_scope "global", prefix ids shared

    # Latent context growth (tokens); shapes sessions, see the module docstring.
    first_message_tokens: Distribution = field(
        default_factory=lambda: LogNormal(median=2500, sigma=1.0, high=200_000)
    )
    subagent_first_message_tokens: Distribution = field(
        default_factory=lambda: LogNormal(median=1500, sigma=0.5, high=50_000)
    )
    tool_result_tokens: Distribution = field(  # added per turn besides the output
        default_factory=lambda: LogNormal(median=1200, sigma=1.4, high=100_000)
    )
    compaction_threshold_tokens: Distribution = field(  # per thread
        default_factory=lambda: LogNormal(median=600_000, sigma=0.5, high=1_000_000)
    )
    compacted_tokens: Distribution = field(  # context right after a compaction
        default_factory=lambda: LogNormal(median=60_000, sigma=0.4)
    )
    # Request-weighted input length the latent contexts are mapped to (None: keep).
    input_tokens: Distribution | None = None
    max_context_tokens: int = 1_000_000  # ceiling on any request's input
    drop_requests_over_tokens: int | None = None  # drop (not clip) longer requests

    output_tokens: Distribution = field(
        default_factory=lambda: LogNormal(median=444, sigma=1.0, low=1, high=32_000)
    )
    think_time_s: Distribution = field(  # gap before every request but a thread's first
        default_factory=lambda: LogNormal(median=2.3, sigma=2.18, high=3600)
    )
    # api_time = (base + per_output_token * out) * exp(sigma * N(0, 1)), seconds.
    api_time_base_s: float = 1.5
    api_time_s_per_output_token: float = 0.02
    api_time_sigma: float = 0.3

    # Session arrivals (start_t): gamma inter-arrival gaps with mean 1/rate; shape 1 is
    # a Poisson process. None: no timeline, start_t is not written.
    session_rate_per_s: float | None = None
    arrival_shape: float = 1.0

    def __post_init__(self) -> None:
        checks = (
            (self.block_size >= 1, "block_size must be >= 1"),
            (self.default_sessions >= 1, "default_sessions must be >= 1"),
            (
                0 <= self.subagent_session_fraction <= 1,
                "subagent_session_fraction must be in [0, 1]",
            ),
            (
                0 <= self.background_fraction <= 1,
                "background_fraction must be in [0, 1]",
            ),
            (self.max_context_tokens >= 1, "max_context_tokens must be >= 1"),
            (
                self.session_rate_per_s is None or self.session_rate_per_s > 0,
                "session_rate_per_s must be > 0",
            ),
            (self.arrival_shape > 0, "arrival_shape must be > 0"),
            (len(self.subagent_types) >= 1, "subagent_types must not be empty"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message} (config {self.name!r})")
        object.__setattr__(self, "subagent_types", tuple(self.subagent_types))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``--save-config``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, LogNormal | Gamma | Empirical):
                value = dist_to_dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, obj: object) -> GeneratorConfig:
        """Inverse of :meth:`to_dict`; raises TraceError naming the bad field."""
        if not isinstance(obj, dict):
            raise TraceError("generator config: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise TraceError(f"generator config: unknown fields {unknown}")
        kwargs: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(value, dict):
                value = dist_from_dict(value, key)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        return construct(cls, kwargs, "generator config")


def _agentx() -> GeneratorConfig:
    # Published AgentX v1.0: request input p50 142,016 and p90 ~550K, contexts capped
    # near 1M; between the published points the table is log-linear (our choice).
    return GeneratorConfig(
        name="agentx",
        default_sessions=393,
        input_tokens=Empirical(
            probs=(0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
            values=(
                9_000,
                20_000,
                32_000,
                70_000,
                142_016,
                300_000,
                550_000,
                700_000,
                900_000,
                1_000_000,
            ),
            log=True,
        ),
    )


def _demo() -> GeneratorConfig:
    # Small enough to replay against the CPU simulator in seconds.
    return GeneratorConfig(
        name="demo",
        default_sessions=7,
        requests_per_session=Empirical(values=(4, 12)),
        subagent_session_fraction=0.25,
        subagent_groups_per_session=Empirical(values=(1,)),
        agents_per_group=Empirical(values=(2,)),
        subagent_turns=Empirical(values=(2, 3)),
        system_tokens=600,
        tool_tokens=900,
        subagent_system_tokens=300,
        subagent_tool_tokens=400,
        first_message_tokens=LogNormal(median=600, sigma=0.3),
        subagent_first_message_tokens=LogNormal(median=400, sigma=0.3),
        tool_result_tokens=LogNormal(median=1500, sigma=0.6, high=8000),
        compaction_threshold_tokens=LogNormal(median=28_000, sigma=0.1),
        compacted_tokens=LogNormal(median=6000, sigma=0.2),
        input_tokens=Empirical(values=(2000, 30_000), log=True),
        max_context_tokens=30_000,
        output_tokens=LogNormal(median=64, sigma=0.5, low=8, high=256),
        think_time_s=LogNormal(median=0.5, sigma=0.8, high=2.0),
        api_time_base_s=0.2,
        api_time_s_per_output_token=0.01,
    )


PRESETS: dict[str, GeneratorConfig] = {
    "agentx": _agentx(),
    # AgentX for 256K-context models: requests longer than 256,000 tokens are dropped.
    "agentx-256k": replace(
        _agentx(), name="agentx-256k", drop_requests_over_tokens=256_000
    ),
    "demo": _demo(),
}


# --------------------------------------------------------------------------- structure


@dataclass(slots=True)
class _Group:
    tree: int
    anchor: int  # parent request index
    background: bool
    subagent_type: str
    threads: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Layout:
    thread_n: list[int] = field(default_factory=list)
    thread_tree: list[int] = field(default_factory=list)
    thread_is_sub: list[bool] = field(default_factory=list)
    tree_parent: list[int] = field(default_factory=list)  # thread index
    groups: list[_Group] = field(default_factory=list)


def _one(dist: Distribution, rng: np.random.Generator) -> int:
    return max(1, round(float(draw(dist, rng, 1, stratified=False)[0])))


def _fit_turns(turns: list[list[int]], room: int) -> list[list[int]]:
    """Shrink subagent turns (then agents) so they fit in ``room`` requests."""
    while turns and sum(len(t) for t in turns) > room:
        turns[-1].pop()
        if not turns[-1]:
            turns.pop()
    total = sum(sum(t) for t in turns)
    if not turns or total <= room:
        return turns
    flat = np.array([x for t in turns for x in t], dtype=np.int64)
    flat = np.maximum(1, flat * room // total)
    while flat.sum() > room:  # floor rounding leaves at most a few over
        flat[int(np.argmax(flat))] -= 1
    it = iter(flat.tolist())
    return [[next(it) for _ in t] for t in turns]


def _layout(
    config: GeneratorConfig, sessions: int, rng: np.random.Generator
) -> _Layout:
    sizes = draw(config.requests_per_session, rng, sessions, centered=True)
    totals = np.maximum(1, np.rint(sizes))
    totals = totals.astype(np.int64)
    want = round(config.subagent_session_fraction * sessions)
    # Exactly `want` trees get subagents, chosen at random among those big enough.
    order = rng.permutation(sessions)
    eligible = order[totals[order] >= 3]  # room for a spawn, a subagent and a join
    with_sub = set(eligible[:want].tolist())
    lay = _Layout()
    for tree in range(sessions):
        total = int(totals[tree])
        turns: list[list[int]] = []
        background = False
        if tree in with_sub:
            n_groups = _one(config.subagent_groups_per_session, rng)
            for _ in range(n_groups):
                agents = _one(config.agents_per_group, rng)
                turns.append([_one(config.subagent_turns, rng) for _ in range(agents)])
            background = bool(rng.random() < config.background_fraction)
            while turns:
                joined = len(turns) - (1 if background else 0)
                fitted = _fit_turns([list(t) for t in turns], total - joined - 1)
                if len(fitted) == len(turns):
                    turns = fitted
                    break
                turns.pop()  # too many groups for this tree: drop one and retry
        parent_n = total - sum(sum(t) for t in turns)
        parent = len(lay.thread_n)
        lay.tree_parent.append(parent)
        lay.thread_n.append(parent_n)
        lay.thread_tree.append(tree)
        lay.thread_is_sub.append(False)
        joined = len(turns) - (1 if background and turns else 0)
        anchors = np.sort(rng.choice(parent_n - 1, size=joined, replace=False)).tolist()
        if len(anchors) < len(turns):
            anchors.append(parent_n - 1)
        for g, (anchor, agent_turns) in enumerate(zip(anchors, turns, strict=True)):
            kind = config.subagent_types[int(rng.integers(len(config.subagent_types)))]
            group = _Group(
                tree=tree,
                anchor=int(anchor),
                background=g >= joined,
                subagent_type=kind,
            )
            for n in agent_turns:
                group.threads.append(len(lay.thread_n))
                lay.thread_n.append(n)
                lay.thread_tree.append(tree)
                lay.thread_is_sub.append(True)
            lay.groups.append(group)
    return lay


# --------------------------------------------------------------------------- requests


def _segmented_cumsum(
    step: npt.NDArray[Any], starts: IntArray, thr: IntArray
) -> npt.NDArray[Any]:
    """Cumulative sum restarting at every thread start (inclusive)."""
    cs = np.cumsum(step)
    out: npt.NDArray[Any] = cs - cs[starts][thr] + step[starts][thr]
    return out


@dataclass(slots=True)
class _Arrays:
    thr: IntArray
    starts: IntArray
    first: npt.NDArray[np.bool_]
    last: npt.NDArray[np.bool_]
    input_tokens: IntArray
    output_tokens: IntArray
    think_ms: IntArray
    api_ms: IntArray
    t_ms: IntArray
    seg: IntArray  # segment index of each request
    seg_offset: IntArray  # start of each segment in ``ids``
    ids: IntArray  # flat hash-id buffer, read-only


def _contexts(
    config: GeneratorConfig,
    lay: _Layout,
    thr: IntArray,
    first: npt.NDArray[np.bool_],
    out: IntArray,
    rng: np.random.Generator,
) -> tuple[FloatArray, IntArray]:
    """Latent context lengths and each request's segment number within its thread."""
    n_thr = len(lay.thread_n)
    is_sub = np.asarray(lay.thread_is_sub, dtype=bool)
    prefix = np.where(
        is_sub,
        config.subagent_system_tokens + config.subagent_tool_tokens,
        config.system_tokens + config.tool_tokens,
    ).astype(np.float64)
    first_msg = np.where(
        is_sub,
        draw(config.subagent_first_message_tokens, rng, n_thr),
        draw(config.first_message_tokens, rng, n_thr),
    )
    init = prefix + first_msg
    bs = config.block_size
    compacted = np.maximum(draw(config.compacted_tokens, rng, n_thr), prefix + bs)
    threshold = np.maximum(
        draw(config.compaction_threshold_tokens, rng, n_thr),
        np.maximum(init, compacted) + 4 * bs,
    )
    tool = draw(config.tool_result_tokens, rng, out.size)
    prev_out = np.concatenate([[0], out[:-1]]).astype(np.float64)
    inc = np.where(first, 0.0, tool + prev_out)
    starts = np.flatnonzero(first)
    grown = init[thr] + _segmented_cumsum(inc, starts, thr)
    span = (threshold - compacted)[thr]
    over = grown - threshold[thr]
    seg = np.where(over < 0, 0, 1 + np.floor_divide(np.maximum(over, 0), span))
    latent = np.where(
        seg == 0, grown, compacted[thr] + np.mod(np.maximum(over, 0), span)
    )
    return latent, seg.astype(np.int64)


def _map_marginal(
    config: GeneratorConfig, latent: FloatArray, rng: np.random.Generator
) -> IntArray:
    if config.input_tokens is None:
        mapped = latent
    else:
        # The i-th smallest latent context gets the i-th smallest of a stratified
        # sample: the marginal is the target's, and the order within a thread is kept.
        rank = np.empty(latent.size, dtype=np.int64)
        rank[np.argsort(latent, kind="stable")] = np.arange(latent.size)
        mapped = np.sort(draw(config.input_tokens, rng, latent.size))[rank]
    return np.clip(np.rint(mapped), 1, config.max_context_tokens).astype(np.int64)


def _hash_ids(
    config: GeneratorConfig,
    lay: _Layout,
    thr: IntArray,
    first: npt.NDArray[np.bool_],
    seg_no: IntArray,
    in_tokens: IntArray,
) -> tuple[IntArray, IntArray, IntArray]:
    bs = config.block_size
    n = in_tokens.size
    new_seg = first.copy()
    new_seg[1:] |= seg_no[1:] != seg_no[:-1]
    seg_starts = np.flatnonzero(new_seg)
    seg = np.cumsum(new_seg) - 1
    blocks = in_tokens // bs
    # Within a segment inputs never shrink, so the last request holds the most blocks.
    seg_len = np.maximum.reduceat(blocks, seg_starts) if n else blocks
    is_sub = np.asarray(lay.thread_is_sub, dtype=bool)
    parent_p = (config.system_tokens + config.tool_tokens) // bs
    sub_p = (config.subagent_system_tokens + config.subagent_tool_tokens) // bs
    seg_thr = thr[seg_starts]
    seg_sub = is_sub[seg_thr]
    seg_p = np.minimum(np.where(seg_sub, sub_p, parent_p), seg_len)
    new_count = seg_len - seg_p
    before = np.concatenate([[0], np.cumsum(new_count)[:-1]]).astype(np.int64)
    if not config.global_prefix:
        seg_tree = np.asarray(lay.thread_tree, dtype=np.int64)[seg_thr]
        tree_start = np.concatenate([[True], seg_tree[1:] != seg_tree[:-1]])
        first_seg = np.maximum.accumulate(
            np.where(tree_start, np.arange(seg_tree.size), 0)
        )
        before -= before[first_seg]  # every tree numbers its own blocks
    new_base = parent_p + sub_p + 1 + before
    prefix_base = np.where(seg_sub, parent_p + 1, 1)
    seg_offset = np.concatenate([[0], np.cumsum(seg_len)[:-1]]).astype(np.int64)
    total = int(seg_len.sum())
    owner = np.repeat(np.arange(seg_len.size), seg_len)
    pos = np.arange(total, dtype=np.int64) - seg_offset[owner]
    p = seg_p[owner]
    ids = np.where(pos < p, prefix_base[owner] + pos, new_base[owner] + pos - p)
    ids = ids.astype(np.int64)
    ids.setflags(write=False)
    return ids, seg, seg_offset


def _arrays(config: GeneratorConfig, lay: _Layout, rng: np.random.Generator) -> _Arrays:
    thread_n = np.asarray(lay.thread_n, dtype=np.int64)
    n = int(thread_n.sum())
    thr = np.repeat(np.arange(thread_n.size), thread_n)
    starts = np.concatenate([[0], np.cumsum(thread_n)[:-1]]).astype(np.int64)
    pos = np.arange(n, dtype=np.int64) - starts[thr]
    first = pos == 0
    last = pos == thread_n[thr] - 1
    out = np.maximum(1, np.rint(draw(config.output_tokens, rng, n))).astype(np.int64)
    latent, seg_no = _contexts(config, lay, thr, first, out, rng)
    in_tokens = _map_marginal(config, latent, rng)
    ids, seg, seg_offset = _hash_ids(config, lay, thr, first, seg_no, in_tokens)
    noise = np.exp(config.api_time_sigma * rng.standard_normal(n))
    api_s = (config.api_time_base_s + config.api_time_s_per_output_token * out) * noise
    api_ms = np.maximum(1, np.rint(1000 * api_s)).astype(np.int64)
    arr = _Arrays(
        thr=thr,
        starts=starts,
        first=first,
        last=last,
        input_tokens=in_tokens,
        output_tokens=out,
        think_ms=np.zeros(n, dtype=np.int64),
        api_ms=api_ms,
        t_ms=np.zeros(n, dtype=np.int64),
        seg=seg,
        seg_offset=seg_offset,
        ids=ids,
    )
    _think_times(config, lay, arr, rng)
    return arr


def _think_times(
    config: GeneratorConfig, lay: _Layout, arr: _Arrays, rng: np.random.Generator
) -> None:
    """Draw think gaps; a join request's gap also covers the wait for its group.

    Join requests take the largest draws (matched to their waits by rank) and only
    then are raised to the wait, so the marginal stays the configured one except
    where a wait is longer than every draw left.
    """
    joins = [
        (int(arr.starts[lay.tree_parent[g.tree]]) + g.anchor + 1, g.threads)
        for g in lay.groups
        if not g.background
    ]
    gaps = np.flatnonzero(~arr.first)
    pool = np.sort(np.rint(1000 * draw(config.think_time_s, rng, gaps.size)))
    pool = pool.astype(np.int64)
    join_idx = np.array([j for j, _ in joins], dtype=np.int64)
    others = gaps[~np.isin(gaps, join_idx)]
    k = join_idx.size
    arr.think_ms[others] = rng.permutation(pool[: pool.size - k])
    _timeline(arr)
    ends = np.flatnonzero(arr.last)
    duration = arr.t_ms[ends] + arr.api_ms[ends]
    wait = np.array([max(int(duration[t]) for t in th) for _, th in joins], np.int64)
    reserved = np.empty(k, dtype=np.int64)
    reserved[np.argsort(wait, kind="stable")] = pool[pool.size - k :]
    arr.think_ms[join_idx] = np.maximum(reserved, wait)
    _timeline(arr)


def _timeline(arr: _Arrays) -> None:
    prev_api = np.concatenate([[0], arr.api_ms[:-1]])
    step = np.where(arr.first, 0, arr.think_ms + prev_api)
    arr.t_ms[:] = _segmented_cumsum(step, arr.starts, arr.thr)


# --------------------------------------------------------------------------- sessions


@dataclass(slots=True)
class _Kept:
    """The requests kept (not dropped by ``drop_requests_over_tokens``) as one table,
    threads in order, each thread's times re-based on its first kept request."""

    table: RequestTable
    row_start: IntArray  # first table row of each thread
    count: IntArray  # kept requests of each thread
    kept_upto: IntArray  # kept requests of the thread at or before each request
    shift_ms: IntArray  # t of each thread's first kept request, original timeline
    end_ms: IntArray  # end of each thread's last kept request, after the shift


def _kept(config: GeneratorConfig, lay: _Layout, arr: _Arrays) -> _Kept:
    limit = config.drop_requests_over_tokens
    n_thr = len(lay.thread_n)
    keep = (
        np.ones(arr.input_tokens.size, dtype=bool)
        if limit is None
        else arr.input_tokens <= limit
    )
    rows = np.flatnonzero(keep)
    thr = arr.thr[rows]
    pos = rows - arr.starts[thr]
    thread_n = np.asarray(lay.thread_n, dtype=np.int64)
    last = pos == thread_n[thr] - 1  # the thread's last request, kept or not
    count = np.bincount(thr, minlength=n_thr).astype(np.int64)
    row_start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    new_thr = np.ones(rows.size, dtype=bool)
    new_thr[1:] = thr[1:] != thr[:-1]
    t, api = arr.t_ms[rows], arr.api_ms[rows]
    group_first = np.maximum.accumulate(np.where(new_thr, np.arange(rows.size), 0))
    shift = t[group_first]
    prev_end = np.concatenate([[0], (t + api)[:-1]])
    gap = np.where(new_thr, 0, t - prev_end)
    shift_ms = np.zeros(n_thr, dtype=np.int64)
    end_ms = np.zeros(n_thr, dtype=np.int64)
    has = count > 0
    shift_ms[has] = shift[row_start[has]]
    last_row = row_start[has] + count[has] - 1
    end_ms[has] = (t + api - shift)[last_row]
    is_sub = np.asarray(lay.thread_is_sub, dtype=bool)
    n = rows.size
    table = RequestTable(
        input_tokens=arr.input_tokens[rows],
        output_tokens=arr.output_tokens[rows],
        t_s=(t - shift) / 1000,
        think_time_s=gap / 1000,
        api_time_s=api / 1000,
        ttft_s=np.full(n, np.nan),
        kind=Labels.constant("n", n),
        model=Labels(
            frozen(is_sub[thr], np.int32), (config.model, config.subagent_model)
        ),
        stop=Labels(frozen(last, np.int32), ("tool_use", "end_turn")),
        input_types=Labels(frozen(pos == 0, np.int32), (("tool_result",), ("text",))),
        output_types=Labels(frozen(last, np.int32), (("text", "tool_use"), ("text",))),
        blocks=arr.ids,
        ids_offset=arr.seg_offset[arr.seg[rows]],
        n_blocks=arr.input_tokens[rows] // config.block_size,
    )
    cum = np.cumsum(keep)
    before = np.where(arr.starts > 0, cum[np.maximum(arr.starts - 1, 0)], 0)
    kept_upto = cum - before[arr.thr]
    return _Kept(
        table=table,
        row_start=row_start,
        count=count,
        kept_upto=kept_upto,
        shift_ms=shift_ms,
        end_ms=end_ms,
    )


def _build(
    config: GeneratorConfig, lay: _Layout, arr: _Arrays, start_s: FloatArray | None
) -> Trace:
    kept = _kept(config, lay, arr)
    table = kept.table
    count = kept.count.tolist()
    row_start = kept.row_start.tolist()
    t_ms, api_ms = arr.t_ms, arr.api_ms
    scope = "global" if config.global_prefix else "local"
    groups_by_tree: dict[int, list[_Group]] = {}
    for g in lay.groups:
        groups_by_tree.setdefault(g.tree, []).append(g)
    sessions: list[Session] = []
    width = max(4, len(str(len(lay.tree_parent))))
    for tree, parent in enumerate(lay.tree_parent):
        sid = f"{config.name}-{tree:0{width}d}"
        if not count[parent]:
            continue  # every request was over the limit: the tree is dropped
        parent_shift = int(kept.shift_ms[parent])
        subagents: list[Subagent] = []
        for g in groups_by_tree.get(tree, []):
            spawn_i = int(arr.starts[parent]) + g.anchor
            spawn_ms = int(t_ms[spawn_i] + api_ms[spawn_i]) - parent_shift
            # Re-anchor on the last kept parent request at or before the original one.
            anchor = int(kept.kept_upto[spawn_i]) - 1
            join = anchor + 1 if anchor + 1 < count[parent] else None
            for th in g.threads:
                n = count[th]
                if not n:
                    continue
                agent_id = f"agent_{len(subagents) + 1:03d}"
                last = row_start[th] + n - 1
                subagents.append(
                    Subagent(
                        session=Session(
                            session_id=f"{sid}/{agent_id}",
                            requests=table.rows(row_start[th], row_start[th] + n),
                            block_size=config.block_size,
                            hash_id_scope="local",  # how the Weka reader sees them
                            models=(config.subagent_model,),
                            tool_tokens=config.subagent_tool_tokens,
                            system_tokens=config.subagent_system_tokens,
                        ),
                        anchor_index=anchor,
                        join_index=None if g.background else join,
                        agent_id=agent_id,
                        t_s=max(0, spawn_ms) / 1000,
                        subagent_type=g.subagent_type,
                        duration_ms=float(kept.end_ms[th]),
                        total_tokens=int(table.input_tokens[last])
                        + int(table.output_tokens[last]),
                        tool_use_count=n - 1,
                        status="completed",
                    )
                )
        sessions.append(
            Session(
                session_id=sid,
                requests=table.rows(
                    row_start[parent], row_start[parent] + count[parent]
                ),
                subagents=tuple(subagents),
                block_size=config.block_size,
                hash_id_scope=cast(Scope, scope),
                start_s=None if start_s is None else float(start_s[tree]),
                models=(config.model,),
                tool_tokens=config.tool_tokens,
                system_tokens=config.system_tokens,
            )
        )
    return Trace(sessions=tuple(sessions), source_format="native")


def _arrivals(config: GeneratorConfig, n: int, rng: np.random.Generator) -> FloatArray:
    assert config.session_rate_per_s is not None
    shape = config.arrival_shape
    gaps = rng.gamma(shape, 1.0 / (config.session_rate_per_s * shape), n)
    gaps[0] = 0.0  # the first session opens the timeline
    return np.rint(np.cumsum(gaps) * 1000) / 1000


def generate_trace(config: GeneratorConfig, *, sessions: int, seed: int) -> Trace:
    """A synthetic trace of ``sessions`` session trees drawn from ``config``.

    The same config, session count and seed always give the same trace.

    How a session tree is built (all per-request work is vectorized with numpy):

    * Size: the tree's request count (subagents included) is drawn from
      ``requests_per_session``; a ``subagent_session_fraction`` of the trees (exactly,
      by rounding) get ``subagent_groups_per_session`` groups of ``agents_per_group``
      subagents that run in parallel, each ``subagent_turns`` long. The parent keeps the
      rest of the tree's requests.
    * Context: a thread (the parent or one subagent) starts with its system/tools prefix
      plus a first message; each turn adds a tool result plus the previous output. When
      the context passes the thread's compaction threshold it is reset to a compacted
      context (the prefix plus a summary) and grows again. These latent lengths fix the
      *shape* of each session; the request-weighted marginal is then matched to
      ``input_tokens`` by a rank-preserving map (request i gets the quantile of its
      rank), so long corpora and tiny ones hit the target percentiles alike, and within
      a context segment input lengths never shrink. ``input_tokens=None`` keeps the
      latent lengths as they are.
    * Hash ids: a segment's blocks are [prefix ids, new ids...]; every request of the
      segment is a prefix of that buffer, so the next request's ids start with all full
      blocks of the previous one (Weka: ``len(hash_ids) == in // block_size``). The
      trace is one ``RequestTable`` whose block buffer holds each segment once (~6M
      blocks for the 347M-block agentx corpus); sessions hold rows of it. Prefix ids are
      shared by all trees with ``hash_id_scope="global"`` (``global_prefix``); with
      ``"local"`` every tree numbers its blocks from 1, as the Weka corpus does.
    * Time: ``t`` of the next request = ``t`` + ``api_time`` of the previous one +
      ``think_time`` of the next (ms resolution). A subagent spawns when its anchor
      request ends; the join request's ``think_time`` also covers the wait for its
      group, as in the Weka corpus. Arrivals (``start_t``) are written only with
      ``session_rate_per_s``.
    """
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1 (got {sessions})")
    rng = np.random.default_rng(seed)
    lay = _layout(config, sessions, rng)
    arr = _arrays(config, lay, rng)
    start = (
        None if config.session_rate_per_s is None else _arrivals(config, sessions, rng)
    )
    return _build(config, lay, arr, start)
