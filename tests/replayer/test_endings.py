"""How runs end: a server that stops answering stops the run (the watch in virtual
time, and through the real `replayer` command: one line, exit status 1), and
`analyze` says when a run did not end well."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from replayer.config import Lanes
from replayer.play.client import READ_TIMEOUT, Outcome, ServerWatch
from replayer.runner.local import replay_trace
from tests.builders import growing_session, trace_of
from tests.fakes import FakeChatClient, FakeClock, engine_config
from traces.io import write_trace

REPLAYER = [sys.executable, "-m", "replayer"]
S = 1_000_000_000


def _refused() -> Outcome:
    out = Outcome()
    out.fail("client_error", "ClientConnectorError", "Cannot connect to host")
    return out


def _answered(at_ns: int) -> Outcome:
    out = Outcome(http_status=200, last_byte_ns=at_ns)
    return out


def test_watch_counts_unanswered_requests_in_a_row() -> None:
    watch = ServerWatch(silence_ns=300 * S, refused_limit=20)
    for _ in range(19):
        assert watch.ended(_refused(), 1) is None
    assert watch.ended(_answered(1), 1) is None  # an answer starts the count again
    for _ in range(19):
        assert watch.ended(_refused(), 2) is None
    gone = watch.ended(_refused(), 2)
    assert gone is not None
    assert gone.startswith("20 requests in a row got no answer")
    assert "ClientConnectorError" in gone


def test_watch_read_timeout_with_every_request_silent() -> None:
    watch = ServerWatch(silence_ns=10 * S)
    watch.ended(_answered(5 * S), 5 * S)
    busy, silent = Outcome(), Outcome()
    watch.sent(busy)
    watch.sent(silent)
    timed_out = Outcome()
    watch.sent(timed_out)
    timed_out.fail("timeout", "TimeoutError", READ_TIMEOUT)
    busy.last_byte_ns = 12 * S  # another stream still got bytes 4 s ago
    assert watch.ended(timed_out, 16 * S) is None
    watch.sent(timed_out)
    gone = watch.ended(timed_out, 22 * S)  # nothing from anyone since 12 s
    assert gone is not None
    assert "read timeout (10 s)" in gone
    assert "3 requests in flight" in gone


class _Hung(FakeChatClient):
    """A server that accepts requests and never sends a byte: each request ends
    with a read timeout after ``read_timeout_ns``."""

    read_timeout_ns: int = 5 * S

    async def send(self, body, out=None, *, headers=None):  # type: ignore[no-untyped-def]
        out = out if out is not None else Outcome()
        self.bodies.append({})
        out.start_ns = self.clock.now_ns()
        await self.clock.sleep_until(out.start_ns + self.read_timeout_ns)
        out.fail("timeout", "TimeoutError", READ_TIMEOUT)
        out.end_ns = self.clock.now_ns()
        return out


async def test_run_stops_when_no_byte_comes_for_the_read_timeout(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    client = _Hung(clock)
    trace = trace_of(*(growing_session(f"s{k}", 5) for k in range(30)))
    config = engine_config(schedule=Lanes(concurrency=4))
    endpoint = replace(
        config.endpoint,
        base_url="http://127.0.0.1:9/v1?jwt=j-secret",
        read_timeout_s=5.0,
    )
    config = replace(config, endpoint=endpoint)
    summary = await replay_trace(
        trace, config, tmp_path / "run", clock=clock, client=client
    )
    # The 4 first requests hang together: the first read timeout ends the run, and
    # the 3 others in flight are cancelled, not waited out.
    assert len(client.bodies) == 4
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["error"].startswith(
        "the server at http://127.0.0.1:9/v1?jwt=*** stopped answering: no byte"
    )
    assert summary.counts.timeout == 1
    assert summary.counts.cancelled == 3
    assert summary.counts.requests == len(
        pd.read_parquet(tmp_path / "run" / "requests")
    )


@pytest.fixture
def sim() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`replayer sim` on a free loopback port, slow enough that a run lasts: the
    process and its base URL."""
    proc = subprocess.Popen(
        [*REPLAYER, "sim", "--host", "127.0.0.1", "--port", "0",
         "--accept-any-model", "--decode-base-ms", "20"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        match = re.search(r"http://\S+", proc.stdout.readline())
        assert match, "the simulator did not print its URL"
        yield proc, match.group(0)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.timeout(120)
def test_cli_run_stops_with_one_line_when_the_server_dies(
    tmp_path: Path, sim: tuple[subprocess.Popen[str], str]
) -> None:
    server, url = sim
    trace = write_trace(
        trace_of(*(growing_session(f"s{k}", 20, out=20) for k in range(60))),
        tmp_path / "t.jsonl",
    )
    run_dir = tmp_path / "run"
    endpoint = f"{url}/v1?token=tok-secret&code=code-secret"
    proc = subprocess.Popen(
        [*REPLAYER, "run", str(trace), "--endpoint", endpoint, "--model", "sim",
         "--concurrency", "4", "--out", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # The first rows flushed: some requests were answered before the death.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(
            (run_dir / "requests").glob("part-*.parquet")
        ):
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        server.send_signal(signal.SIGKILL)  # the server dies mid-run
        server.wait()
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "stopped answering" in line]
    assert len(said) == 1, err
    port_url = url.rstrip("/")
    assert (
        f"the server at {port_url}/v1?token=***&code=*** stopped answering" in (said[0])
    )
    meta = json.loads((run_dir / "run.json").read_text())
    df = pd.read_parquet(run_dir / "requests")
    for blob in (err, json.dumps(meta), *df["error_message"].dropna()):
        assert "tok-secret" not in blob
        assert "code-secret" not in blob
    assert "stopped answering" in meta["error"]
    analyzed = subprocess.run(
        [*REPLAYER, "analyze", str(run_dir), "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr
    info = json.loads(analyzed.stdout)["run"]
    assert info["complete"] is False
    assert info["incomplete_reason"].startswith("stopped by an error: the server at")
    assert meta["counts"]["requests"] == len(df)
    # It stopped soon after the server died, not after playing the whole trace.
    assert len(df) < 60 * 20 // 2
    assert (df["status"] == "ok").any()
    assert (df["status"] == "client_error").sum() >= 20
