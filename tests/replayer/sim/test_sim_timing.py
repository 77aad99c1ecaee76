"""The simulator's timing model: TTFT follows uncached prompt tokens, TPOT follows
batch size, max_num_seqs queues. Upper bounds are on the time the engine models
(its step times), which load cannot stretch; what the client measures is checked
from below only: never earlier than modelled."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from replayer.sim import SimConfig
from tests.replayer.sim.conftest import StartSim

T = TypeVar("T")


async def _modelled(steps: list[float], request: Awaitable[T]) -> tuple[T, float]:
    """``request``'s result and the engine time modelled while it ran."""
    before = len(steps)
    result = await request
    return result, sum(steps[before:])


async def test_timing_ttft_grows_with_uncached_tokens(
    start_sim: StartSim, modelled_steps: list[float]
) -> None:
    config = SimConfig.fast(
        prefill_us_per_token=50.0, decode_base_ms=1.0, block_size=16
    )
    async with start_sim(config) as sim:
        steps = modelled_steps
        short, short_s = await _modelled(steps, sim.completion(list(range(1000, 1200))))
        cold, cold_s = await _modelled(steps, sim.completion(list(range(2000, 6000))))
        warm, warm_s = await _modelled(steps, sim.completion(list(range(2000, 6000))))
    assert warm.cached_tokens == 3984
    assert short_s == pytest.approx(0.001 + 200 * 50e-6)  # ~10 ms of prefill
    assert cold_s == pytest.approx(0.001 + 4000 * 50e-6)  # ~200 ms
    assert warm_s < cold_s / 2
    for result, modelled in ((short, short_s), (cold, cold_s), (warm, warm_s)):
        assert result.ttft_s >= modelled
    assert cold.ttft_s > 0.15


async def test_timing_host_hit_is_cheaper_than_recompute(
    start_sim: StartSim, modelled_steps: list[float]
) -> None:
    config = SimConfig.fast(
        prefill_us_per_token=100.0,
        host_hit_us_per_token=5.0,
        block_size=16,
        kv_capacity_tokens=4096,
        max_model_len=3000,
        host_capacity_tokens=8192,
    )
    async with start_sim(config) as sim:
        a = list(range(1000, 3000))
        cold, cold_s = await _modelled(modelled_steps, sim.completion(a))  # ~200 ms
        await sim.completion(list(range(5000, 7000)))
        await sim.completion(list(range(8000, 10000)))  # pushes A to the host tier
        again, again_s = await _modelled(modelled_steps, sim.completion(a))
    assert again.cached_tokens == 1984
    assert again_s < cold_s / 2
    assert cold.ttft_s >= cold_s > 0.15
    assert again.ttft_s >= again_s


async def test_timing_tpot_grows_with_batch_size(
    start_sim: StartSim, modelled_steps: list[float]
) -> None:
    config = SimConfig.fast(decode_base_ms=2.0, decode_per_seq_ms=1.0)
    body = {"max_tokens": 30, "ignore_eos": True}
    async with start_sim(config) as sim:
        before = len(modelled_steps)
        alone = await sim.completion([1000] * 16, **body)  # ~3 ms per token
        alone_steps = modelled_steps[before:]
        before = len(modelled_steps)
        batch = await asyncio.gather(
            *(sim.completion([1000 + i] * 16, **body) for i in range(16))
        )  # ~18 ms per token
        batch_steps = modelled_steps[before:]
    # Alone: a 2 ms prefill step, then 29 decode steps of 2 + 1 ms.
    alone_tpot = sum(alone_steps[1:]) / (len(alone.chunks) - 1)
    assert alone_tpot == pytest.approx(0.003)
    assert max(batch_steps) == pytest.approx(0.018)  # all 16 decoding at once
    measured = statistics.median(r.tpot_s for r in batch)
    assert measured > 2 * alone_tpot
    assert measured > 0.01


async def test_timing_max_num_seqs_queues_fifo(start_sim: StartSim) -> None:
    config = SimConfig.fast(decode_base_ms=2.0, max_num_seqs=1)
    body = {"max_tokens": 20, "ignore_eos": True}
    async with start_sim(config) as sim:
        first, second = await asyncio.gather(
            sim.completion([1000] * 16, **body), sim.completion([2000] * 16, **body)
        )
    # The second request starts only when the first is done (20 steps of ~2 ms).
    assert second.chunk_times_s[0] >= first.chunk_times_s[-1]
    assert second.ttft_s > 0.03


async def test_timing_speed_divides_delays(
    start_sim: StartSim, modelled_steps: list[float]
) -> None:
    slow = SimConfig.fast(prefill_us_per_token=100.0)
    fast = SimConfig.fast(prefill_us_per_token=100.0, speed=20.0)
    prompt = list(range(1000, 4000))  # 300 ms at speed 1, 15 ms at speed 20
    async with start_sim(slow) as sim:
        at_one, one_s = await _modelled(modelled_steps, sim.completion(prompt))
    async with start_sim(fast) as sim:
        at_twenty, twenty_s = await _modelled(modelled_steps, sim.completion(prompt))
    assert one_s == pytest.approx(0.3)
    assert twenty_s == pytest.approx(one_s / 20)
    assert at_one.ttft_s >= one_s
    assert at_twenty.ttft_s >= twenty_s
