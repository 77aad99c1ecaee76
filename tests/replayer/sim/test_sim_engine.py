"""The engine loop without HTTP: admission under KV capacity, exact lengths, stop."""

from __future__ import annotations

import asyncio
import time

import pytest

from replayer.sim import SimConfig
from replayer.sim.engine import Engine, EngineStopped


async def _finish(seq) -> int:
    seen = 0
    while not seq.finished:
        seen = await seq.wait_tokens(seen)
    return seq.generated


async def test_engine_kv_capacity_limits_admission() -> None:
    config = SimConfig.fast(block_size=4, kv_capacity_tokens=64, max_model_len=60)
    engine = Engine(config)
    async with asyncio.TaskGroup() as tg:
        loop = tg.create_task(engine.run())
        big = engine.submit(list(range(1000, 1040)), 8)  # 12 of 16 blocks
        other = engine.submit(list(range(2000, 2040)), 8)  # must wait for room
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert engine.stats.running == 1
        assert engine.stats.waiting == 1
        assert await _finish(big) == 8
        assert await _finish(other) == 8
        assert engine.core.pool.num_free == 16
        loop.cancel()


async def test_engine_stop_fails_in_flight_and_refuses_new_work() -> None:
    engine = Engine(SimConfig.fast(decode_base_ms=50.0))
    async with asyncio.TaskGroup() as tg:
        loop = tg.create_task(engine.run())
        seq = engine.submit([1000] * 10, 100)
        await asyncio.sleep(0.01)
        loop.cancel()
    with pytest.raises(EngineStopped):
        await seq.wait_tokens(seq.generated)
    with pytest.raises(EngineStopped):
        engine.submit([1000] * 10, 1)


async def test_a_request_joins_the_first_step_that_starts_after_it_came() -> None:
    """The loop may wake late (the host, not the modeled engine); a request that
    came after a step's modeled start still waits for the next step, as in virtual
    time, instead of joining the step the late loop plans."""
    engine = Engine(SimConfig.fast(decode_base_ms=30.0))
    handed: list[tuple[float, float]] = []  # (modeled step start, arrival)
    add = engine.core.add

    def recorded(req):  # type: ignore[no-untyped-def]
        handed.append((engine._deadline_s, req.handle.arrival_s))
        add(req)

    engine.core.add = recorded  # type: ignore[method-assign]
    async with asyncio.TaskGroup() as tg:
        loop = tg.create_task(engine.run())
        first = engine.submit(list(range(64)), 20)
        await first.wait_tokens(2)  # decoding: the loop sleeps to the step's end
        boundary = engine._deadline_s
        # Hold the loop 5 ms past the boundary (under the catch-up limit), then
        # submit: the request comes after the step that the loop plans next.
        time.sleep(max(0.0, boundary - time.perf_counter()) + 0.005)  # noqa: ASYNC251
        late = engine.submit(list(range(1000, 1064)), 2)
        assert await _finish(late) == 2
        assert await _finish(first) == 20
        loop.cancel()
    assert len(handed) == 2
    for start, arrival in handed:
        assert start >= arrival
    assert handed[1][0] > boundary  # the step after the one planned at the boundary
