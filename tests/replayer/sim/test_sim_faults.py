"""Seeded fault injection of the simulator: HTTP 500s, dropped streams, stalls."""

from __future__ import annotations

import asyncio
import itertools
import math

N = 200


def _within_binomial(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 4.5 * math.sqrt(n * p * (1 - p))


async def test_faults_fail_rate_gives_500s_at_about_the_rate(start_sim) -> None:
    async with start_sim(fail_rate=0.3, seed=11) as sim:
        results = await asyncio.gather(*(sim.completion([1000] * 8) for _ in range(N)))
    failed = [r for r in results if r.status == 500]
    assert _within_binomial(len(failed), N, 0.3)
    assert all(r.body["error"]["type"] == "InternalServerError" for r in failed)
    assert all(r.status == 200 and r.done for r in results if r.status != 500)


async def test_faults_disconnect_drops_streams_mid_way(start_sim) -> None:
    async with start_sim(disconnect_rate=0.3, seed=5) as sim:
        results = await asyncio.gather(
            *(
                sim.completion([1000] * 8, max_tokens=20, ignore_eos=True)
                for _ in range(N)
            )
        )
        after = await sim.metrics()
    dropped = [r for r in results if r.dropped]
    assert _within_binomial(len(dropped), N, 0.3)
    for r in dropped:
        assert r.status == 200
        assert not r.done
        assert 1 <= len(r.chunks) < 20
        assert r.usage is None
    assert all(len(r.chunks) == 20 for r in results if not r.dropped)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0


async def test_faults_stall_pauses_then_continues(start_sim) -> None:
    async with start_sim(stall_rate=1.0, stall_s=0.3) as sim:
        result = await sim.completion([1000] * 8, max_tokens=10, ignore_eos=True)
    times = result.chunk_times_s
    gaps = [b - a for a, b in itertools.pairwise(times)]
    first_gap = result.ttft_s
    assert result.done
    assert len(result.chunks) == 10
    assert max([first_gap, *gaps]) >= 0.25


async def test_faults_are_reproducible_with_a_seed(start_sim) -> None:
    outcomes = []
    for _ in range(2):
        async with start_sim(fail_rate=0.5, seed=42) as sim:
            results = [await sim.completion([1] * 4) for _ in range(30)]
        outcomes.append([r.status for r in results])
    assert outcomes[0] == outcomes[1]
    assert set(outcomes[0]) == {200, 500}
