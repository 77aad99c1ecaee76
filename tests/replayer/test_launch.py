"""The library entry against real servers on loopback: the run directory (Parquet
rows, run.json as a RunMeta, no secrets), the startup check, cancellation, and
``replay()`` from a script with the built-in simulated endpoint."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer

from replayer.config import EndpointConfig, Lanes, ReplayConfig
from replayer.errors import ConfigError, EndpointError
from replayer.launch import replay
from replayer.records import RECORD_SCHEMA, RUN_METADATA_KEY, ModeInfo, RunMeta
from replayer.runner.local import replay_trace
from tests.builders import agent_tree, growing_session, trace_of
from tests.fakes import FakeLLM, engine_config, make_fake_llm_app
from traces.io import write_trace
from traces.materialize import PromptConfig

Serve = Callable[..., Awaitable[TestServer]]


async def _serve(aiohttp_server: Serve, fake: FakeLLM) -> str:
    server = await aiohttp_server(make_fake_llm_app(fake), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("in_url", [True, False], ids=["url-credentials", "api-key"])
async def test_launch_run_directory_metadata_and_no_secret(
    aiohttp_server: Serve, tmp_path: Path, in_url: bool
) -> None:
    url = await _serve(aiohttp_server, FakeLLM(cached_tokens=4))
    secret_url = url.replace("http://", "http://user:url-secret@")
    trace = trace_of(growing_session("s", 3))
    cfg = engine_config(
        secret_url if in_url else url,
        api_key=None if in_url else "sk-very-secret",
        labels={"engine": "fake", "gpus": 2},
    )
    summary = await replay_trace(trace, cfg, tmp_path / "run")
    parts = sorted((tmp_path / "run" / "requests").glob("part-*.parquet"))
    assert parts
    table = pq.read_table(parts[0])
    assert table.schema.remove_metadata() == RECORD_SCHEMA
    run_json = (tmp_path / "run" / "run.json").read_text()
    for blob in (table.schema.metadata[RUN_METADATA_KEY].decode(), run_json):
        assert "sk-very-secret" not in blob
        assert "url-secret" not in blob
    meta = RunMeta.from_dict(json.loads(run_json))
    assert meta.complete
    assert meta.endpoint == url
    assert meta.labels["engine"] == "fake"
    assert meta.counts is not None
    assert meta.counts.ok == 3 == summary.ok
    assert meta.mode == ModeInfo(kind="concurrency", concurrency=1)
    assert meta.config.api_key_set is not in_url
    assert meta.trace.requests == 3
    assert meta.trace.ideal_cache_hit_rate == pytest.approx((8 + 12) / (10 + 14 + 18))
    # Every part file carries the final metadata too (a lost run.json costs nothing).
    last = pq.read_schema(parts[-1]).metadata[RUN_METADATA_KEY]
    assert RunMeta.from_dict(json.loads(last)).complete
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert (df["cached_tokens"] == 4).all()
    assert (df["output_tokens"] == df["requested_output_tokens"]).all()


async def test_launch_wrong_model_is_an_endpoint_error(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    url = await _serve(aiohttp_server, FakeLLM())
    cfg = replace(
        engine_config(url),
        endpoint=EndpointConfig(base_url=url.replace("://", "://u:pw@"), model="nope"),
    )
    with pytest.raises(EndpointError, match="does not serve model 'nope'") as info:
        await replay_trace(trace_of(growing_session("s", 1)), cfg, tmp_path / "run")
    assert "pw" not in str(info.value)


async def test_launch_cancelled_midway_leaves_readable_run_and_no_task(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # Each first request streams for 50 s: both are in flight when the cancel
    # comes, however slowly this machine got them there.
    fake = FakeLLM(itl_s=0.05)
    url = await _serve(aiohttp_server, fake)
    trace = trace_of(*(growing_session(f"c{i}", 4, out=1000) for i in range(2)))
    cfg = engine_config(url, schedule=Lanes(concurrency=2), duration_s=3600.0)
    task = asyncio.ensure_future(replay_trace(trace, cfg, tmp_path / "run"))
    while fake.active < 2:  # noqa: ASYNC110 - the server's count, no event
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert (df["status"] == "cancelled").sum() == 2
    meta = RunMeta.from_dict(json.loads((tmp_path / "run" / "run.json").read_text()))
    assert meta.interrupted is True
    assert meta.counts is not None
    assert meta.counts.cancelled == 2
    # Nothing of the run is left behind: no sleeper waiting for the hour to pass.
    await asyncio.sleep(0)
    left = [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and "sleep_until" in repr(t.get_coro())
    ]
    assert left == []


async def test_launch_recorder_loses_no_rows_under_frequent_flushes(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # Flushes every few ms race the final flush: every row must still land once.
    url = await _serve(aiohttp_server, FakeLLM())
    trace = trace_of(*(growing_session(f"f{i}", 6) for i in range(8)))
    cfg = engine_config(url, schedule=Lanes(concurrency=8), flush_interval_s=0.003)
    for k in range(3):
        summary = await replay_trace(trace, cfg, tmp_path / f"run{k}")
        df = pd.read_parquet(tmp_path / f"run{k}" / "requests")
        assert len(df) == summary.ok == trace.request_count()
        assert not df.duplicated(["session_id", "request_index"]).any()


def test_launch_replay_from_a_script_with_the_builtin_sim(tmp_path: Path) -> None:
    # What the README shows: a trace file, a typed config, a run directory.
    path = write_trace(
        trace_of(agent_tree("s1"), agent_tree("s2")), tmp_path / "t.jsonl"
    )
    config = ReplayConfig(
        endpoint=EndpointConfig(),  # no URL: the built-in simulated endpoint
        schedule=Lanes(concurrency=2),
        think_scale=0.0,
        sim_args=("--speed", "50"),
    )
    summary = replay(path, config, tmp_path / "run")
    assert summary.ok == summary.requests == 20
    meta = RunMeta.from_dict(json.loads((tmp_path / "run" / "run.json").read_text()))
    assert meta.simulated is True
    assert meta.model  # resolved from the server's model list
    assert meta.trace.content_hash is not None
    with pytest.raises(ConfigError, match="already holds a run"):
        replay(path, config, tmp_path / "run")


def test_launch_config_rejects_contradictions() -> None:
    with pytest.raises(ConfigError, match="--loop needs --duration"):
        ReplayConfig(endpoint=EndpointConfig(), loop=True)
    with pytest.raises(ConfigError, match="concurrency must be >= 1"):
        Lanes(concurrency=0)
    with pytest.raises(ConfigError, match="http"):
        EndpointConfig(base_url="localhost:8000")
    with pytest.raises(ConfigError, match="give one of them") as info:
        EndpointConfig(base_url="http://u:pw@127.0.0.1:1", api_key="k")
    assert "pw" not in str(info.value)
    assert PromptConfig().salt == ""


async def test_launch_counts_what_the_server_ignored_and_keeps_errors_plain(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # A server that ignores "stream" and max_tokens (one JSON response, 1 token) is
    # counted, never silently ok; an HTML error page becomes one plain line.
    from aiohttp import web

    calls = 0

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def complete(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 2:
            page = "<html><body><h1>500 Internal Server Error</h1>\n<p>boom</p></body>"
            return web.Response(status=500, text=page, content_type="text/html")
        usage = {"prompt_tokens": 10, "completion_tokens": 1}
        return web.json_response({"choices": [{"text": "x"}], "usage": usage})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    server = await aiohttp_server(app, host="127.0.0.1")
    trace = trace_of(growing_session("a", 1), growing_session("b", 1))
    summary = await replay_trace(
        trace, engine_config(f"http://127.0.0.1:{server.port}"), tmp_path / "run"
    )
    df = pd.read_parquet(tmp_path / "run" / "requests").sort_values("start_ns")
    ok, failed = df.iloc[0], df.iloc[1]
    assert ok["status"] == "ok"
    assert ok["error_type"] == "not_streamed"
    assert ok["output_tokens"] == 1
    assert summary.counts.not_streamed == 1
    assert summary.counts.short_output == 1
    assert failed["status"] == "http_error"
    assert failed["error_message"] == "500 Internal Server Error boom"
    assert summary.counts.http_error == 1
    assert summary.counts.error_rate == 0.5


_SECRETS = {
    "bearer": "s-bearer",
    "JWT": "s-jwt",
    "code": "s-code",
    "refresh_token": "s-token",
    "client-secret": "s-secret",
    "apiKey": "s-key",
    "x-auth": "s-auth",
    "passphrase": "s-pass",
    "X-Amz-Signature": "s-sig",
}


@pytest.mark.parametrize("name", sorted(_SECRETS))
def test_public_url_hides_secret_parameters_and_keeps_the_rest(name: str) -> None:
    from replayer.config import public_url

    url = f"http://u:pw@127.0.0.1:8000/v1?{name}={_SECRETS[name]}&zipcode=9&keep=yes"
    shown = public_url(url)
    assert shown == f"http://127.0.0.1:8000/v1?{name}=***&zipcode=9&keep=yes"


async def test_launch_writes_no_url_secret_anywhere(
    aiohttp_server: Serve, tmp_path: Path
) -> None:
    # The server quotes the URL it was called on in its error body, as some
    # gateways do: the row's error message must not carry the secrets either.
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def complete(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"message": f"no route for {request.url}"}}, status=404
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    server = await aiohttp_server(app, host="127.0.0.1")
    query = "&".join(f"{k}={v}" for k, v in _SECRETS.items())
    url = f"http://user:s-userinfo@127.0.0.1:{server.port}/v1?{query}&region=eu"
    await replay_trace(
        trace_of(growing_session("s", 1)), engine_config(url), tmp_path / "run"
    )
    parts = sorted((tmp_path / "run" / "requests").glob("part-*.parquet"))
    df = pd.read_parquet(tmp_path / "run" / "requests")
    assert df["error_message"].str.contains("no route for http://").all()
    blobs = [
        (tmp_path / "run" / "run.json").read_text(),
        *(pq.read_schema(p).metadata[RUN_METADATA_KEY].decode() for p in parts),
        *df["error_message"],
    ]
    for blob in blobs:
        for secret in [*_SECRETS.values(), "s-userinfo"]:
            assert secret not in blob
    meta = RunMeta.from_dict(json.loads(blobs[0]))
    assert meta.endpoint is not None
    assert meta.endpoint.endswith("&region=eu")


async def test_merged_run_json_counts_a_killed_workers_flushed_rows(
    tmp_path: Path,
) -> None:
    # Worker 1 was killed: its run-worker file still holds the start (no counts),
    # but its flushed part files are in the folder and must be counted.
    from replayer.records.rundir import read_run_json, write_run_json
    from replayer.runner.workers import _merge, _worker_json, worker_config
    from tests.fakes import FakeChatClient, FakeClock

    trace = trace_of(*(growing_session(f"s{k}", 3 + k) for k in range(4)))
    config = engine_config(schedule=Lanes(concurrency=2), workers=2)
    run_dir = tmp_path / "run"
    for k in (0, 1):
        clock = FakeClock()
        await replay_trace(
            trace,
            worker_config(config, k),
            run_dir,
            worker_id=k,
            clock=clock,
            client=FakeChatClient(clock, fail=frozenset({2})),
            run_json_name=_worker_json(k),
        )
    killed = run_dir / _worker_json(1)
    start = replace(read_run_json(killed), counts=None, end_unix_ns=None)
    write_run_json(killed, start)
    merged = _merge(
        run_dir, config, RunMeta(), interrupted=False, error="worker 1 was killed"
    )
    df = pd.read_parquet(run_dir / "requests")
    assert sorted(df["worker_id"].unique()) == [0, 1]
    assert merged.counts is not None
    assert merged.counts.requests == len(df) == 3 + 4 + 5 + 6
    assert merged.counts.ok == (df["status"] == "ok").sum()
    assert merged.counts.http_error == (df["status"] == "http_error").sum() == 2
    assert merged.counts.skipped == (df["status"] == "skipped").sum()
    assert merged.counts.trace_requests == 18
    on_disk = read_run_json(run_dir / "run.json")
    assert on_disk.counts == merged.counts


def test_launch_sigterm_as_the_work_ends_is_not_a_success() -> None:
    # The signal is sent by the work itself as its last act: its handler runs once
    # the task is done, when cancelling no longer does anything.
    code = (
        "import os, signal\n"
        "from replayer.runner.local import run_async\n"
        "async def work():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return 1\n"
        "try:\n"
        "    run_async(work)\n"
        "except KeyboardInterrupt:\n"
        "    raise SystemExit(130)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 130, res.stderr
