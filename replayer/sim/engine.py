"""The HTTP simulator's engine loop: it runs the clock-free core's steps on the wall
clock, sleeping each step's modeled time, and wakes the request handlers. See
docs/engine-model.md."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from replayer.sim.cache import block_hashes
from replayer.sim.config import SimConfig
from replayer.sim.core import CoreRequest, Scheduler
from replayer.sim.metrics import EngineStats

# Modeled steps shorter than this are run back to back and slept as one (only
# reachable with a high --speed), so event-loop overhead does not become the GPU.
_COALESCE_S = 0.001
# A wake-up later than this behind the modeled time restarts the deadline chain at
# now instead of being made up (the host, not the modeled engine, stalled).
_CATCH_UP_S = 0.02


class EngineStopped(RuntimeError):
    """The engine loop ended while this sequence was still in flight."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One request as its handler sees it: tokens are visible once their step's time
    has passed. The handler awaits :meth:`wait_tokens`."""

    core: CoreRequest
    arrival_s: float
    generated: int = 0
    first_token_s: float | None = None
    finished: bool = False
    error: str | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prompt_tokens(self) -> int:
        return self.core.prompt_tokens

    @property
    def output_tokens(self) -> int:
        return self.core.output_tokens

    @property
    def cached_tokens(self) -> int:
        return max(0, self.core.cached_tokens)

    async def wait_tokens(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens exist or the sequence ends; the count.

        Raises:
            EngineStopped: the engine loop stopped before the sequence finished.
        """
        while self.generated <= seen and not self.finished:
            self.event.clear()
            await self.event.wait()
        if self.error is not None:
            raise EngineStopped(self.error)
        return self.generated


class Engine:
    """The core's scheduler on the wall clock, and the /metrics it feeds."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.core = Scheduler(config, self.stats)
        self.stats.num_gpu_blocks = self.core.pool.num_blocks
        self._wakeup = asyncio.Event()
        self._deadline_s = 0.0  # the modeled start of the next step
        self._incoming: deque[Sequence] = deque()  # submitted, not yet scheduled
        self._stopped = False

    def submit(self, prompt_ids: list[int], output_tokens: int) -> Sequence:
        """Queue a request; ``output_tokens`` >= 1 is the exact length to generate.

        Raises:
            EngineStopped: the engine loop has ended (nothing would serve the request).
        """
        if self._stopped:
            raise EngineStopped("the simulated engine stopped")
        core = CoreRequest(
            len(prompt_ids),
            output_tokens,
            block_hashes(prompt_ids, self.config.block_size),
        )
        seq = Sequence(core, time.perf_counter())
        core.handle = seq
        # Queued by its arrival: the step planned at a modeled start takes the
        # requests that came by then, however late the loop gets to it.
        self._incoming.append(seq)
        self._update_gauges()
        self._wakeup.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (no-op once finished)."""
        if seq.finished:
            return
        seq.finished = True
        if seq in self._incoming:
            self._incoming.remove(seq)
        else:
            self.core.abort(seq.core)
        self._update_gauges()
        self._wakeup.set()

    def reset_prefix_cache(self) -> int:
        return self.core.reset_prefix_cache()

    async def run(self) -> None:
        """The engine loop; runs until cancelled, then fails whatever is in flight."""
        core = self.core
        self._deadline_s = max(self._deadline_s, time.perf_counter())
        try:
            while True:
                self._admit(self._deadline_s)
                if core.idle:
                    if not self._incoming:
                        self._wakeup.clear()
                        await self._wakeup.wait()
                        continue
                    # As in virtual time: a step starts when the engine is free or,
                    # if it was idle, when the first request came (not when the loop
                    # woke); those that came after it join the next step.
                    self._deadline_s = max(
                        self._deadline_s, self._incoming[0].arrival_s
                    )
                    continue
                step_s = 0.0
                emitted: dict[Sequence, None] = {}
                while True:
                    if step_s:  # a coalesced step starts where the last ended
                        self._admit(self._deadline_s + step_s)
                    result = core.step()
                    if result is None:
                        break
                    step_s += result.duration_us / 1e6 / self.config.speed
                    self.stats.iteration_tokens.observe(
                        result.prefill_tokens + result.decode_seqs
                    )
                    for req in result.emitted:
                        emitted[req.handle] = None
                    if step_s >= _COALESCE_S or step_s == 0.0:
                        break
                await self._sleep(step_s)
                now = time.perf_counter()
                for seq in emitted:
                    self._deliver(seq, now)
                self._update_gauges()
        finally:
            self._stopped = True
            self._admit(float("inf"))
            for req in [*core.waiting, *core.running]:
                seq = req.handle
                core.abort(req)
                seq.finished = True
                seq.error = "the simulated engine stopped"
                seq.event.set()

    def _admit(self, start_s: float) -> None:
        """Hand the scheduler the requests that arrived by ``start_s``, the modeled
        start of the step about to be planned, in the order they came."""
        incoming = self._incoming
        while incoming and incoming[0].arrival_s <= start_s:
            self.core.add(incoming.popleft().core)

    async def _sleep(self, duration_s: float) -> None:
        # Steps are laid back to back on a deadline: neither Python overhead inside a
        # step nor the loop waking late stretches the modeled time (a late loop
        # catches up with shorter sleeps), as steps follow each other in virtual time.
        # Only a stall longer than _CATCH_UP_S (the host, not the modeled engine)
        # restarts the chain at now.
        if duration_s <= 0:
            await asyncio.sleep(0)  # let the handlers write what the last step made
            return
        now = time.perf_counter()
        if now - self._deadline_s > _CATCH_UP_S:
            self._deadline_s = now
        self._deadline_s += duration_s
        await asyncio.sleep(max(0.0, self._deadline_s - now))

    def _deliver(self, seq: Sequence, now: float) -> None:
        if seq.finished:  # aborted while the step ran
            return
        core = seq.core
        seq.generated = core.generated
        if seq.first_token_s is None:
            seq.first_token_s = now
            self.stats.ttft_s.observe(now - seq.arrival_s)
        if core.finished:
            seq.finished = True
            self.stats.e2e_s.observe(now - seq.arrival_s)
            if core.output_tokens > 1:
                tpot = (now - seq.first_token_s) / (core.output_tokens - 1)
                self.stats.tpot_s.observe(tpot)
        seq.event.set()

    def _update_gauges(self) -> None:
        stats, core = self.stats, self.core
        stats.running = len(core.running)
        stats.waiting = len(core.waiting) + len(self._incoming)
        stats.kv_cache_usage = core.pool.usage
        stats.host_used_tokens = len(core.pool.host) * core.block_size
