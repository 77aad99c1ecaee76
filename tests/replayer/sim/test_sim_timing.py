"""The simulator's timing model, measured from the client: TTFT follows uncached
prompt tokens, TPOT follows batch size, max_num_seqs queues. Bounds are generous: the
machine is small and noisy."""

from __future__ import annotations

import asyncio
import statistics

from replayer.sim import SimConfig


async def test_timing_ttft_grows_with_uncached_tokens(start_sim) -> None:
    config = SimConfig.fast(
        prefill_us_per_token=50.0, decode_base_ms=1.0, block_size=16
    )
    async with start_sim(config) as sim:
        short = await sim.completion(list(range(1000, 1200)))  # ~10 ms of prefill
        long_cold = await sim.completion(list(range(2000, 6000)))  # ~200 ms
        long_warm = await sim.completion(list(range(2000, 6000)))
    assert long_warm.cached_tokens == 3984
    assert long_cold.ttft_s > short.ttft_s + 0.1
    assert long_cold.ttft_s > 0.15
    assert long_warm.ttft_s < long_cold.ttft_s / 2


async def test_timing_host_hit_is_cheaper_than_recompute(start_sim) -> None:
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
        cold = await sim.completion(a)  # ~200 ms
        await sim.completion(list(range(5000, 7000)))
        await sim.completion(list(range(8000, 10000)))  # pushes A to the host tier
        again = await sim.completion(a)
    assert again.cached_tokens == 1984
    assert again.ttft_s < cold.ttft_s / 2


async def test_timing_tpot_grows_with_batch_size(start_sim) -> None:
    config = SimConfig.fast(decode_base_ms=2.0, decode_per_seq_ms=1.0)
    body = {"max_tokens": 30, "ignore_eos": True}
    async with start_sim(config) as sim:
        alone = await sim.completion([1000] * 16, **body)  # ~3 ms per token
        batch = await asyncio.gather(
            *(sim.completion([1000 + i] * 16, **body) for i in range(16))
        )  # ~18 ms per token
    batch_tpot = statistics.median(r.tpot_s for r in batch)
    assert alone.tpot_s < 0.012
    assert batch_tpot > 2 * alone.tpot_s
    assert batch_tpot > 0.01


async def test_timing_max_num_seqs_queues_fifo(start_sim) -> None:
    config = SimConfig.fast(decode_base_ms=2.0, max_num_seqs=1)
    body = {"max_tokens": 20, "ignore_eos": True}
    async with start_sim(config) as sim:
        first, second = await asyncio.gather(
            sim.completion([1000] * 16, **body), sim.completion([2000] * 16, **body)
        )
    # The second request starts only when the first is done (20 steps of ~2 ms).
    assert second.chunk_times_s[0] >= first.chunk_times_s[-1]
    assert second.ttft_s > 0.03


async def test_timing_speed_divides_delays(start_sim) -> None:
    slow = SimConfig.fast(prefill_us_per_token=100.0)
    fast = SimConfig.fast(prefill_us_per_token=100.0, speed=20.0)
    prompt = list(range(1000, 4000))  # 300 ms at speed 1, 15 ms at speed 20
    async with start_sim(slow) as sim:
        at_one = await sim.completion(prompt)
    async with start_sim(fast) as sim:
        at_twenty = await sim.completion(prompt)
    assert at_one.ttft_s > 0.25
    assert at_twenty.ttft_s < at_one.ttft_s / 4
