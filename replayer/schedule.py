"""When session trees start: N lanes (a lane takes the next tree when its tree has
drained), seeded Poisson or gamma arrivals of trees, or each session at its trace
time. The duration limit is a deadline on the run's clock: past it nothing new starts,
and with ``drain="cancel"`` the trees still running are cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from replayer.clock import Clock
from replayer.config import Lanes, RateArrivals, ReplayConfig, TraceTimestamps
from replayer.session import RunContext, play_tree
from traces.model import Session, Trace


class _Start(Protocol):
    """Starts one tree (root, replay index, absolute start, start fraction) in the
    run's task group."""

    def __call__(
        self, root: Session, replay: int, at_abs: int, start_at: float | None = None
    ) -> asyncio.Task[None]: ...


@dataclass(slots=True)
class StopControl:
    """The run's stop: a clock deadline (``--duration``) and a flag (set at the
    deadline, or by a caller), and the warm-up phase before the measured window.
    Event-loop owned."""

    deadline_ns: int | None = None  # absolute; nothing starts at or after it
    stopping: bool = False
    # Absolute start of the measured window; None while the warm-up (primers, then
    # the cache-pressure warm-up) is still going on.
    measure_start_ns: int | None = None
    primers_pending: int = 0  # lanes whose first tree has not primed yet
    cache_warmup_ns: int = 0
    duration_ns: int | None = None  # the window's length, once it is open
    aborted: str | None = None  # why --on-error abort-run stopped the run
    error: str | None = None  # why the run stopped itself (the server went away)
    window_opened: asyncio.Event = field(default_factory=asyncio.Event)
    abort_event: asyncio.Event = field(default_factory=asyncio.Event)

    def past(self, abs_ns: int) -> bool:
        """Whether work due at ``abs_ns`` must not start."""
        return self.stopping or (
            self.deadline_ns is not None and abs_ns >= self.deadline_ns
        )

    def measuring(self, abs_ns: int) -> bool:
        """Whether ``abs_ns`` falls in the measured window (after the warm-up)."""
        return self.measure_start_ns is not None and abs_ns >= self.measure_start_ns

    def primed(self, now_ns: int) -> None:
        """One lane's first tree has primed its prefix (or had none to prime): the
        last one opens the cache-pressure warm-up, at whose end the window opens."""
        self.primers_pending -= 1
        if self.primers_pending <= 0 and self.measure_start_ns is None:
            self.open_window(now_ns + self.cache_warmup_ns)

    def open_window(self, start_ns: int) -> None:
        self.measure_start_ns = start_ns
        if self.duration_ns is not None:
            self.deadline_ns = start_ns + self.duration_ns
        self.window_opened.set()

    def abort(self, reason: str) -> None:
        """--on-error abort-run: nothing new starts; the schedule cancels the rest."""
        if self.aborted is None:
            self.aborted = reason
        self.stopping = True
        self.abort_event.set()

    def fail(self, reason: str) -> None:
        """The run cannot go on (the server stopped answering): stopped as by
        :meth:`abort`, with ``reason`` as the run's error."""
        if self.error is None:
            self.error = reason
        self.stopping = True
        self.abort_event.set()


@dataclass(slots=True)
class _Gap:
    deadline_ns: int
    wake: asyncio.Event


class IdleSkip:
    """Whole-system idle beyond ``max_idle_ns`` is skipped, not waited out: when
    every stream is waiting out a think gap (none is sending, building a prompt or
    starting), the gaps are shortened so that the earliest ends ``max_idle_ns``
    from now. Streams count themselves busy with :meth:`busy`/:meth:`idle`;
    event-loop owned."""

    def __init__(self, clock: Clock, max_idle_ns: int) -> None:
        self.clock = clock
        self.max_idle_ns = max_idle_ns
        self.working = 0  # streams not waiting (a new one counts from its spawn)
        self.skipped_ns = 0  # idle time skipped over the run
        self._gaps: list[_Gap] = []
        self._poke = asyncio.Event()
        self._idle_since: int | None = None  # when the last stream went idle

    def busy(self) -> None:
        self.working += 1
        self._idle_since = None

    def idle(self) -> None:
        self.working -= 1
        if self.working <= 0:
            self._idle_since = self.clock.now_ns()
            self._poke.set()

    async def sleep_until(self, deadline_ns: int, *, cap_ns: int | None = None) -> bool:
        """A think gap: like ``clock.sleep_until``, shortened when skipped. With
        ``cap_ns`` (the window's end) it waits no later than that: False when the
        gap, shortened or not, still ends after it."""
        gap = _Gap(deadline_ns, asyncio.Event())
        self._gaps.append(gap)
        self.idle()
        try:
            while True:
                end = (
                    gap.deadline_ns if cap_ns is None else min(gap.deadline_ns, cap_ns)
                )
                async with asyncio.TaskGroup() as tg:
                    sleep = tg.create_task(self.clock.sleep_until(end))
                    woken = tg.create_task(gap.wake.wait())
                    await asyncio.wait(
                        {sleep, woken}, return_when=asyncio.FIRST_COMPLETED
                    )
                    slept = sleep.done()
                    sleep.cancel()
                    woken.cancel()
                if slept:
                    return gap.deadline_ns <= end
                gap.wake.clear()
        finally:
            self._gaps.remove(gap)
            self.busy()

    async def run(self) -> None:
        """Watch for whole-system idle until cancelled."""
        clock = self.clock
        while True:
            await self._poke.wait()
            self._poke.clear()
            # Let a lane whose tree just drained start its next one first.
            await clock.sleep_until(clock.now_ns() + 1_000_000)
            idle_since = self._idle_since
            if self.working > 0 or idle_since is None or not self._gaps:
                continue
            earliest = min(g.deadline_ns for g in self._gaps)
            excess = earliest - idle_since - self.max_idle_ns
            if excess <= 0:
                continue
            self.skipped_ns += excess
            for g in self._gaps:
                g.deadline_ns -= excess
                g.wake.set()


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
    trees = _trees(trace, cfg.loop)
    schedule = cfg.schedule
    if isinstance(schedule, Lanes):
        ratio = cfg.start_ratio
        # Seeded per lane: the same seed gives the same start points.
        lo, hi = ratio or (0.0, 0.0)
        rng = np.random.default_rng([cfg.seed, ctx.worker_id])
        start_at = [float(x) for x in rng.uniform(lo, hi, size=schedule.concurrency)]

        async def lane(k: int) -> None:
            first: float | None = start_at[k] if ratio is not None else None
            # One event loop: taking the next tree needs no lock (no await between).
            while not stop.stopping:
                nxt = next(trees, None)
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


def stop_control(config: ReplayConfig, t0_ns: int) -> StopControl:
    """The run's stop and phases. Without a warm-up phase the window opens at
    ``t0`` and ``--duration`` counts from there; with one it opens once every lane
    has primed and the cache-pressure warm-up has run, and ``--duration`` counts
    from that moment."""
    duration = None if config.duration_s is None else int(config.duration_s * 1e9)
    stop = StopControl(
        duration_ns=duration,
        cache_warmup_ns=int(config.cache_warmup_s * 1e9),
    )
    schedule = config.schedule
    if config.start_ratio is not None and isinstance(schedule, Lanes):
        stop.primers_pending = schedule.concurrency
    else:
        stop.open_window(t0_ns + (stop.cache_warmup_ns if config.phased else 0))
    return stop
