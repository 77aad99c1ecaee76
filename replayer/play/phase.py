"""The run's phases and stop state, below the session and the schedule: the warm-up,
the measured window, the duration deadline, an abort, and idle skipping.
See docs/replaying.md."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from replayer.clock import Clock
from replayer.config import Lanes, ReplayConfig


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
