"""When trees start, in virtual time (exact): lanes, seeded arrivals, trace
timestamps, the duration deadline with both drain policies, loops."""

from __future__ import annotations

import numpy as np

from replayer.config import Lanes, RateArrivals, TraceTimestamps
from replayer.play.phase import StopControl
from replayer.play.schedule import shard
from tests.builders import agent_tree, growing_session, trace_of
from tests.fakes import ReplayFake

MS = 1_000_000


async def test_schedule_lanes_hold_exactly_n_live_trees(
    replay_fake: ReplayFake,
) -> None:
    run = await replay_fake(
        trace_of(*(agent_tree(f"s{i}") for i in range(5))),
        schedule=Lanes(concurrency=2),
    )
    df = run.rows
    spans = df.groupby("root_session_id").agg(
        lo=("start_ns", "min"), hi=("end_ns", "max")
    )
    events = sorted([(lo, 1) for lo in spans["lo"]] + [(hi, -1) for hi in spans["hi"]])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 2
    assert df["lanes_at_send"].max() == 2
    # A lane takes the next tree the moment its tree has drained, not earlier.
    order = spans.sort_values("lo")
    assert order["lo"].iloc[2] == min(order["hi"].iloc[:2])


async def test_schedule_timestamps_send_at_trace_time(replay_fake: ReplayFake) -> None:
    trace = trace_of(*(growing_session(f"m{i}", 1, start=10.0 + i) for i in range(4)))
    run = await replay_fake(trace, schedule=TraceTimestamps(speedup=10.0))
    want = [i * 100 * MS for i in range(4)]
    assert list(run.rows["scheduled_ns"]) == want
    assert list(run.rows["start_ns"]) == want  # no lag in virtual time


async def test_schedule_timestamps_requests_wait_for_their_trace_time(
    replay_fake: ReplayFake,
) -> None:
    from tests.builders import request, session

    # Request 1 is due at trace time 5 s (after request 0 ended at ~12 ms).
    s = session("m", [request(blocks=1, out=2, t=0.0), request(blocks=2, out=2, t=5.0)])
    run = await replay_fake(trace_of(s), schedule=TraceTimestamps(speedup=2.0))
    assert list(run.rows["scheduled_ns"]) == [0, 2500 * MS]
    assert list(run.rows["start_ns"]) == [0, 2500 * MS]


async def test_schedule_session_rate_arrivals_are_seeded_poisson(
    replay_fake: ReplayFake,
) -> None:
    trace = trace_of(*(growing_session(f"r{i}", 1) for i in range(6)))
    runs = [
        await replay_fake(trace, schedule=RateArrivals(session_rate=50.0), seed=3)
        for _ in range(2)
    ]
    starts = [list(r.rows["scheduled_ns"]) for r in runs]
    assert starts[0] == starts[1]
    gaps = np.random.default_rng(3).exponential(1 / 50.0, size=5)
    want = [0, *(int(x * 1e9) for x in np.cumsum(gaps))]
    assert starts[0] == want
    assert list(runs[0].rows["start_ns"]) == want


async def test_schedule_gamma_arrivals_follow_vllm_convention(
    replay_fake: ReplayFake,
) -> None:
    trace = trace_of(*(growing_session(f"g{i}", 1) for i in range(4)))
    run = await replay_fake(
        trace,
        schedule=RateArrivals(session_rate=20.0, arrival="gamma", burstiness=0.5),
        seed=7,
    )
    gaps = np.random.default_rng(7).gamma(0.5, 1.0 / (20.0 * 0.5), size=3)
    assert list(run.rows["scheduled_ns"]) == [
        0,
        *(int(x * 1e9) for x in np.cumsum(gaps)),
    ]


async def test_schedule_duration_cancel_cuts_in_flight_requests(
    replay_fake: ReplayFake,
) -> None:
    # Each request: 3 tokens at 10, 80 and 150 ms. At 320 ms every lane is 20 ms into
    # its third request, whose first token came at 310 ms.
    trace = trace_of(*(growing_session(f"d{i}", 5) for i in range(3)))
    run = await replay_fake(
        trace,
        client={"ttft_ns": 10 * MS, "itl_ns": 70 * MS},
        schedule=Lanes(concurrency=3),
        duration_s=0.32,
        drain="cancel",
    )
    df = run.rows
    assert run.summary.duration_s == 0.32
    assert (
        df.groupby("session_id")["status"].apply(list)
        == [["ok", "ok", "cancelled"]] * 3
    ).all()
    cancelled = df[df["status"] == "cancelled"]
    assert (cancelled["end_ns"] == 320 * MS).all()
    # What was measured before the cancel stays: the real send, the first token.
    assert (cancelled["start_ns"] == 300 * MS).all()
    assert (cancelled["first_token_ns"] == 310 * MS).all()
    assert (cancelled["ttft_ns"] == 10 * MS).all()
    assert (cancelled["e2e_ns"] == 20 * MS).all()
    assert (cancelled["output_tokens"] == 1).all()
    assert [list(c) for c in cancelled["chunk_times_ns"]] == [[10 * MS]] * 3
    assert run.summary.counts.cancelled == 3
    assert run.summary.counts.requests == len(df) == 9


async def test_schedule_duration_finish_lets_requests_end_and_starts_nothing(
    replay_fake: ReplayFake,
) -> None:
    trace = trace_of(*(growing_session(f"d{i}", 5) for i in range(2)))
    run = await replay_fake(
        trace,
        client={"ttft_ns": 50 * MS, "itl_ns": 50 * MS},
        schedule=Lanes(concurrency=2),
        duration_s=0.32,
        drain="finish",
    )
    df = run.rows
    assert (df["status"] == "ok").all()
    assert len(df) == 6  # three requests per session; the third ends at 450 ms
    assert df["start_ns"].max() == 300 * MS
    assert df["end_ns"].max() == 450 * MS


async def test_schedule_loop_replays_trees_until_the_deadline(
    replay_fake: ReplayFake,
) -> None:
    trace = trace_of(growing_session("l", 2))
    run = await replay_fake(
        trace,
        client={"ttft_ns": 10 * MS, "itl_ns": 10 * MS},  # 30 ms per request
        schedule=Lanes(concurrency=1),
        duration_s=0.2,
        loop=True,
    )
    df = run.rows
    assert len(df) == 7  # requests start at 0, 30, ..., 180 ms
    assert df["start_ns"].max() == 180 * MS
    # Each replay of the session gets fresh content (its own replay index).
    first, second = run.client.bodies[0]["prompt"], run.client.bodies[2]["prompt"]
    assert first != second


def test_schedule_stop_control_deadline() -> None:
    stop = StopControl(deadline_ns=100)
    assert not stop.past(99)
    assert stop.past(100)
    stop.stopping = True
    assert stop.past(0)
    assert not StopControl().past(10**18)


def test_schedule_shard_is_round_robin() -> None:
    trace = trace_of(*(growing_session(f"s{i}", 1) for i in range(5)))
    shards = [shard(trace, k, 2) for k in range(2)]
    assert [s.session_id for s in shards[0].sessions] == ["s0", "s2", "s4"]
    assert [s.session_id for s in shards[1].sessions] == ["s1", "s3"]
    assert shard(trace, 0, 1) is trace
