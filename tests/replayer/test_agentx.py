"""The AgentX protocol's parts on the shared real Weka sessions: mid-session starts
with primers, recycled trees with per-replay cache-bust markers, the duplication
check, the cache-pressure warm-up, idle skipping, --on-error and session headers.

Engine runs use virtual time (FakeClock + FakeChatClient) except the header test,
which talks to a real aiohttp server on loopback that records each request's
headers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from aiohttp.test_utils import TestServer

from analysis.load import load_run
from analysis.metrics import counts, numeric_view
from analysis.summary import summarize
from replayer.config import Lanes, ReplayConfig
from replayer.errors import ConfigError
from replayer.play.session import start_index
from replayer.records import RunMeta
from replayer.runner.local import replay_trace
from tests.builders import request, session, trace_of
from tests.fakes import (
    FakeChatClient,
    FakeClock,
    FakeLLM,
    engine_config,
    make_fake_llm_app,
)
from traces.io import read_trace
from traces.model import Session, Trace

WEKA = Path(__file__).resolve().parents[3] / "shared" / "data" / "weka"
# Small enough that prompts (one token per 64-token block) are built on the loop.
SMALL = ("trace_0068", "trace_0277", "trace_0369", "trace_0718", "trace_0094")
BLOCK_TOKENS = 1
Serve = Callable[..., Awaitable[TestServer]]

pytestmark = pytest.mark.skipif(not WEKA.is_dir(), reason="shared Weka data absent")


def weka(*names: str) -> Trace:
    sessions = [read_trace(WEKA / f"{n}.json").sessions[0] for n in names]
    return Trace(sessions=tuple(sessions), source_format="weka")


def config(block_tokens: int = BLOCK_TOKENS, **kw: Any) -> ReplayConfig:
    cfg = engine_config(**kw)
    return replace(cfg, prompt=replace(cfg.prompt, block_tokens=block_tokens))


async def run_fake(
    trace: Trace,
    run_dir: Path,
    *,
    client: dict[str, Any] | None = None,
    block_tokens: int = BLOCK_TOKENS,
    **kw: Any,
) -> tuple[pd.DataFrame, RunMeta, FakeChatClient]:
    clock = FakeClock()
    fake = FakeChatClient(
        clock, **{"ttft_ns": 5_000_000, "itl_ns": 0, **(client or {})}
    )
    cfg = config(block_tokens, **kw)
    await replay_trace(trace, cfg, run_dir, clock=clock, client=fake)
    rows = pd.read_parquet(run_dir / "requests")
    meta = RunMeta.from_dict(json.loads((run_dir / "run.json").read_text()))
    return rows, meta, fake


def _fraction(s: Session, i: int) -> float:
    t = [r.t_s for r in s.requests]
    return (t[i] - t[0]) / (t[-1] - t[0])


async def test_agentx_mid_session_starts_primed_with_one_token(tmp_path: Path) -> None:
    trace = weka(*SMALL)
    rows, meta, _ = await run_fake(
        trace,
        tmp_path / "run",
        schedule=Lanes(concurrency=len(SMALL)),
        start_ratio=(0.25, 0.75),
        think_scale=0.0,
    )
    roots = rows[rows.agent_depth == 0]
    for s in trace.sessions:
        mine = roots[roots.session_id == s.session_id]
        primers = mine[mine.primer]
        assert len(primers) == 1, s.session_id
        k = int(primers.request_index.iloc[0]) + 1  # the first request measured
        assert primers.requested_output_tokens.iloc[0] == 1
        assert bool(primers.warmup.iloc[0])
        # The start point lies 25-75% of the way into the session: the primed
        # request is before it, the first played one at or after it.
        assert _fraction(s, k - 1) < 0.75
        assert _fraction(s, k) >= 0.25 or k == 1
        # Nothing of the prefix is replayed beyond its primer; the rest all is.
        played = sorted(mine[~mine.primer].request_index)
        assert played == list(range(k, len(s.requests)))
        assert (mine[~mine.primer].requested_output_tokens > 1).any()
    # Primers are flagged warm-up: counted apart, excluded from every figure (so are
    # the turns a primed lane plays while others still prime).
    assert int(rows.primer.sum()) == len(trace.sessions)
    view = numeric_view(load_run(tmp_path / "run").requests)
    assert counts(view).warmup == int(rows.warmup.sum()) >= len(trace.sessions)
    assert meta.protocol is not None
    assert meta.protocol.start_ratio == (0.25, 0.75)


def test_agentx_start_index_bounds() -> None:
    s = session("s", [request(blocks=1, t=float(t)) for t in range(11)])
    assert start_index(s, 0.25) == 3  # t = 2.5 → the request at t = 3
    assert start_index(s, 0.75) == 8
    assert start_index(s, 0.0) == 1  # always one request to prime with
    assert start_index(s, 1.0) == 10  # and one to measure
    assert start_index(session("one", [request(blocks=1)]), 0.5) == 0


def _blocks(body: dict[str, Any], n: int) -> list[tuple[int, ...]]:
    ids = [int(x) for x in body["prompt"]]
    return [tuple(ids[i : i + n]) for i in range(0, len(ids), n)]


def _leading_run(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


async def test_agentx_recycled_trees_carry_new_markers(tmp_path: Path) -> None:
    trace = weka("trace_0718", "trace_0369")
    bt = 3  # tokens per block: a block is 3 ids, unique across replays by chance
    rows, meta, fake = await run_fake(
        trace,
        tmp_path / "run",
        block_tokens=bt,
        schedule=Lanes(concurrency=3),  # more lanes than trees: clones at once
        loop=True,
        duration_s=0.1,  # trace_0718 is 8 requests of 5 ms: two replays and more
        think_scale=0.0,
        session_header="x-session-id",
    )
    assert meta.protocol is not None
    assert meta.protocol.duplication_factor == pytest.approx(1.5)
    assert rows.replay_index.max() >= 1
    # Bodies by replay of trace_0718 (the header names tree and replay).
    by_replay: dict[str, list[list[tuple[int, ...]]]] = {}
    for headers, body in zip(fake.headers, fake.bodies, strict=True):
        by_replay.setdefault(headers["x-session-id"], []).append(_blocks(body, bt))
    a, b = by_replay["trace_0718#0"], by_replay["trace_0718#1"]
    assert len(a) == len(b) == len(trace.sessions[0].requests)
    # Two replays of one tree share no block ...
    assert not {x for p in a for x in p} & {x for p in b for x in p}
    # ... while the turns of one replay share the leading blocks the trace says.
    reqs = trace.sessions[0].requests
    shared_turns = 0
    for i in range(1, len(a)):
        run = _leading_run(reqs[i - 1].hash_ids, reqs[i].hash_ids)
        assert a[i][:run] == a[i - 1][:run]
        shared_turns += run > 0
    assert shared_turns > 0


async def test_agentx_clones_without_markers_fail_up_front(tmp_path: Path) -> None:
    trace = weka("trace_0718", "trace_0369")
    cfg = config(schedule=Lanes(concurrency=3), loop=True, duration_s=60.0)
    cfg = replace(cfg, prompt=replace(cfg.prompt, replay_markers=False))
    clock = FakeClock()
    with pytest.raises(ConfigError, match=r"duplication factor 1\.50"):
        await replay_trace(
            trace, cfg, tmp_path / "run", clock=clock, client=FakeChatClient(clock)
        )
    assert not (tmp_path / "run").exists()


async def test_agentx_cache_warmup_zero_gaps_flagged_then_window(
    tmp_path: Path,
) -> None:
    # Gaps of 30 s: the warm-up plays through them at once, the window honours them.
    s = session(
        "s",
        [request(blocks=i + 1, out=5, think=0.0 if i == 0 else 30.0) for i in range(8)],
    )
    rows, meta, _ = await run_fake(
        trace_of(s),
        tmp_path / "run",
        schedule=Lanes(concurrency=1),
        cache_warmup_s=0.1,
        duration_s=3600.0,
        client={"ttft_ns": 40_000_000},  # 40 ms per request
    )
    rows = rows.sort_values("request_index")
    start = meta.measure_start_ns
    assert start == 100_000_000  # no primers: the window opens after the warm-up
    warm = rows[rows.warmup]
    measured = rows[~rows.warmup]
    assert len(warm) == 3  # 0, 40 ms, 80 ms: sent without gaps, inside 100 ms
    assert (warm.requested_output_tokens == 1).all()
    assert (warm.start_ns.to_numpy()[1:] == warm.end_ns.to_numpy()[:-1]).all()
    assert (measured.start_ns >= start).all()
    assert (measured.requested_output_tokens == 5).all()
    # The request in flight at the window's start ended there; the next one waits
    # its recorded gap.
    gaps = measured.start_ns.to_numpy()[1:] - measured.end_ns.to_numpy()[:-1]
    assert (gaps == 30_000_000_000).all()
    assert meta.protocol is not None
    assert meta.protocol.outcome is not None
    assert meta.protocol.outcome.measure_start_ns == start


async def test_agentx_idle_skip_compresses_whole_system_idle(tmp_path: Path) -> None:
    s = session(
        "s",
        [
            request(blocks=1),
            request(blocks=2, think=100.0),  # whole system idle: 100 s → 10 s
            request(blocks=3, think=8.0),  # under the limit: waited out
        ],
    )
    rows, meta, _ = await run_fake(
        trace_of(s), tmp_path / "run", idle_skip_s=10.0, client={"ttft_ns": 1_000}
    )
    rows = rows.sort_values("request_index")
    gaps = rows.start_ns.to_numpy()[1:] - rows.end_ns.to_numpy()[:-1]
    assert gaps.tolist() == [10_000_000_000, 8_000_000_000]
    assert meta.protocol is not None
    assert meta.protocol.outcome is not None
    assert meta.protocol.outcome.idle_skipped_s == pytest.approx(90.0)


async def test_agentx_idle_skip_and_the_window_end(tmp_path: Path) -> None:
    # a's 100 s gap ends past the 15 s window; skipped to 10 s, it falls inside it.
    # b's gap, skipped to 10 s as well, still ends past it: b's lane stays taken
    # until the window closes, and c never starts.
    a = session("a", [request(blocks=1), request(blocks=2, think=100.0)])
    b = session("b", [request(blocks=1), request(blocks=2, think=200.0)])
    c = session("c", [request(blocks=1)])
    rows, meta, _ = await run_fake(
        trace_of(a, b, c),
        tmp_path / "run",
        duration_s=15.0,
        idle_skip_s=10.0,
        client={"ttft_ns": 1_000},
    )
    sent = rows.sort_values("start_ns")[["session_id", "request_index", "start_ns"]]
    assert [tuple(r[:2]) for r in sent.itertuples(index=False)] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]
    assert int(sent.start_ns.iloc[1] - sent.start_ns.iloc[0]) == pytest.approx(
        10e9, abs=1e4
    )
    assert meta.duration_s is not None
    assert meta.duration_s >= 15.0  # the run lasted the window


async def test_agentx_idle_skip_waits_while_another_lane_works(tmp_path: Path) -> None:
    thinker = session("a", [request(blocks=1), request(blocks=2, think=60.0)])
    # A long request (200 s) keeps the system busy through most of a's gap.
    worker = session("b", [request(blocks=1, out=201)])
    rows, meta, _ = await run_fake(
        trace_of(thinker, worker),
        tmp_path / "run",
        schedule=Lanes(concurrency=2),
        idle_skip_s=10.0,
        client={"ttft_ns": 1_000, "itl_ns": 1_000_000_000},
    )
    a = rows[rows.session_id == "a"].sort_values("request_index")
    # b streams for 200 s: a's gap of 60 s passes while b works; never skipped.
    assert int(a.start_ns.iloc[1] - a.end_ns.iloc[0]) == 60_000_000_000
    assert meta.protocol is not None
    assert meta.protocol.outcome is not None
    assert meta.protocol.outcome.idle_skipped_s == 0.0


@pytest.mark.parametrize(
    ("policy", "ok", "failed", "skipped"),
    [("skip-session", 1, 1, 3), ("continue", 4, 1, 0), ("abort-run", 1, 1, 3)],
)
async def test_agentx_on_error_policies(
    tmp_path: Path, policy: str, ok: int, failed: int, skipped: int
) -> None:
    s = session("s", [request(blocks=i + 1, think=1.0) for i in range(5)])
    rows, meta, _ = await run_fake(
        trace_of(s), tmp_path / "run", on_error=policy, client={"fail": {2}}
    )
    by = rows.status.value_counts()
    assert (by.get("ok", 0), by.get("http_error", 0), by.get("skipped", 0)) == (
        ok,
        failed,
        skipped,
    )
    assert meta.protocol is not None
    assert (meta.protocol.aborted is not None) == (policy == "abort-run")


async def test_agentx_abort_run_stops_every_lane(tmp_path: Path) -> None:
    slow = session("slow", [request(blocks=1, out=100), request(blocks=2)])
    failing = session("fail", [request(blocks=1), request(blocks=2)])
    rows, meta, _ = await run_fake(
        trace_of(slow, failing),
        tmp_path / "run",
        schedule=Lanes(concurrency=2),
        on_error="abort-run",
        client={"fail": {2}, "itl_ns": 1_000_000_000},  # slow streams 100 s
    )
    # The failure (fail's first request) cancels slow's stream; nothing after it.
    s = rows[rows.session_id == "slow"].sort_values("request_index")
    assert s.status.tolist() == ["cancelled"]
    assert meta.protocol is not None
    assert "request 0 of session fail failed" in (meta.protocol.aborted or "")


async def _serve(aiohttp_server: Serve, fake: FakeLLM) -> str:
    server = await aiohttp_server(make_fake_llm_app(fake), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("scope", ["tree", "session"])
async def test_agentx_session_header_on_every_request_of_a_tree(
    aiohttp_server: Serve, tmp_path: Path, scope: str
) -> None:
    fake = FakeLLM()
    url = await _serve(aiohttp_server, fake)
    trace = weka("trace_0277")  # 9 requests and 4 subagents: 53 in all
    cfg = replace(
        config(url=url, think_scale=0.0),
        session_header="x-dynamo-session-id",
        session_id_scope=scope,  # type: ignore[arg-type]
    )
    await replay_trace(trace, cfg, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "requests")
    assert (rows.status == "ok").all()
    assert fake.requests == trace.request_count() == 53
    seen = {h["x-dynamo-session-id"] for h in fake.headers}
    if scope == "tree":
        assert seen == {"trace_0277#0"}  # subagents carry their root's identity
    else:
        assert seen == {f"{sid}#0" for sid in rows.session_id.unique()}
        assert len(seen) == 5


async def test_agentx_live_assistant_carries_real_replies_and_reports_drift(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # Turn i is over blocks 1..2+2i of 4 tokens: after each turn's prompt, one block
    # of recorded reply (out = 4), then one block of the next user message.
    s = session("s", [request(blocks=2 + 2 * i, block_size=4, out=4) for i in range(4)])
    fake = FakeLLM(tokens=2)  # the model replies "t0 t1 ": 2 tokens, not 4
    url = await _serve(aiohttp_server, fake)
    runs = {}
    for live in (False, True):
        cfg = replace(
            engine_config(url=url, api="chat", think_scale=0.0), live_assistant=live
        )
        await replay_trace(trace_of(s), cfg, tmp_path / f"live-{live}")
        runs[live] = (
            pd.read_parquet(tmp_path / f"live-{live}" / "requests")
            .sort_values("request_index")
            .reset_index(drop=True)
        )
    live_bodies = fake.bodies[4:]
    # Each request carries the model's own earlier replies as assistant messages.
    for i, body in enumerate(live_bodies):
        replies = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        assert replies == ["t0 t1 "] * i
    # The recorded run carries the trace's replies (filler blocks), never those.
    assert all(m["content"] != "t0 t1 " for b in fake.bodies[:4] for m in b["messages"])
    rec, lv = runs[False], runs[True]
    assert rec.live_drift_tokens.isna().all()
    # A recorded reply costs 4 tokens (3 of its block + its role), a live one 3.
    assert lv.live_drift_tokens.tolist() == [0, -1, -2, -3]
    assert (lv.prompt_tokens - rec.prompt_tokens).tolist() == [0, -1, -2, -3]
    # Per run: analyze reports the drift over the window.
    summary = summarize(load_run(tmp_path / "live-True")).as_dict()
    drift = summary["agentx"]["live_drift"]
    assert drift["requests"] == 4
    assert drift["mean_tokens"] == pytest.approx(-1.5)
    assert drift["share"] == pytest.approx(-6 / int(rec.prompt_tokens.sum()))
    assert (
        summarize(load_run(tmp_path / "live-False")).as_dict()["agentx"]["live_drift"]
        is None
    )
