"""The virtual-time loop: exact clock sleeps, threads take no virtual time, a stall is
an error, and a whole replay runs on it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pandas as pd
import pytest

from replayer.config import Lanes
from replayer.runner.local import replay_trace
from replayer.runner.vloop import VirtualClock, VirtualLoop, VirtualStall, run_virtual
from tests.builders import growing_session, trace_of
from tests.fakes import FakeChatClient, engine_config


def test_vloop_clock_sleeps_end_on_their_nanosecond() -> None:
    async def main(loop: VirtualLoop) -> list[int]:
        clock = VirtualClock(loop)
        seen: list[int] = []

        async def sleeper(deadline: int) -> None:
            await clock.sleep_until(deadline)
            seen.append(clock.now_ns())

        async with asyncio.TaskGroup() as tg:
            for d in (3_000_000_001, 7, 1_000_000_000_000_003, 5_000):
                tg.create_task(sleeper(d))
        return seen

    assert run_virtual(main) == [7, 5_000, 3_000_000_001, 1_000_000_000_000_003]


def test_vloop_a_thread_takes_no_virtual_time() -> None:
    async def main(loop: VirtualLoop) -> tuple[int, int]:
        before = loop.now_ns
        await asyncio.to_thread(time.sleep, 0.2)  # real time passes, virtual not
        after_thread = loop.now_ns
        await asyncio.sleep(100)  # virtual: no real wait
        return after_thread - before, loop.now_ns - before

    t0 = time.perf_counter()
    thread_ns, total_ns = run_virtual(main)
    assert thread_ns == 0
    assert total_ns >= 100_000_000_000
    assert time.perf_counter() - t0 < 60  # 100 virtual seconds were not waited out


def test_vloop_stall_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    from replayer.runner import vloop

    monkeypatch.setattr(vloop, "_STALL_S", 0.1)

    async def main(loop: VirtualLoop) -> None:
        await loop.create_future()  # nothing will ever resolve it

    with pytest.raises(VirtualStall, match="stalled"):
        run_virtual(main)


def test_vloop_runs_a_replay_exactly(tmp_path: Path) -> None:
    trace = trace_of(*(growing_session(f"s{k}", 6) for k in range(8)))
    config = engine_config(schedule=Lanes(concurrency=3))

    async def main(loop: VirtualLoop) -> None:
        clock = VirtualClock(loop)
        client = FakeChatClient(clock)  # type: ignore[arg-type]
        await replay_trace(trace, config, tmp_path / "run", clock=clock, client=client)

    run_virtual(main)
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert len(df) == 48
    assert set(df["status"]) == {"ok"}
    assert set(df["ttft_ns"]) == {10_000_000}  # FakeChatClient's, to the nanosecond
    assert (df["inflight_at_send"] <= 3).all()
