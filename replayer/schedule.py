"""When session trees start: N lanes (a lane takes the next tree when its tree has
drained), seeded Poisson or gamma arrivals of trees, or each session at its trace
time. The duration limit is a deadline on the run's clock: past it nothing new starts,
and with ``drain="cancel"`` the trees still running are cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from replayer.config import Lanes, RateArrivals, TraceTimestamps
from replayer.session import RunContext, play_tree
from traces.model import Session, Trace

# Starts one tree (root, replay index, absolute start) in the run's task group.
_Start = Callable[[Session, int, int], "asyncio.Task[None]"]


@dataclass(slots=True)
class StopControl:
    """The run's stop: a clock deadline (``--duration``) and a flag (set at the
    deadline, or by a caller). Event-loop owned."""

    deadline_ns: int | None = None  # absolute; nothing starts at or after it
    stopping: bool = False

    def past(self, abs_ns: int) -> bool:
        """Whether work due at ``abs_ns`` must not start."""
        return self.stopping or (
            self.deadline_ns is not None and abs_ns >= self.deadline_ns
        )


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


async def run_schedule(ctx: RunContext, trace: Trace) -> None:
    """Start every tree of ``trace`` when due; return when all have drained."""
    trees: set[asyncio.Task[None]] = set()
    async with asyncio.TaskGroup() as tg:

        def start(root: Session, replay: int, at_abs: int) -> asyncio.Task[None]:
            task = tg.create_task(
                play_tree(ctx, root, replay=replay, start_abs_ns=at_abs),
                name=f"session-{root.session_id}#{replay}",
            )
            trees.add(task)
            task.add_done_callback(trees.discard)
            return task

        deadline = None
        if ctx.stop.deadline_ns is not None:
            deadline = tg.create_task(_at_deadline(ctx, trees), name="deadline")
        await _start_trees(ctx, trace, start)
        while trees:  # all started: wait for them to drain, then drop the deadline
            await asyncio.wait(set(trees))
        if deadline is not None:
            deadline.cancel()


async def _at_deadline(ctx: RunContext, trees: set[asyncio.Task[None]]) -> None:
    assert ctx.stop.deadline_ns is not None
    await ctx.clock.sleep_until(ctx.stop.deadline_ns)
    ctx.stop.stopping = True
    if ctx.config.drain == "cancel":
        for task in list(trees):
            task.cancel()


async def _start_trees(ctx: RunContext, trace: Trace, start: _Start) -> None:
    cfg = ctx.config
    clock = ctx.clock
    stop = ctx.stop
    trees = _trees(trace, cfg.loop)
    schedule = cfg.schedule
    if isinstance(schedule, Lanes):

        async def lane() -> None:
            # One event loop: taking the next tree needs no lock (no await between).
            while not stop.stopping:
                nxt = next(trees, None)
                if nxt is None or stop.past(clock.now_ns()):
                    return
                # A lane frees only when its whole tree (subagents too) drains.
                await start(nxt[0], nxt[1], clock.now_ns())

        async with asyncio.TaskGroup() as lanes:
            for k in range(schedule.concurrency):
                lanes.create_task(lane(), name=f"lane-{k}")
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
