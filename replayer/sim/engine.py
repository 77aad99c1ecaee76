"""The simulated continuous-batching engine: one loop task that runs scheduler steps.

Each step admits waiting sequences (FIFO, capped by ``max_num_seqs`` and free KV
blocks), runs up to ``max_num_batched_tokens`` of chunked prefill plus one decode token
per running sequence, sleeps for the modeled step time, then hands every sequence its
new token. Request handlers only wait on their :class:`Sequence`; HTTP lives elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from replayer.sim.cache import Allocation, PrefixCache, block_hashes
from replayer.sim.config import SimConfig
from replayer.sim.metrics import EngineStats

# Modeled steps shorter than this are coalesced (only reachable with a high --speed).
_COALESCE_S = 0.001


class EngineStopped(RuntimeError):
    """The engine loop ended while this sequence was still in flight."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One request inside the engine; its handler awaits :meth:`wait_tokens`."""

    prompt_tokens: int
    output_tokens: int  # planned length: the engine stops exactly here
    hashes: list[int]
    arrival_s: float
    cached_tokens: int = 0  # GPU + host tier hits, known once admitted
    host_hit_tokens: int = 0
    computed_tokens: int = 0  # prompt tokens whose KV exists
    generated: int = 0
    first_token_s: float | None = None
    finished: bool = False
    error: str | None = None
    alloc: Allocation | None = None
    hits_charged: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)

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
    """Scheduler, KV-block accounting and step timing of the simulated server."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        bs = config.block_size
        self.cache = PrefixCache(
            gpu_capacity_blocks=config.kv_capacity_tokens // bs,
            host_capacity_blocks=config.host_capacity_tokens // bs,
        )
        self.stats = EngineStats()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._wakeup = asyncio.Event()
        self._deadline_s = 0.0
        self._stopped = False

    def submit(self, prompt_ids: list[int], output_tokens: int) -> Sequence:
        """Queue a request; ``output_tokens`` >= 1 is the exact length to generate.

        Raises:
            EngineStopped: the engine loop has ended (nothing would serve the request).
        """
        if self._stopped:
            raise EngineStopped("the simulated engine stopped")
        seq = Sequence(
            prompt_tokens=len(prompt_ids),
            output_tokens=output_tokens,
            hashes=block_hashes(prompt_ids, self.config.block_size),
            arrival_s=time.perf_counter(),
        )
        self._waiting.append(seq)
        self._update_gauges()
        self._wakeup.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (no-op once finished)."""
        if seq.finished:
            return
        seq.finished = True
        if seq.alloc is None:
            self._waiting.remove(seq)
        else:
            self.cache.release(seq.alloc)
            self._running.remove(seq)
        self._update_gauges()
        self._wakeup.set()

    async def run(self) -> None:
        """The engine loop; runs until cancelled, then fails whatever is in flight."""
        try:
            while True:
                if not self._running and not self._waiting:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                await self._step()
        finally:
            self._stopped = True
            for seq in [*self._waiting, *self._running]:
                seq.finished = True
                seq.error = "the simulated engine stopped"
                seq.event.set()
            self._waiting.clear()
            self._running.clear()

    async def _step(self) -> None:
        self._admit()
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        decoding = [s for s in self._running if s.computed_tokens == s.prompt_tokens]
        budget -= len(decoding)
        chunks: list[tuple[Sequence, int]] = []
        prefill = host = gpu = 0
        for seq in self._running:
            if budget <= 0:
                break
            if seq.computed_tokens < seq.prompt_tokens:
                n = min(budget, seq.prompt_tokens - seq.computed_tokens)
                chunks.append((seq, n))
                budget -= n
                prefill += n
                if not seq.hits_charged:
                    seq.hits_charged = True
                    host += seq.host_hit_tokens
                    gpu += seq.cached_tokens - seq.host_hit_tokens
        context = sum(s.prompt_tokens + s.generated for s in decoding)
        step_us = (
            1000.0 * (cfg.decode_base_ms + cfg.decode_per_seq_ms * len(decoding))
            + cfg.decode_us_per_context_token * context
            + cfg.prefill_us_per_token * prefill
            + cfg.host_hit_us_per_token * host
            + cfg.gpu_hit_us_per_token * gpu
        )
        step_s = step_us / 1e6 / cfg.speed
        steps = 1
        if not chunks and decoding and 0 < step_s < _COALESCE_S:
            # Very fast modeled steps (a high --speed): run several decode steps per
            # loop turn, so event-loop overhead does not become the simulated GPU.
            left = min(s.output_tokens - s.generated for s in decoding)
            steps = max(1, min(left, int(_COALESCE_S / step_s)))
        await self._sleep(step_s * steps)
        now = time.perf_counter()
        bs = cfg.block_size
        for seq, n in chunks:
            if seq.finished:  # aborted while the step ran
                continue
            seq.computed_tokens += n
            assert seq.alloc is not None
            self.cache.register(seq.alloc, seq.computed_tokens // bs)
            if seq.computed_tokens == seq.prompt_tokens:
                self._emit(seq, now)
        for seq in decoding:
            for _ in range(steps):
                if seq.finished:
                    break
                self._emit(seq, now)
        self._running = [s for s in self._running if not s.finished]
        self._update_gauges()

    async def _sleep(self, duration_s: float) -> None:
        # Steps are laid back to back on a deadline, so Python overhead inside a step
        # does not stretch the modeled time unless it exceeds it.
        if duration_s <= 0:
            await asyncio.sleep(0)  # let the handlers write what the last step made
            return
        now = time.perf_counter()
        self._deadline_s = max(self._deadline_s, now) + duration_s
        await asyncio.sleep(self._deadline_s - now)

    def _admit(self) -> None:
        cfg = self.config
        bs = cfg.block_size
        while self._waiting and len(self._running) < cfg.max_num_seqs:
            seq = self._waiting[0]
            total_blocks = -(-(seq.prompt_tokens + seq.output_tokens) // bs)
            # vLLM recomputes at least the last prompt token to get its logits.
            alloc = self.cache.allocate(
                seq.hashes,
                total_blocks - len(seq.hashes),
                max_hit_blocks=(seq.prompt_tokens - 1) // bs,
            )
            if alloc is None:
                break  # FIFO: the head waits for room, nobody overtakes it
            self._waiting.popleft()
            seq.alloc = alloc
            seq.cached_tokens = alloc.hit_blocks * bs
            seq.host_hit_tokens = alloc.host_hit_blocks * bs
            seq.computed_tokens = seq.cached_tokens
            self._running.append(seq)
            self.stats.prefix_cache_queries_tokens += seq.prompt_tokens
            self.stats.prefix_cache_hits_tokens += seq.cached_tokens
            self.stats.prompt_tokens += seq.prompt_tokens

    def _emit(self, seq: Sequence, now: float) -> None:
        seq.generated += 1
        self.stats.generation_tokens += 1
        if seq.first_token_s is None:
            seq.first_token_s = now
            self.stats.ttft_s.observe(now - seq.arrival_s)
        if seq.generated >= seq.output_tokens:
            seq.finished = True
            assert seq.alloc is not None
            self.cache.release(seq.alloc)
            self.stats.requests_success += 1
            self.stats.e2e_s.observe(now - seq.arrival_s)
            if seq.output_tokens > 1:
                tpot = (now - seq.first_token_s) / (seq.output_tokens - 1)
                self.stats.tpot_s.observe(tpot)
        seq.event.set()

    def _update_gauges(self) -> None:
        self.stats.running = len(self._running)
        self.stats.waiting = len(self._waiting)
        self.stats.kv_cache_usage = (
            self.cache.active_blocks / self.cache.gpu_capacity_blocks
        )
