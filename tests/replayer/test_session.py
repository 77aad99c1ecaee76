"""Playing session trees, in virtual time (exact): turn order, think gaps, subagent
spawn and join, skipping after a failure, request bodies, admission, and large
prompts built off the event loop and ahead of their sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from aiohttp.test_utils import TestServer

from replayer.config import EndpointConfig, Lanes
from replayer.play.session import PromptBuilder, request_body
from replayer.runner.local import replay_trace
from tests.builders import (
    agent_tree,
    growing_session,
    request,
    session,
    subagent,
    trace_of,
)
from tests.fakes import FakeLLM, ReplayFake, engine_config, make_fake_llm_app
from traces.materialize import Materializer, PromptConfig
from traces.model import Session

MS = 1_000_000


async def test_session_tree_order_spawn_and_join(replay_fake: ReplayFake) -> None:
    trace = trace_of(agent_tree("s1"), agent_tree("s2"))
    run = await replay_fake(trace, schedule=Lanes(concurrency=2))
    df = run.rows
    assert run.summary.ok == len(df) == trace.request_count() == 20
    assert (df["status"] == "ok").all()
    for root in ("s1", "s2"):
        by = {
            sid: g.sort_values("request_index")
            for sid, g in df[df["root_session_id"] == root].groupby("session_id")
        }
        for sid, g in by.items():  # turns follow each other back to back
            starts, ends = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
            if sid == root:  # ... except where the parent waits for a join
                assert starts[2] == ends[1]
            else:
                assert (starts[1:] == ends[:-1]).all()
        parent = by[root]
        anchor_end = parent.iloc[0]["end_ns"]
        subs = [by[f"{root}/a"], by[f"{root}/b"]]
        for s in subs:
            assert s["start_ns"].min() == anchor_end  # spawned when its anchor ends
            assert (s["parent_session_id"] == root).all()
            assert (s["agent_depth"] == 1).all()
        # The join waits for the slower subagent, and not a nanosecond more.
        assert parent.iloc[1]["start_ns"] == max(s["end_ns"].max() for s in subs)
        assert by[f"{root}/bg"]["start_ns"].min() == parent.iloc[2]["end_ns"]


async def test_session_think_gaps_scaled_and_capped(replay_fake: ReplayFake) -> None:
    trace = trace_of(growing_session("s", 4, think=1.0))
    run = await replay_fake(trace, think_scale=0.1)
    g = run.rows
    gaps = g["start_ns"].to_numpy()[1:] - g["end_ns"].to_numpy()[:-1]
    assert (gaps == 100 * MS).all()
    assert (g["start_ns"] == g["scheduled_ns"]).all()
    capped = await replay_fake(trace, think_scale=1.0, think_cap_s=0.25)
    c = capped.rows
    assert (
        c["start_ns"].to_numpy()[1:] - c["end_ns"].to_numpy()[:-1] == 250 * MS
    ).all()


async def test_session_subagent_waits_its_own_first_think_gap(
    replay_fake: ReplayFake,
) -> None:
    child = session("p/c", [request(blocks=1, think=2.0), request(blocks=2)])
    parent = session(
        "p",
        [request(blocks=1), request(blocks=2)],
        subagents=[subagent(child, anchor=0, join=1)],
    )
    run = await replay_fake(trace_of(parent), think_scale=0.5)
    df = run.rows.set_index(["session_id", "request_index"])
    assert df.loc[("p/c", 0), "start_ns"] == df.loc[("p", 0), "end_ns"] + 1000 * MS


async def test_session_failure_skips_rest_of_tree(replay_fake: ReplayFake) -> None:
    trace = trace_of(agent_tree("s1"))
    run = await replay_fake(trace, client={"fail": frozenset({1})})
    df = run.rows
    assert len(df) == trace.request_count()  # every request has a row
    first = df[(df["session_id"] == "s1") & (df["request_index"] == 0)].iloc[0]
    assert first["status"] == "http_error"
    assert first["http_status"] == 500
    assert (df.drop(first.name)["status"] == "skipped").all()
    assert df.drop(first.name)["start_ns"].isna().all()  # never sent
    assert run.summary.failed == 1
    assert run.summary.skipped == len(df) - 1


async def test_session_failed_subagent_leaves_parent_running(
    replay_fake: ReplayFake,
) -> None:
    # Request 2 in send order is subagent a's first: a's rest is skipped, the parent
    # and b carry on.
    trace = trace_of(agent_tree("s1"))
    run = await replay_fake(trace, client={"fail": frozenset({2})})
    by = run.rows.groupby("session_id")["status"].apply(list).to_dict()
    assert by["s1/a"] == ["http_error", "skipped"]
    assert by["s1"] == ["ok"] * 3
    assert by["s1/b"] == ["ok"] * 3


async def test_session_records_tpot_and_tokens(replay_fake: ReplayFake) -> None:
    run = await replay_fake(
        trace_of(growing_session("s", 2, out=5)),
        client={"ttft_ns": 20 * MS, "itl_ns": 3 * MS},
    )
    df = run.rows
    assert (df["ttft_ns"] == 20 * MS).all()
    assert (df["e2e_ns"] == 32 * MS).all()
    assert (df["tpot_ns"] == 3 * MS).all()
    assert (df["output_tokens"] == 5).all()
    assert list(df.iloc[0]["chunk_times_ns"]) == [
        20 * MS + k * 3 * MS for k in range(5)
    ]


async def test_session_completions_body(replay_fake: ReplayFake) -> None:
    run = await replay_fake(trace_of(growing_session("s", 2)))
    body = run.client.bodies[-1]
    assert body["model"] == "fake-model"
    assert len(body["prompt"]) == 3 * 4 + 2
    assert body["max_tokens"] == 3
    assert body["ignore_eos"] is True
    assert body["min_tokens"] == 3
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    # Turn 1 extends turn 0: the shared blocks are byte-identical.
    assert run.client.bodies[1]["prompt"][:8] == run.client.bodies[0]["prompt"][:8]


async def test_session_chat_body_is_text_messages(replay_fake: ReplayFake) -> None:
    run = await replay_fake(trace_of(growing_session("s", 2)), api="chat")
    body = run.client.bodies[-1]
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1]["role"] == "user"
    assert "prompt" not in body


async def test_session_global_prefix_shared_by_subagents(
    replay_fake: ReplayFake,
) -> None:
    # In a global-scope trace, a subagent (read from Weka as "local") shares the
    # trace-wide namespace of its root: equal hash ids must send equal tokens.
    sub = session("b/sub", [request(blocks=3)])
    a = session("a", [request(blocks=3)], scope="global")
    b = session(
        "b",
        [request(blocks=3, first=100)],
        subagents=[subagent(sub, anchor=0, join=None)],
        scope="global",
    )
    run = await replay_fake(trace_of(a, b))
    a_prompt, b_prompt, sub_prompt = (body["prompt"] for body in run.client.bodies)
    assert sub_prompt[:12] == a_prompt[:12]  # hash ids 1..3, 4 tokens each
    assert b_prompt[:12] != a_prompt[:12]


async def test_session_max_inflight_admission(replay_fake: ReplayFake) -> None:
    trace = trace_of(*(growing_session(f"s{i}", 2) for i in range(6)))
    run = await replay_fake(trace, schedule=Lanes(concurrency=6), max_inflight=2)
    assert run.client.max_active == 2
    assert run.rows["inflight_at_send"].max() == 2
    assert run.rows["lanes_at_send"].max() == 6


async def test_session_warmup_rows_flagged_by_schedule_time(
    replay_fake: ReplayFake,
) -> None:
    trace = trace_of(growing_session("s", 4, think=1.0))
    run = await replay_fake(trace, warmup_s=1.5)
    # Turns start at 0, ~1.0 s, ~2.0 s, ~3.0 s (+ 12 ms of streaming each).
    assert list(run.rows["warmup"]) == [True, True, False, False]


async def test_session_large_prompt_built_off_the_loop() -> None:
    where: list[str] = []
    endpoint = EndpointConfig(base_url="http://127.0.0.1:9", model="m")
    make_body = request_body(endpoint)

    def body(fragment: bytes, max_tokens: int) -> bytes:
        where.append(threading.current_thread().name)
        return make_body(fragment, max_tokens)

    s = session(
        "s",
        [request(blocks=4, block_size=64), request(blocks=300, block_size=64)],
        block_size=64,
    )
    builder = PromptBuilder(Materializer(PromptConfig(salt="x")), body)
    try:
        small, _ = await builder.build(s, 0, "s", 0, 3)
        large, raw = await builder.build(s, 1, "s", 0, 3)
    finally:
        builder.close()
    assert small.prompt_tokens == 256
    assert large.prompt_tokens == 300 * 64
    assert where[0] == threading.current_thread().name  # small: on the loop
    assert where[1].startswith("replayer-prompts")  # large: its own thread
    assert raw.startswith(b'{"model":"m","prompt":[')


def test_session_prompt_blocks_identical_across_threads() -> None:
    # Small prompts build on the loop while large ones build on a thread, sharing
    # one block cache: the same block must come out byte-identical either way.
    m = Materializer(PromptConfig(salt="x"))
    s = session("s", [request(blocks=200, block_size=64)], block_size=64)
    results: list[bytes] = []

    def build() -> None:
        for _ in range(5):
            results.append(m.prompt(s, 0, "s").fragment)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert m.hits + m.misses == 20 * 200


@pytest.mark.parametrize("scale", [0.0, 2.0])
async def test_session_think_scale_zero_and_up(
    replay_fake: ReplayFake, scale: float
) -> None:
    run = await replay_fake(
        trace_of(growing_session("s", 3, think=0.5)), think_scale=scale
    )
    g = run.rows
    gaps = g["start_ns"].to_numpy()[1:] - g["end_ns"].to_numpy()[:-1]
    assert (gaps == int(0.5 * scale * 1e9)).all()
    assert np.all(g["status"] == "ok")


def test_session_prompt_cache_stays_within_its_bound() -> None:
    # --prompt-cache-mb: the encoded-block cache never holds more than asked.
    bound = 20_000
    m = Materializer(PromptConfig(salt="x", cache_bytes=bound))
    for k in range(30):
        s = session(f"s{k}", [request(blocks=50, first=k * 100, block_size=64)],
                    block_size=64)  # fmt: skip
        m.prompt(s, 0, s.session_id)
        assert m._cache_bytes <= bound  # the bound is the point
    assert m.misses == 30 * 50
    none = Materializer(PromptConfig(salt="x", cache_bytes=0))
    s = session("s", [request(blocks=5, block_size=64)], block_size=64)
    assert none.prompt(s, 0, "s").fragment == m.prompt(s, 0, "s").fragment
    assert none._cache_bytes == 0


async def test_queue_inclusive_ttft_of_a_replay_with_a_client_cap(
    replay_fake: ReplayFake,
) -> None:
    # Two sessions want to send at 0; --max-inflight 1 makes the second wait for the
    # first (10 ms TTFT, one token): its queue-inclusive TTFT is 10 ms longer.
    trace = trace_of(*(growing_session(f"s{i}", 1, out=1) for i in range(2)))
    run = await replay_fake(
        trace,
        schedule=Lanes(concurrency=2),
        max_inflight=1,
        client={"ttft_ns": 10_000_000, "tokens": 1},
    )
    from analysis import metrics as m  # the figure analyze reports, on these rows
    from analysis.load import load_run

    df = m.numeric_view(load_run(run.run_dir).requests).sort_values("start_ns")
    queued = (df["first_token_ns"] - df["scheduled_ns"]).tolist()
    service = df["ttft_ns"].tolist()
    assert service == [10_000_000, 10_000_000]
    assert queued == [10_000_000, 20_000_000]
    assert sorted(m.queued_ttft_ms(df)) == [10.0, 20.0]


async def test_status_line_p90_is_over_the_measured_window_only(
    tmp_path: Path,
) -> None:
    # Three slow warm-up requests, then fast ones: the live status line must show
    # the summary's P90 (measured rows), not one inflated by the warm-up.
    import io

    from replayer.play.progress import Progress, RunCounters
    from replayer.runner.local import replay_trace
    from tests.fakes import FakeChatClient, FakeClock, engine_config

    class SlowFirst(FakeChatClient):
        async def send(self, body, out=None, *, headers=None):  # type: ignore[no-untyped-def]
            self.ttft_ns = 500 * MS if len(self.bodies) < 3 else 10 * MS
            return await super().send(body, out, headers=headers)

    clock = FakeClock()
    counters = RunCounters()
    summary = await replay_trace(
        trace_of(growing_session("s", 10, out=2)),
        engine_config(warmup_s=1.2),
        tmp_path / "run",
        clock=clock,
        client=SlowFirst(clock),
        counters=counters,
    )
    rows = pd.read_parquet(tmp_path / "run" / "requests")
    assert rows["warmup"].sum() == 3
    assert summary.p90_ttft_ms == pytest.approx(10.0)
    line = Progress(counters, clock, clock.now_ns(), 10, io.StringIO()).line()
    assert "P90 TTFT 10 ms" in line, line


async def test_lanes_first_prompts_are_built_before_the_run_starts(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Eight lanes start at once: had their large first prompts been built at their
    # sends, on the one build thread, each send would wait for the builds before it
    # (at 8 lanes of Weka sessions, up to 100 ms "sent late", the client blamed). They
    # are built before the clock starts; the order of events says so, not a timing.
    events: list[tuple[str, str, int]] = []
    built = Materializer.prompt

    def prompt(self: Materializer, session: Session, i: int, *a: Any, **kw: Any) -> Any:
        out = built(self, session, i, *a, **kw)
        events.append(("built", session.session_id, i))
        return out

    monkeypatch.setattr(Materializer, "prompt", prompt)

    async def gate() -> int:
        events.append(("start", "", 0))
        return time.perf_counter_ns()

    server = await aiohttp_server(make_fake_llm_app(FakeLLM()), host="127.0.0.1")
    # 100 blocks of 64 tokens: past the inline bound, built on the thread.
    turns = [request(blocks=100, block_size=64), request(blocks=101, block_size=64)]
    trace = trace_of(*(session(f"s{k}", turns, block_size=64) for k in range(10)))
    url = f"http://127.0.0.1:{server.port}"
    cfg = engine_config(url, schedule=Lanes(concurrency=8))
    outcome = await replay_trace(trace, cfg, tmp_path / "run", start_gate=gate)
    assert outcome.ok == 20
    start = events.index(("start", "", 0))
    firsts = {sid for what, sid, i in events[:start] if what == "built" and i == 0}
    assert firsts == {f"s{k}" for k in range(8)}
    # The other prompts were built too, each once, after the start.
    assert len(events) == 1 + 20
