"""When session trees start: lanes, seeded Poisson or gamma arrivals of trees, or each
session at its trace time, until the duration's deadline.
See docs/replaying.md#when-sessions-start."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from replayer.config import Lanes, RateArrivals, ReplayConfig, TraceTimestamps
from replayer.play.session import RunContext, play_tree, start_index
from traces.model import Session, Trace


class _Start(Protocol):
    """Starts one tree (root, replay index, absolute start, start fraction) in the
    run's task group."""

    def __call__(
        self, root: Session, replay: int, at_abs: int, start_at: float | None = None
    ) -> asyncio.Task[None]: ...


def shard(trace: Trace, worker_id: int, workers: int) -> Trace:
    """Worker ``worker_id``'s share of the session trees (round-robin)."""
    if workers <= 1:
        return trace
    mine = tuple(s for i, s in enumerate(trace.sessions) if i % workers == worker_id)
    return Trace(sessions=mine, source_format=trace.source_format)


def _trees(trace: Trace, loop: bool) -> Iterator[tuple[Session, int]]:
    """Session trees in trace order, looping (with a new replay index) if asked."""
    for replay in itertools.count() if loop else (0,):
        for s in trace.sessions:
            yield s, replay


class _Trees:
    """The trees still to start, in order; the next one's first prompt is built
    ahead (``PromptBuilder.prefetch``) as each is taken, so a tree starting at once
    (a freed lane, an arrival) does not wait for it."""

    def __init__(self, ctx: RunContext, trace: Trace, mid_start: int = 0) -> None:
        self._ctx = ctx
        self._it = _trees(trace, ctx.config.loop)
        self._next = next(self._it, None)
        # The first trees that start mid-session (start_ratio): their first request
        # is not the one sent (first_prompts builds theirs).
        self._mid_start = mid_start
        self._taken = 0

    def take(self) -> tuple[Session, int] | None:
        got, self._next = self._next, next(self._it, None)
        self._taken += 1
        nxt = self._next
        if (
            nxt is not None
            and self._taken >= self._mid_start
            and not self._ctx.config.live_assistant
        ):
            root, replay = nxt
            self._ctx.prompts.prefetch(root, 0, root.hash_namespace(), replay)
        return got

    def __iter__(self) -> Iterator[tuple[Session, int]]:
        while (got := self.take()) is not None:
            yield got


def _lane_start_points(cfg: ReplayConfig, worker_id: int, lanes: int) -> list[float]:
    """Each lane's start fraction into its first tree (``start_ratio``), seeded per
    lane: the same seed gives the same start points."""
    lo, hi = cfg.start_ratio or (0.0, 0.0)
    rng = np.random.default_rng([cfg.seed, worker_id])
    return [float(x) for x in rng.uniform(lo, hi, size=lanes)]


def first_prompts(
    trace: Trace, cfg: ReplayConfig, worker_id: int
) -> list[tuple[Session, int, str, int]]:
    """The prompts sent the moment the run starts (session, request index, namespace,
    replay): each lane's first request (its primer when the lane starts mid-tree),
    built before the clock starts. None for arrival schedules: their trees come one
    at a time, each built ahead of the next."""
    schedule = cfg.schedule
    if not isinstance(schedule, Lanes) or cfg.live_assistant:
        return []
    starts = _lane_start_points(cfg, worker_id, schedule.concurrency)
    out = []
    trees = _trees(trace, cfg.loop)
    for k, (root, replay) in zip(range(schedule.concurrency), trees, strict=False):
        i = 0
        if cfg.start_ratio is not None:
            i = max(0, start_index(root, starts[k]) - 1)
        out.append((root, i, root.hash_namespace(), replay))
    return out


async def run_schedule(ctx: RunContext, trace: Trace) -> None:
    """Start every tree of ``trace`` when due; return when all have drained.

    When session trees start: N lanes (a lane takes the next tree when its tree has
    drained), seeded Poisson or gamma arrivals of trees, or each session at its trace
    time. The duration limit is a deadline on the run's clock: past it nothing new
    starts, and with ``drain="cancel"`` the trees still running are cancelled.
    """
    trees: set[asyncio.Task[None]] = set()
    idle = ctx.idle
    async with asyncio.TaskGroup() as tg:

        def start(
            root: Session, replay: int, at_abs: int, start_at: float | None = None
        ) -> asyncio.Task[None]:
            if idle is not None:
                idle.busy()  # from now: the tree's root stream counts as working
            task = tg.create_task(
                play_tree(
                    ctx, root, replay=replay, start_abs_ns=at_abs, start_at=start_at
                ),
                name=f"session-{root.session_id}#{replay}",
            )
            trees.add(task)
            task.add_done_callback(trees.discard)
            return task

        side = []
        if ctx.stop.deadline_ns is not None or ctx.stop.duration_ns is not None:
            side.append(tg.create_task(_at_deadline(ctx, trees), name="deadline"))
        if idle is not None:
            side.append(tg.create_task(idle.run(), name="idle-skip"))
        side.append(tg.create_task(_on_abort(ctx, trees), name="abort"))
        await _start_trees(ctx, trace, start)
        while trees:  # all started: wait for them to drain, then drop the deadline
            await asyncio.wait(set(trees))
        for task in side:
            task.cancel()


async def _at_deadline(ctx: RunContext, trees: set[asyncio.Task[None]]) -> None:
    stop = ctx.stop
    while stop.deadline_ns is None:  # the window opens after the warm-up
        await stop.window_opened.wait()
    await ctx.clock.sleep_until(stop.deadline_ns)
    stop.stopping = True
    if ctx.config.drain == "cancel":
        for task in list(trees):
            task.cancel()


async def _on_abort(ctx: RunContext, trees: set[asyncio.Task[None]]) -> None:
    """An abort (--on-error abort-run's first failure, a server gone) cancels
    every tree."""
    await ctx.stop.abort_event.wait()
    for task in list(trees):
        task.cancel()


async def _start_trees(ctx: RunContext, trace: Trace, start: _Start) -> None:
    cfg = ctx.config
    clock = ctx.clock
    stop = ctx.stop
    schedule = cfg.schedule
    mid = schedule.concurrency if isinstance(schedule, Lanes) and cfg.start_ratio else 0
    trees = _Trees(ctx, trace, mid)
    if isinstance(schedule, Lanes):
        ratio = cfg.start_ratio
        start_at = _lane_start_points(cfg, ctx.worker_id, schedule.concurrency)

        async def lane(k: int) -> None:
            first: float | None = start_at[k] if ratio is not None else None
            # One event loop: taking the next tree needs no lock (no await between).
            while not stop.stopping:
                nxt = trees.take()
                if nxt is None or stop.past(clock.now_ns()):
                    break
                # A lane frees only when its whole tree (subagents too) drains.
                await start(nxt[0], nxt[1], clock.now_ns(), first)
                first = None  # recycled trees start at their first turn
            if first is not None:  # never started a tree: nothing to prime
                stop.primed(clock.now_ns())

        async with asyncio.TaskGroup() as lanes:
            for k in range(schedule.concurrency):
                lanes.create_task(lane(k), name=f"lane-{k}")
        return
    if isinstance(schedule, RateArrivals):
        rng = np.random.default_rng(cfg.seed)
        rate = schedule.session_rate
        offset_s = 0.0
        for root, replay in trees:
            at = ctx.t0_ns + int(offset_s * 1e9)
            if stop.past(at):
                return
            await clock.sleep_until(at)
            start(root, replay, at)
            if schedule.arrival == "gamma":
                # vLLM's convention: shape = burstiness, mean gap = 1 / rate.
                b = schedule.burstiness
                gap = rng.gamma(b, 1.0 / (rate * b))
            else:
                gap = rng.exponential(1.0 / rate)
            offset_s += float(gap)
        return
    assert isinstance(schedule, TraceTimestamps)
    starts = [s.start_s or 0.0 for s in trace.sessions]
    base = min(starts) if starts else 0.0
    loop_len = (max(starts) - base) if starts else 0.0
    for root, replay in trees:
        trace_s = (root.start_s or 0.0) - base + replay * (loop_len + 1.0)
        at = ctx.t0_ns + int(trace_s / schedule.speedup * 1e9)
        if stop.past(at):
            return
        await clock.sleep_until(at)
        start(root, replay, at)
