"""The client's self-check: the verdict and its merge over workers, the status line,
and, end to end, a client overloaded on purpose (tiny think gaps against a zero-delay
server, one worker sharing one core with busy loops) flagged by `run` and `analyze`,
while the same run with enough workers (two, on any core) is not."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from replayer.clock import MonotonicClock
from replayer.play.progress import Progress, RunCounters
from replayer.play.selfcheck import LoopMonitor, merge_checks
from replayer.records import ClientCheck
from tests.builders import growing_session, trace_of
from tests.instant_server import answer, next_request
from traces.io import write_trace

REPO = Path(__file__).resolve().parents[2]
REPLAYER = [sys.executable, "-m", "replayer"]
MS = 1_000_000


def test_selfcheck_verdict_names_each_limit_crossed() -> None:
    counters = RunCounters()
    monitor = LoopMonitor(MonotonicClock(), counters)
    assert not monitor.check().limited
    monitor.lags_ns.extend([1_000_000] * 98 + [200_000_000] * 2)
    monitor.loop_cpu.extend([0.95, 0.97, 0.2])
    counters.pool_waits_ns.extend([0] * 97 + [30_000_000] * 3)
    counters.slot_waits_ns.extend([0] * 97 + [30_000_000] * 3)
    counters.connects_ns.extend([0] * 100)
    counters.dispatch_lags_ns.extend([0] * 100)
    check = monitor.check()
    assert check.limited
    assert [r.split()[0] for r in check.reasons] == [
        "event-loop",
        "event-loop",
        "connection-slot",
    ]
    assert check.loop_cpu_share["p50"] == pytest.approx(0.95)
    assert check.dispatch_lag_ms["max"] == 0.0
    assert check.server_notes == ()


def test_selfcheck_lag_without_load_blames_the_machine_not_the_client_work() -> None:
    # A loop late by 200 ms while its process used 7% of a core was ready and not
    # scheduled: a server on the same cores (vLLM's CPU build beside the replayer
    # did this). Still limited (every stamp is late), but the reason says why, so
    # the advice is other cores, not more workers.
    counters = RunCounters()
    monitor = LoopMonitor(MonotonicClock(), counters)
    monitor.lags_ns.extend([1_000_000] * 95 + [200_000_000] * 5)
    monitor.loop_cpu.extend([0.05] * 10)
    monitor.process_cpu.extend([0.07] * 10)
    check = monitor.check()
    assert check.limited
    (reason,) = check.reasons
    assert reason.startswith("event-loop lag P99 200 ms > 50 ms with this process at 7")
    assert "other processes held this machine's CPUs" in reason
    # The same lag with the process busy is the client's own load: no such clause.
    monitor.process_cpu[:] = monitor.process_cpu.__class__("d", [0.95] * 10)
    (reason,) = monitor.check().reasons
    assert reason == "event-loop lag P99 200 ms > 50 ms"


def test_selfcheck_late_sends_name_their_slowest_part() -> None:
    # 8 lanes' first sends queued behind each other's prompt builds: late by up to
    # 80 ms with an idle loop. The reason says which part of the send was slow.
    counters = RunCounters()
    monitor = LoopMonitor(MonotonicClock(), counters)
    counters.dispatch_lags_ns.extend([1 * MS] * 95 + [80 * MS] * 5)
    counters.wake_lags_ns.extend([1 * MS] * 100)
    counters.build_waits_ns.extend([0] * 95 + [78 * MS] * 5)
    monitor.process_cpu.extend([0.1] * 10)
    (reason,) = monitor.check().reasons
    assert reason.startswith("requests sent late: dispatch lag P99 80 ms > 50 ms")
    assert "most of it building prompts (with the wait for the build thread)" in reason
    assert ": P99 78.0 ms (wake P99 1.0 ms, rest P99 1.0 ms)" in reason
    assert "other processes" not in reason
    # Late wake-ups with a loop on time by its probe: sends due together.
    counters.wake_lags_ns[:] = counters.dispatch_lags_ns
    counters.build_waits_ns[:] = counters.build_waits_ns.__class__("q", [0] * 100)
    monitor.lags_ns.extend([1 * MS] * 100)
    (reason,) = monitor.check().reasons
    assert "most of it the event loop waking up late: P99 80" in reason
    assert "many sends due at the same moment" in reason
    # ... and with a late loop in a process that barely ran: the machine's CPUs.
    monitor.lags_ns.extend([200 * MS] * 10)
    reason = monitor.check().reasons[-1]
    assert "most of it the event loop waking up late: P99 80" in reason
    assert "other processes held this machine's CPUs" in reason


def test_selfcheck_slow_connects_are_the_servers_said_not_flagged() -> None:
    counters = RunCounters()
    monitor = LoopMonitor(MonotonicClock(), counters)
    counters.pool_waits_ns.extend([0] * 90 + [1_000_000_000] * 10)
    counters.slot_waits_ns.extend([0] * 100)
    counters.connects_ns.extend([0] * 90 + [1_000_000_000] * 10)
    counters.dispatch_lags_ns.extend([0] * 100)
    check = monitor.check()
    assert not check.limited, check.reasons
    assert check.connect_ms["p99"] == pytest.approx(1000.0)
    assert check.pool_wait_ms["p99"] == pytest.approx(1000.0)
    assert check.slot_wait_ms["p99"] == 0.0
    (note,) = check.server_notes
    assert note.startswith("server slow to accept connections: connect P99 1,000.0 ms")
    merged = merge_checks({0: check, 1: ClientCheck(limited=False)})
    assert merged is not None
    assert merged.limited is False
    assert merged.server_notes == (f"worker 0: {note}",)
    assert merged.connect_ms["p99"] == pytest.approx(1000.0)


def test_selfcheck_merge_is_the_worst_worker_and_names_it() -> None:
    calm = ClientCheck(limited=False, loop_lag_ms={"p99": 2.0})
    busy = ClientCheck(limited=True, reasons=("lag",), loop_lag_ms={"p99": 90.0})
    merged = merge_checks({0: calm, 1: busy})
    assert merged is not None
    assert merged.limited is True
    assert merged.reasons == ("worker 1: lag",)
    assert merged.loop_lag_ms == {"p99": 90.0}
    assert merged.workers is not None
    assert set(merged.workers) == {"0", "1"}
    assert merge_checks({}) is None


def test_selfcheck_status_line_says_client_limited() -> None:
    counters = RunCounters(client_limit="event-loop lag P99 80 ms > 50 ms")
    clock = MonotonicClock()
    line = Progress(counters, clock, clock.now_ns(), 10, io.StringIO()).line()
    assert line.endswith("CLIENT-LIMITED: event-loop lag P99 80 ms > 50 ms")
    counters.client_limit = None
    assert "CLIENT" not in Progress(counters, clock, 0, 10, io.StringIO()).line()


@pytest.fixture(scope="module")
def instant_server() -> Iterator[str]:
    """The zero-delay endpoint in its own process, on any core: its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.instant_server", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1]
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _command(trace: Path, url: str, out: Path, *args: str) -> list[str]:
    return [*REPLAYER, "run", str(trace), "--endpoint", url, "--warmup", "1",
            "--duration", "5", "--out", str(out), "--quiet", *args]  # fmt: skip


# Each subprocess is waited for at most this long (a run: start-up, its 6 s or its
# trace, the end; an analyze), and a test that makes them is given the sum of its
# waits plus _MARGIN_S as its timeout: a run that overruns fails the test with its
# own error, its pipes closed, before pytest-timeout would stop it.
_RUN_WAIT_S = 90
_ANALYZE_WAIT_S = 30
_MARGIN_S = 10


def _timeout(*, runs: int, analyses: int) -> pytest.MarkDecorator:
    """The timeout of a test whose path (its fixtures' included) waits for ``runs``
    runs and ``analyses`` analyses."""
    return pytest.mark.timeout(
        runs * _RUN_WAIT_S + analyses * _ANALYZE_WAIT_S + _MARGIN_S
    )


def _run(
    trace: Path, url: str, out: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(trace, url, out, *args),
        capture_output=True,
        text=True,
        timeout=_RUN_WAIT_S,
        check=False,
    )


def _run_starved(
    trace: Path, url: str, out: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The run on one core that, once the run has started (its run.json written,
    start-up done at full speed), it shares with _HOGS busy loops for 6 s (the run
    lasts 5)."""
    core = min(os.sched_getaffinity(0))
    pin = functools.partial(os.sched_setaffinity, 0, {core})
    deadline = time.monotonic() + _RUN_WAIT_S
    hogs: list[subprocess.Popen[Any]] = []
    # Leaving the with-block closes the pipes and reaps the run, on every path.
    with subprocess.Popen(
        _command(trace, url, out, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=pin,
    ) as proc:
        try:
            while not (out / "run.json").exists() and proc.poll() is None:
                assert time.monotonic() < deadline, "the run did not start"
                time.sleep(0.02)
            spin = (
                "import time\nend = time.monotonic() + 6\n"
                "while time.monotonic() < end: 0"
            )
            hogs = [
                subprocess.Popen([sys.executable, "-c", spin], preexec_fn=pin)
                for _ in range(_HOGS)
            ]
            left = max(0.0, deadline - time.monotonic())
            stdout, stderr = proc.communicate(timeout=left)
        finally:
            for p in [*hogs, proc]:
                p.kill()
                p.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _analyze(run_dir: Path, *args: str) -> str:
    return subprocess.run(
        [*REPLAYER, "analyze", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=_ANALYZE_WAIT_S,
        check=True,
    ).stdout


# The pair below differs only in the CPU the client gets. The offered load is set
# from the client's own CPU cost per request, measured here first (CPU time per
# request hardly depends on what else the machine runs, unlike requests/s): it asks
# for _LOAD_CORES of a core (open-loop requests cost more: about twice that, seen).
# The overloaded client shares one core with _HOGS busy loops, so it gets at most
# 1/(_HOGS + 1) of it (less on a busy machine): under half what it needs. With
# enough workers (two, on any core) each needs under a tenth of a core, which a
# machine with other load still gives.
_LOAD_CORES = 0.15
_HOGS = 11
_TURNS = 5  # requests per session: 10 ms think gaps, 4 output tokens each


@pytest.fixture(scope="module")
def busy_trace(instant_server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sessions at a rate that asks _LOAD_CORES of a core of this client."""
    tmp = tmp_path_factory.mktemp("selfcheck")
    sessions = (
        growing_session(f"s{k}", _TURNS, think=0.01, out=4) for k in range(4000)
    )
    trace = write_trace(trace_of(*sessions), tmp / "calibrate.jsonl")
    calibrate = _run(trace, instant_server, tmp / "calibrate", "--concurrency", "16",
                     "--think-scale", "0")  # fmt: skip
    assert calibrate.returncode == 0, calibrate.stderr
    summary = json.loads(_analyze(tmp / "calibrate", "--json"))
    cores = summary["client_check"]["process_cpu_cores"]["p50"]
    cpu_per_request_s = cores / summary["throughput_tok_s"]["requests"]
    session_rate = _LOAD_CORES / cpu_per_request_s / _TURNS
    n = int(session_rate * 10) + 100  # more than the 6-s run starts
    sessions = (growing_session(f"s{k}", _TURNS, think=0.01, out=4) for k in range(n))
    trace = write_trace(trace_of(*sessions), tmp / "t.jsonl")
    (tmp / "rate").write_text(f"{session_rate:.1f}")
    return trace


def _session_rate(trace: Path) -> str:
    return (trace.parent / "rate").read_text()


# The fixture's calibration (a run, an analysis) counts in the first test to use it.
@_timeout(runs=2, analyses=2)
def test_selfcheck_flags_a_client_overloaded_on_purpose(
    instant_server: str, busy_trace: Path, tmp_path: Path
) -> None:
    # One worker sharing one core with busy loops cannot keep up.
    rate = _session_rate(busy_trace)
    over = _run_starved(busy_trace, instant_server, tmp_path / "over",
                        "--session-rate", rate, "--workers", "1")  # fmt: skip
    assert over.returncode == 0, over.stderr
    assert "CLIENT-LIMITED" in over.stderr
    meta = json.loads((tmp_path / "over" / "run.json").read_text())
    assert meta["client_check"]["limited"] is True
    text = _analyze(tmp_path / "over")
    assert "over: CLIENT-LIMITED: the replayer, not the server" in text
    assert "client: loop lag p99 (ms)" in text
    df = pd.read_parquet(tmp_path / "over" / "requests")
    sent = df[df["status"] == "ok"]
    assert sent["pool_wait_ns"].notna().all()
    assert (sent["pool_wait_ns"] >= 0).all()


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two cores for two workers"
)
@_timeout(runs=2, analyses=2)
def test_selfcheck_same_run_with_enough_workers_is_not_flagged(
    instant_server: str, busy_trace: Path, tmp_path: Path
) -> None:
    enough = _run(busy_trace, instant_server, tmp_path / "enough", "--session-rate",
                  _session_rate(busy_trace), "--workers", "2")  # fmt: skip
    assert enough.returncode == 0, enough.stderr
    assert "CLIENT-LIMITED" not in enough.stderr, enough.stderr
    check = json.loads(_analyze(tmp_path / "enough", "--json"))["client_check"]
    assert check["limited"] is False, check["reasons"]
    assert check["pool_wait_ms"]["count"] > 0


def _serve_slowly(listener: socket.socket, stop: threading.Event) -> None:
    """Accept one connection every _ACCEPT_EVERY_S, answer its one request (the
    instant endpoint's reply) and close it; the kernel holds or drops the SYNs
    of the others meanwhile (backlog 1)."""
    while not stop.wait(_ACCEPT_EVERY_S):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            buf = b""
            with contextlib.suppress(OSError):
                while (request := next_request(buf)) is None:
                    data = conn.recv(65536)
                    if not data:
                        break
                    buf += data
                if request is not None:
                    conn.sendall(answer(*request[:2]))


_ACCEPT_EVERY_S = 0.05


@pytest.fixture
def slow_accept_server() -> Iterator[str]:
    """A server on 127.0.0.1 slow to accept connections on purpose (one thread,
    listen backlog 1, one accept() every 50 ms): its URL."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        stop = threading.Event()
        thread = threading.Thread(target=_serve_slowly, args=(listener, stop))
        thread.start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            stop.set()
            thread.join()


@_timeout(runs=1, analyses=2)
def test_selfcheck_reports_a_server_slow_to_accept_without_flagging_the_client(
    slow_accept_server: str, tmp_path: Path
) -> None:
    # Each request opens a connection (--no-keepalive) that the server is slow to
    # accept: connect time, the server's, not the client's (whose loop idles).
    sessions = (growing_session(f"s{k}", 5, out=4) for k in range(32))
    trace = write_trace(trace_of(*sessions), tmp_path / "t.jsonl")
    out = tmp_path / "slow"
    command = [*REPLAYER, "run", str(trace), "--endpoint", slow_accept_server,
               "--concurrency", "8", "--no-keepalive", "--think-scale", "0",
               "--warmup", "0", "--out", str(out), "--quiet"]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=_RUN_WAIT_S, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "CLIENT-LIMITED" not in run.stderr, run.stderr
    assert "server slow to accept connections: connect P99" in run.stderr
    check = json.loads((out / "run.json").read_text())["client_check"]
    assert check["limited"] is False, check["reasons"]
    assert check["connect_ms"]["p99"] > 10
    assert check["slot_wait_ms"]["p99"] < 10
    df = pd.read_parquet(out / "requests")
    sent = df[df["status"] == "ok"]
    assert len(sent) >= 100  # enough for the self-check to judge a P99
    assert (sent["pool_wait_ns"] == sent["slot_wait_ns"] + sent["connect_ns"]).all()
    text = _analyze(out)
    assert "slow: server slow to accept connections: connect P99" in text
    assert "server: connect p99 (ms)" in text
    assert "CLIENT-LIMITED" not in text
    summary = json.loads(_analyze(out, "--json"))["client_check"]
    assert summary["connect_ms"]["count"] >= len(sent)
    assert summary["pool_wait_ms"]["p99"] >= summary["connect_ms"]["p99"]
