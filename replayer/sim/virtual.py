"""The simulated engine on virtual time: the clock-free core stepped from one event to
the next, each step ending at its modeled nanosecond. The virtual-time loop drives it.
See docs/engine-model.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from replayer.sim.config import SimConfig
from replayer.sim.core import CoreRequest, Scheduler, StepResult


@dataclass(eq=False, slots=True)
class VirtualRequest:
    """A request's side of the virtual engine: when its tokens came (ns)."""

    core: CoreRequest
    submitted_ns: int
    token_times_ns: list[int] = field(default_factory=list)
    aborted: bool = False
    # Called when the request ends (the client's one wake-up; the token times
    # before it are in token_times_ns).
    on_event: Callable[[VirtualRequest], None] | None = None

    @property
    def finished(self) -> bool:
        return self.core.finished and not self.aborted


class VirtualEngine:
    """Steps the core on a virtual clock. A step is scheduled when it starts (arrivals
    before that join it) and its tokens appear when it ends; an arrival during a step
    waits for the next, as in a real engine."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.core = Scheduler(config)
        self.now_ns = 0  # the engine has seen time up to here
        self._free_at_ns = 0  # the end of the last step
        self._pending: StepResult | None = None
        self._pending_end_ns = 0
        self.steps = 0
        self.busy_ns = 0

    def submit(self, req: VirtualRequest, at_ns: int) -> None:
        self.now_ns = max(self.now_ns, at_ns)
        core = self.core
        idle = not core.running and not core.waiting
        core.add(req.core)
        if idle and self._pending is None and self._free_at_ns <= self.now_ns:
            # An idle engine starts a step on the first arrival, as on the wall
            # clock: requests sent "at the same time" reach a real server one by
            # one, and the later ones join the next step.
            self._plan(self.now_ns)

    def abort(self, req: VirtualRequest, at_ns: int) -> None:
        self.now_ns = max(self.now_ns, at_ns)
        req.aborted = True
        self.core.abort(req.core)

    def advance(self, limit_ns: int | None) -> int | None:
        """Run steps up to ``limit_ns`` (None: no limit) until one ends a request;
        that step's end, or None."""
        core = self.core
        while True:
            if self._pending is None:
                if not core.running and not core.waiting:
                    return None
                start = max(self._free_at_ns, self.now_ns)
                if limit_ns is not None and start > limit_ns:
                    return None
                if self._decode_run(start, limit_ns):
                    continue
                self._plan(start)
            end = self._pending_end_ns
            if limit_ns is not None and end > limit_ns:
                return None
            result = self._pending
            assert result is not None
            self._pending = None
            self._free_at_ns = end
            self.now_ns = max(self.now_ns, end)
            visible = False
            for creq in result.emitted:
                req: VirtualRequest = creq.handle
                if req.aborted:
                    continue
                req.token_times_ns.append(end)
                if creq.finished and req.on_event is not None:
                    req.on_event(req)
                    visible = True
            if visible:
                # A busy engine schedules its next step the moment the last one ends,
                # before any client hears of it: what a client sends in reply joins
                # the step after (as on the wall clock, where the reply comes later).
                if core.running or core.waiting:
                    self._plan(end)
                return end

    def _decode_run(self, start: int, limit_ns: int | None) -> bool:
        """Run at once the coming pure decode steps that end by ``limit_ns`` and
        finish no request (the same steps, times and tokens as one by one); False
        when there are fewer than two."""
        k = self.core.decode_run()
        if k < 2:
            return False
        core = self.core
        seqs = len(core.running)
        context = sum(req.num_tokens for req in core.running)
        # Each step reads one more token per sequence; its time in whole ns as _ns.
        contexts = context + seqs * np.arange(k, dtype=np.int64)
        durations = np.rint(
            core.decode_durations_us(seqs, contexts) * 1000 / self.config.speed
        )
        at_ends = start + np.cumsum(np.maximum(durations, 1).astype(np.int64))
        n = k if limit_ns is None else int(np.searchsorted(at_ends, limit_ns, "right"))
        if n < 2:
            return False
        ends: list[int] = at_ends[:n].tolist()
        end = ends[-1]
        running = list(core.running)
        if not core.decode_steps(len(ends)):
            return False
        for creq in running:
            creq.handle.token_times_ns.extend(ends)
        self.steps += len(ends)
        self.busy_ns += end - start
        self._free_at_ns = end
        self.now_ns = max(self.now_ns, end)
        return True

    def _plan(self, start: int) -> None:
        result = self.core.step()
        assert result is not None
        # --speed divides every modeled delay, as the live simulator's engine does.
        duration = _ns(result.duration_us / self.config.speed)
        self._pending = result
        self._pending_end_ns = start + duration
        self.steps += 1
        self.busy_ns += duration


def _ns(duration_us: float) -> int:
    """A step's modeled time in whole nanoseconds (at least one: time moves)."""
    return max(1, round(duration_us * 1000))
