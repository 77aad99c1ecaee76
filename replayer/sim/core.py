"""The simulated engine's clock-free core: vLLM v1's scheduler over the block pool, and
the step-time model. The HTTP simulator and the virtual-time loop both drive it. See
docs/engine-model.md."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from replayer.sim.cache import BlockPool, Ids, as_ids
from replayer.sim.config import SimConfig

WAITING, RUNNING, FINISHED = 0, 1, 2
_NO_BLOCKS: Ids = np.zeros(0, np.int64)


@dataclass(eq=False, slots=True)
class CoreRequest:
    """One request inside the core. ``generated`` counts output tokens so far;
    ``computed`` is vLLM's ``num_computed_tokens`` (tokens whose KV exists)."""

    prompt_tokens: int
    output_tokens: int  # planned length: the engine stops exactly here
    hashes: Sequence[int] | Ids  # chained hashes of the prompt's full blocks
    handle: Any = None  # the driver's own object for this request
    computed: int = 0
    generated: int = 0
    cached_tokens: int = -1  # GPU + host hits at the first admission (usage field)
    host_hit_tokens: int = 0
    preemptions: int = 0
    state: int = WAITING
    # The block ids held, in prompt order: the first ``num_blocks`` of ``blocks``
    # (room for the whole request, so growing is a write, not a copy).
    blocks: Ids = field(default_factory=lambda: _NO_BLOCKS)
    num_blocks: int = 0
    cached_blocks: int = 0  # leading blocks already hittable
    admitted: bool = False
    # The last prefix lookup while waiting, and the pool version it was made at.
    lookup: tuple[Ids, list[int]] | None = None
    lookup_version: int = -1
    hash_ids: Ids = field(init=False)  # ``hashes`` as an array

    def __post_init__(self) -> None:
        self.hash_ids = as_ids(self.hashes)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def held(self) -> Ids:
        """The ids of the blocks held, in prompt order."""
        return self.blocks[: self.num_blocks]

    def hold(self, blocks: Ids) -> None:
        """Append ``blocks`` to the ones held."""
        n, end = self.num_blocks, self.num_blocks + len(blocks)
        if end > len(self.blocks):
            grown = np.empty(max(end, 2 * len(self.blocks)), np.int64)
            grown[:n] = self.blocks[:n]
            self.blocks = grown
        self.blocks[n:end] = blocks
        self.num_blocks = end

    def drop_blocks(self) -> Ids:
        """Forget the blocks held; their ids."""
        held = self.held()
        self.blocks, self.num_blocks = _NO_BLOCKS, 0
        return held


@dataclass(slots=True)
class CoreStats:
    """Counters as vLLM's /metrics counts them."""

    prefix_cache_queries_tokens: int = 0
    prefix_cache_hits_tokens: int = 0
    host_hits_tokens: int = 0  # of prefix_cache_hits_tokens, loaded from the host
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_success: int = 0
    preemptions: int = 0


@dataclass(slots=True)
class StepResult:
    """One step: how long it takes, and which requests got a token (in order).
    The core's state is already that of the step's end."""

    duration_us: float
    emitted: list[CoreRequest]
    prefill_tokens: int = 0
    decode_seqs: int = 0


class Scheduler:
    """Running requests first (a decode token each, or their next prefill chunk),
    then admission of waiting ones in arrival order, within the step's token budget
    and ``max_num_seqs``; the newest running request is preempted when blocks run out
    (policy ``vllm``). Policy ``reserve`` reserves each request's whole output at
    admission instead, and never preempts."""

    def __init__(self, config: SimConfig, stats: CoreStats | None = None) -> None:
        self.config = config
        bs = config.block_size
        self.block_size = bs
        self.pool = BlockPool(
            config.kv_capacity_tokens // bs, config.host_capacity_tokens // bs
        )
        self._host_us = config.host_load_us_per_token
        self.reserve = config.policy == "reserve"
        # vLLM admits a waiting request only when its whole prompt fits
        # (scheduler_reserve_full_isl), not just the first chunk it computes.
        self.full_prompt = config.policy == "vllm"
        self.waiting: deque[CoreRequest] = deque()
        self.running: list[CoreRequest] = []
        # The counters go where the caller wants them (the live engine's /metrics).
        self.stats = stats if stats is not None else CoreStats()

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def add(self, req: CoreRequest) -> None:
        self.waiting.append(req)

    def abort(self, req: CoreRequest) -> None:
        """Drop a request whose client went away (no-op once finished)."""
        if req.state == FINISHED:
            return
        if req.state == WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
            self.pool.release(req.drop_blocks())
        req.state = FINISHED

    def step(self) -> StepResult | None:
        """Schedule and run one step; None when there is nothing to run."""
        if not self.running and not self.waiting:
            return None
        cfg = self.config
        bs = self.block_size
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[CoreRequest, int]] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.computed, budget)
            victim: CoreRequest | None = None
            while not self._grow(req, req.computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if victim is req:
                break
            self._cache_full_blocks(req, bs, req.computed + n)
            scheduled.append((req, n))
            budget -= n
            i += 1
        gpu_hit = host_hit = new = 0
        if not preempted:
            waiting = self.waiting
            limit = cfg.max_num_seqs
            while waiting and budget > 0 and len(running) < limit:
                req = waiting[0]
                hit = self._admit(req, budget)
                if hit is None:
                    break  # the head waits for room; nobody overtakes it
                waiting.popleft()
                gpu, host = hit
                gpu_hit += gpu
                host_hit += host
                if not req.admitted:
                    req.admitted = True
                    new += 1
                n = min(req.num_tokens - req.computed, budget)
                # Cached as they are scheduled, as vLLM's allocate_slots does: a
                # request admitted next in this very step already hits them.
                self._cache_full_blocks(req, bs, req.computed + n)
                scheduled.append((req, n))
                budget -= n
        prefill = decode = context = 0
        emitted: list[CoreRequest] = []
        stats = self.stats
        done = False
        for req, n in scheduled:
            if req.generated and n == 1 and req.computed == req.num_tokens - 1:
                decode += 1
                context += req.num_tokens
            else:
                prefill += n
            req.computed += n
            if req.computed >= req.num_tokens:
                req.generated += 1
                stats.generation_tokens += 1
                emitted.append(req)
                if req.generated >= req.output_tokens:
                    self._finish(req)
                    done = True
        if done:
            self.running = [r for r in self.running if r.state != FINISHED]
        duration_us = self.step_duration_us(
            decode, context, prefill, gpu_hit, host_hit, new
        )
        return StepResult(duration_us, emitted, prefill, decode)

    def step_duration_us(
        self,
        decode: int,
        context: int,
        prefill: int = 0,
        gpu_hit: int = 0,
        host_hit: int = 0,
        new: int = 0,
    ) -> float:
        """The step-time model: a step with ``decode`` decoding sequences reading
        ``context`` KV tokens, ``prefill`` prompt tokens computed, hits loaded from
        either tier and ``new`` requests scheduled for the first time."""
        duration: float = self._step_us(
            decode, context, prefill, gpu_hit, host_hit, new
        )
        return duration

    def decode_durations_us(
        self, decode: int, contexts: Ids
    ) -> npt.NDArray[np.float64]:
        """:meth:`step_duration_us` of pure decode steps, one per context total
        (the same formula, on an array: the same floats)."""
        durations: npt.NDArray[np.float64] = self._step_us(decode, contexts)
        return durations

    def _step_us(
        self,
        decode: int,
        context: Any,
        prefill: int = 0,
        gpu_hit: int = 0,
        host_hit: int = 0,
        new: int = 0,
    ) -> Any:
        cfg = self.config
        return (
            1000.0 * (cfg.decode_base_ms + cfg.decode_per_seq_ms * decode)
            + cfg.decode_us_per_context_token * context
            + cfg.prefill_us_per_token * prefill
            + cfg.gpu_hit_us_per_token * gpu_hit
            + self._host_us * host_hit
            + cfg.request_overhead_us * new
        )

    def decode_run(self) -> int:
        """How many steps from now are pure decode steps that finish no request:
        nothing waits, every running request decodes one token a step. 0 when the
        next step is anything else. Those steps are what :meth:`decode_steps` runs
        at once (a driver's shortcut; :meth:`step` gives the same)."""
        running = self.running
        if self.waiting or not running:
            return 0
        if len(running) > self.config.max_num_batched_tokens:
            return 0
        left = 1 << 62
        for req in running:
            if not req.generated or req.computed != req.num_tokens - 1:
                return 0
            left = min(left, req.output_tokens - req.generated)
        return left - 1  # the finishing step goes through step()

    def decode_steps(self, k: int) -> bool:
        """Run ``k`` <= :meth:`decode_run` pure decode steps at once. False, with
        nothing done, when the pool cannot grow every sequence for ``k`` steps (the
        steps may preempt: use :meth:`step`).

        The blocks the steps take come off the free queue's head in the order
        step() takes them, so evictions (and the host tier) are the same; which
        fresh block goes to which request differs, and nothing observes it."""
        bs = self.block_size
        running = self.running
        need = [
            max(0, -(-(req.computed + k) // bs) - req.num_blocks) for req in running
        ]
        total = sum(need)
        if total > self.pool.num_free:
            return False
        if total:
            fresh = self.pool.take_ids(total)
            at = 0
            for req, n in zip(running, need, strict=True):
                if n:
                    req.hold(fresh[at : at + n])
                    at += n
        for req in running:
            req.computed += k
            req.generated += k
        self.stats.generation_tokens += k * len(running)
        return True

    def reset_prefix_cache(self) -> int:
        return self.pool.reset()

    # -- internals -------------------------------------------------------------

    def _grow(self, req: CoreRequest, tokens: int) -> bool:
        """Hold blocks for ``tokens`` tokens of ``req``; False if the pool is short."""
        need = -(-tokens // self.block_size) - req.num_blocks
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.hold(self.pool.take_ids(need))
        return True

    def _admit(self, req: CoreRequest, budget: int) -> tuple[int, int] | None:
        """Take the request's prefix hits and the blocks of its first chunk (its whole
        output too under ``reserve``); (GPU, host) hit tokens, or None if no room
        (under ``vllm``: room for its whole prompt, though only the chunk is taken)."""
        bs = self.block_size
        pool = self.pool
        # vLLM recomputes at least the last token, to get its logits.
        # A head that waits for room is looked up again only once the cache changed.
        if req.lookup is None or req.lookup_version != pool.version:
            req.lookup = pool.lookup_ids(req.hash_ids, (req.num_tokens - 1) // bs)
            req.lookup_version = pool.version
        gpu, host = req.lookup
        hit_blocks = len(gpu) + len(host)
        computed = hit_blocks * bs
        n = min(req.num_tokens - computed, budget)
        upto = req.prompt_tokens + req.output_tokens if self.reserve else computed + n
        need = -(-upto // bs) - len(gpu)
        gate = need
        if self.full_prompt:
            gate = max(need, -(-req.num_tokens // bs) - len(gpu))
        free = pool.num_free
        # Hits nobody holds sit in the free queue: they are not room for the rest.
        if gate > free or (
            gate > free - len(gpu) and gate > free - pool.count_unheld(gpu)
        ):
            return None
        req.lookup = None
        pool.touch(gpu)
        fresh = pool.take_ids(need)
        if host:
            pool.load_from_host(host, fresh[: len(host)])
        # Room for every block the request can come to hold.
        req.blocks = np.empty(
            max(len(gpu) + need, -(-(req.prompt_tokens + req.output_tokens) // bs)),
            np.int64,
        )
        req.num_blocks = 0
        req.hold(gpu)
        req.hold(fresh)
        req.cached_blocks = hit_blocks
        req.computed = computed
        req.state = RUNNING
        self.running.append(req)
        if req.cached_tokens < 0:
            # vLLM reports (and counts) the hits of the first scheduling only.
            req.cached_tokens = computed
            req.host_hit_tokens = len(host) * bs
            stats = self.stats
            stats.prefix_cache_queries_tokens += req.num_tokens
            stats.prefix_cache_hits_tokens += computed
            stats.host_hits_tokens += req.host_hit_tokens
            stats.prompt_tokens += req.prompt_tokens
        return len(gpu) * bs, len(host) * bs

    def _cache_full_blocks(self, req: CoreRequest, bs: int, upto: int) -> None:
        """Make the prompt's full blocks among the first ``upto`` tokens hittable."""
        full = min(upto, req.prompt_tokens) // bs
        if full > req.cached_blocks:
            start, end = req.cached_blocks, min(full, len(req.hash_ids))
            if end > start:
                self.pool.cache_run(req.blocks[:end], req.hash_ids[:end], start)
            req.cached_blocks = full

    def _preempt(self, req: CoreRequest) -> None:
        self.pool.release(req.drop_blocks())
        req.computed = 0
        req.cached_blocks = 0
        req.state = WAITING
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: CoreRequest) -> None:
        req.state = FINISHED
        self.pool.release(req.drop_blocks())
        self.stats.requests_success += 1
