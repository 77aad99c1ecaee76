"""replay_trace end to end against a real fake server on loopback: session order,
subagent spawn/join, skipping after failures, scheduling modes, duration, cancellation,
and the run directory (Parquet rows, run.json, no secrets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer

from replayer.config import EndpointConfig, ReplayConfig
from replayer.errors import EndpointError
from replayer.records import RECORD_SCHEMA
from replayer.run import replay_trace
from tests.fakes import FakeLLM, make_fake_llm_app
from traces.materialize import PromptConfig
from traces.model import Request, Session, Subagent, Trace

Serve = Callable[..., Awaitable[TestServer]]


def _req(
    n_blocks: int, *, first: int = 1, out: int = 3, think: float = 0.0, t: float = 0.0
) -> Request:
    return Request(
        input_tokens=n_blocks * 4 + 2,
        output_tokens=out,
        hash_ids=np.arange(first, first + n_blocks, dtype=np.int64),
        think_time_s=think,
        t_s=t,
    )


def _session(
    sid: str,
    n: int,
    *,
    subagents: tuple[Subagent, ...] = (),
    think: float = 0.0,
    start: float | None = None,
) -> Session:
    return Session(
        session_id=sid,
        requests=tuple(_req(2 + i, think=think if i else 0.0) for i in range(n)),
        subagents=subagents,
        block_size=4,
        start_s=start,
    )


def _tree(sid: str) -> Session:
    sub_a = Subagent(
        session=_session(f"{sid}/a", 2), anchor_index=0, join_index=1, agent_id="a"
    )
    sub_b = Subagent(
        session=_session(f"{sid}/b", 3), anchor_index=0, join_index=1, agent_id="b"
    )
    bg = Subagent(
        session=_session(f"{sid}/bg", 2), anchor_index=2, join_index=None, agent_id="bg"
    )
    return _session(sid, 3, subagents=(sub_a, sub_b, bg))


def _config(url: str, **kw: Any) -> ReplayConfig:
    api = kw.pop("api", "completions")
    return ReplayConfig(
        endpoint=EndpointConfig(
            base_url=url, model="fake-model", api=api, api_key=kw.pop("api_key", None)
        ),
        prompt=PromptConfig(api=api, salt="test"),
        flush_interval_s=0.2,
        scrape_interval_s=0.0,
        **kw,
    )


async def _serve(aiohttp_server: Serve, fake: FakeLLM) -> str:
    server = await aiohttp_server(make_fake_llm_app(fake), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


def _rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "requests").sort_values(
        "start_ns", na_position="last"
    )


async def test_run_session_tree_order_spawn_and_join(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(itl_s=0.002))
    trace = Trace(sessions=(_tree("s1"), _tree("s2")))
    summary = await replay_trace(trace, _config(url, concurrency=2), tmp_path / "run")
    df = _rows(tmp_path / "run")
    assert summary.ok == len(df) == trace.request_count() == 2 * (3 + 2 + 3 + 2)
    assert (df["status"] == "ok").all()
    for root in ("s1", "s2"):
        tree = df[df["root_session_id"] == root]
        by = {
            sid: g.sort_values("request_index") for sid, g in tree.groupby("session_id")
        }
        for g in by.values():  # turns of one session never overlap
            assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()
        parent = by[root]
        anchor_end = parent.iloc[0]["end_ns"]
        join_start = parent.iloc[1]["start_ns"]
        for sub in ("a", "b"):
            s = by[f"{root}/{sub}"]
            assert s["start_ns"].min() >= anchor_end  # spawned after its anchor
            assert s["end_ns"].max() <= join_start  # the join waits for it
            assert (s["parent_session_id"] == root).all()
            assert (s["agent_depth"] == 1).all()
        assert by[f"{root}/bg"]["start_ns"].min() >= parent.iloc[2]["end_ns"]
        # The two joined subagents ran in parallel.
        a, b = by[f"{root}/a"], by[f"{root}/b"]
        assert a["start_ns"].min() < b["end_ns"].max()
        assert b["start_ns"].min() < a["end_ns"].max()


async def test_run_failure_skips_rest_of_session(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(fail_first=1))
    trace = Trace(sessions=(_tree("s1"),))
    summary = await replay_trace(trace, _config(url), tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert len(df) == trace.request_count()  # every request has a row
    first = df[(df["session_id"] == "s1") & (df["request_index"] == 0)].iloc[0]
    assert first["status"] == "http_error"
    assert first["http_status"] == 500
    assert (df.drop(first.name)["status"] == "skipped").all()
    assert summary.failed == 1
    assert summary.skipped == len(df) - 1


async def test_run_concurrency_lanes_cover_whole_trees(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    fake = FakeLLM(itl_s=0.003)
    url = await _serve(aiohttp_server, fake)
    trace = Trace(sessions=tuple(_tree(f"s{i}") for i in range(5)))
    await replay_trace(trace, _config(url, concurrency=2), tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run" / "requests")
    spans = df.groupby("root_session_id").agg(
        lo=("start_ns", "min"), hi=("end_ns", "max")
    )
    events = sorted(
        [(lo, 1) for lo in spans["lo"]] + [(hi, -1) for hi in spans["hi"]],
        key=lambda e: (e[0], e[1]),
    )
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 2
    assert df["lanes_at_send"].max() <= 2


async def test_run_think_gaps_scaled(aiohttp_server: Serve, tmp_path: Path) -> None:
    url = await _serve(aiohttp_server, FakeLLM())
    trace = Trace(sessions=(_session("s", 3, think=1.0),))
    await replay_trace(trace, _config(url, think_scale=0.1), tmp_path / "run")
    g = _rows(tmp_path / "run")
    gaps = g["start_ns"].to_numpy()[1:] - g["end_ns"].to_numpy()[:-1]
    assert (gaps >= 0.1e9).all()
    assert (gaps < 0.1e9 + 300e6).all()
    lag = g["start_ns"] - g["scheduled_ns"]
    assert (lag >= 0).all()
    assert (lag < 300e6).all()


async def test_run_timestamps_mode_uses_arrivals(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM())
    trace = Trace(
        sessions=tuple(_session(f"m{i}", 1, start=10.0 + i) for i in range(4))
    )
    await replay_trace(
        trace, _config(url, mode="timestamps", speedup=10.0), tmp_path / "run"
    )
    df = _rows(tmp_path / "run")
    assert list(df["scheduled_ns"]) == [int(i * 0.1e9) for i in range(4)]
    # Generous: the machine is shared; exact lag figures belong in benchmarks.
    assert (df["start_ns"] - df["scheduled_ns"] < 300e6).all()


async def test_run_session_rate_arrivals_are_seeded(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM())
    trace = Trace(sessions=tuple(_session(f"r{i}", 1) for i in range(6)))
    starts = []
    for k in range(2):
        await replay_trace(
            trace,
            _config(url, mode="session_rate", session_rate=50.0, seed=3),
            tmp_path / f"run{k}",
        )
        starts.append(list(_rows(tmp_path / f"run{k}")["scheduled_ns"]))
    assert starts[0] == starts[1]
    gaps = np.diff(starts[0])
    assert (gaps > 0).all()
    assert gaps.mean() < 0.2e9


async def test_run_duration_cancel_drains_with_cancelled_rows(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(itl_s=0.05))
    trace = Trace(sessions=tuple(_session(f"d{i}", 5) for i in range(3)))
    cfg = _config(url, concurrency=3, duration_s=0.3, drain="cancel")
    cfg_tokens = 40  # each request streams ~3 tokens x 50 ms
    del cfg_tokens
    summary = await replay_trace(trace, cfg, tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert summary.duration_s < 2.0
    assert (df["status"] == "cancelled").sum() >= 1
    assert len(df) < trace.request_count()


async def test_run_cancelled_midway_leaves_readable_run(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(itl_s=0.05))
    trace = Trace(sessions=tuple(_session(f"c{i}", 4) for i in range(2)))
    task = asyncio.ensure_future(
        replay_trace(trace, _config(url, concurrency=2), tmp_path / "run")
    )
    await asyncio.sleep(0.4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert (df["status"] == "cancelled").sum() == 2
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["interrupted"] is True


async def test_run_directory_schema_metadata_and_no_secret(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(cached_tokens=4))
    trace = Trace(sessions=(_session("s", 3),))
    cfg = _config(
        url,
        api_key="sk-very-secret",
        warmup_s=0.0,
        labels={"engine": "fake", "gpus": 2},
    )
    await replay_trace(trace, cfg, tmp_path / "run")
    parts = sorted((tmp_path / "run" / "requests").glob("part-*.parquet"))
    assert parts
    table = pq.read_table(parts[0])
    assert table.schema.remove_metadata() == RECORD_SCHEMA
    meta_bytes = table.schema.metadata[b"replayer.run"]
    run_json = (tmp_path / "run" / "run.json").read_text()
    for blob in (meta_bytes.decode(), run_json):
        assert "sk-very-secret" not in blob
    meta = json.loads(run_json)
    assert meta["labels"]["engine"] == "fake"
    assert meta["counts"]["ok"] == 3
    assert meta["config"]["endpoint"]["api_key_set"] is True
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert (df["cached_tokens"] == 4).all()
    assert (df["output_tokens"] == df["requested_output_tokens"]).all()


async def test_run_chat_body_is_text_messages(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    fake = FakeLLM()
    url = await _serve(aiohttp_server, fake)
    trace = Trace(sessions=(_session("s", 2),))
    await replay_trace(trace, _config(url, api="chat"), tmp_path / "run")
    body = fake.bodies[-1]
    assert body["messages"][0]["role"] == "system"
    assert body["max_tokens"] == 3
    assert body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_run_wrong_model_is_an_endpoint_error(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM())
    cfg = ReplayConfig(
        endpoint=EndpointConfig(base_url=url, model="nope"), scrape_interval_s=0
    )
    with pytest.raises(EndpointError, match="does not serve model 'nope'"):
        await replay_trace(Trace(sessions=(_session("s", 1),)), cfg, tmp_path / "run")


async def test_run_recorder_loses_no_rows_under_frequent_flushes(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # Flushes every few ms race the final flush: every row must still land once.
    url = await _serve(aiohttp_server, FakeLLM())
    trace = Trace(sessions=tuple(_session(f"f{i}", 6) for i in range(8)))
    cfg = _config(url, concurrency=8)
    for k in range(3):
        from dataclasses import replace

        cfg_k = replace(cfg, flush_interval_s=0.003)
        summary = await replay_trace(trace, cfg_k, tmp_path / f"run{k}")
        df = pd.read_parquet(tmp_path / f"run{k}" / "requests")
        assert len(df) == summary.ok == trace.request_count()
        assert not df.duplicated(["session_id", "request_index"]).any()


async def test_run_global_prefix_shared_by_subagents(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # In a global-scope trace, a subagent (read from Weka as "local") shares the
    # trace-wide namespace of its root: equal hash ids must send equal tokens.
    fake = FakeLLM()
    url = await _serve(aiohttp_server, fake)

    def one(first: int, n: int = 3) -> tuple[Request, ...]:
        return (_req(n, first=first),)

    sub = Subagent(
        session=Session(session_id="b/sub", requests=one(1), block_size=4),
        anchor_index=0,
        join_index=None,
        agent_id="sub",
    )
    a = Session(session_id="a", requests=one(1), block_size=4, hash_id_scope="global")
    b = Session(
        session_id="b",
        requests=one(100),
        subagents=(sub,),
        block_size=4,
        hash_id_scope="global",
    )
    await replay_trace(Trace(sessions=(a, b)), _config(url), tmp_path / "run")
    # Concurrency 1: tree a, then tree b's request, then its subagent.
    a_prompt, b_prompt, sub_prompt = (body["prompt"] for body in fake.bodies)
    assert sub_prompt[:12] == a_prompt[:12]  # hash ids 1..3, 4 tokens each
    assert b_prompt[:12] != a_prompt[:12]
