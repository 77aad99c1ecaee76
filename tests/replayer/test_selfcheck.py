"""The client's self-check: the verdict and its merge over workers, the status line,
and, end to end, a client overloaded on purpose (one worker pinned to the core its
zero-delay server runs on, tiny think gaps) flagged by `run` and `analyze`, while
the same run with enough workers is not."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from replayer.clock import MonotonicClock
from replayer.progress import Progress, RunCounters
from replayer.selfcheck import LoopMonitor, merge_checks
from tests.builders import growing_session, trace_of
from traces.io import write_trace

REPO = Path(__file__).resolve().parents[2]
REPLAYER = [sys.executable, "-m", "replayer"]


def test_selfcheck_verdict_names_each_limit_crossed() -> None:
    counters = RunCounters()
    monitor = LoopMonitor(MonotonicClock(), counters)
    assert not monitor.check().limited
    monitor.lags_ns.extend([1_000_000] * 98 + [200_000_000] * 2)
    monitor.loop_cpu.extend([0.95, 0.97, 0.2])
    counters.pool_waits_ns.extend([0] * 97 + [30_000_000] * 3)
    counters.dispatch_lags_ns.extend([0] * 100)
    check = monitor.check()
    assert check.limited
    assert [r.split()[0] for r in check.reasons] == [
        "event-loop",
        "event-loop",
        "connection-pool",
    ]
    assert check.loop_cpu_share["p50"] == pytest.approx(0.95)
    assert check.dispatch_lag_ms["max"] == 0.0


def test_selfcheck_merge_is_the_worst_worker_and_names_it() -> None:
    calm = {"limited": False, "reasons": [], "loop_lag_ms": {"p99": 2.0}}
    busy = {"limited": True, "reasons": ["lag"], "loop_lag_ms": {"p99": 90.0}}
    merged = merge_checks({0: calm, 1: busy})
    assert merged is not None
    assert merged["limited"] is True
    assert merged["reasons"] == ["worker 1: lag"]
    assert merged["loop_lag_ms"] == {"p99": 90.0}
    assert set(merged["workers"]) == {"0", "1"}
    assert merge_checks({}) is None


def test_selfcheck_status_line_says_client_limited() -> None:
    counters = RunCounters(client_limit="event-loop lag P99 80 ms > 50 ms")
    clock = MonotonicClock()
    line = Progress(counters, clock, clock.now_ns(), 10, io.StringIO()).line()
    assert line.endswith("CLIENT-LIMITED: event-loop lag P99 80 ms > 50 ms")
    counters.client_limit = None
    assert "CLIENT" not in Progress(counters, clock, 0, 10, io.StringIO()).line()


@pytest.fixture
def instant_server() -> Iterator[tuple[str, int]]:
    """The zero-delay endpoint in its own process, pinned to one core: (URL, core)."""
    core = min(os.sched_getaffinity(0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.instant_server", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield line.split()[-1], core
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _run(
    trace: Path, url: str, out: Path, *, workers: int, core: int | None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *REPLAYER,
            "run",
            str(trace),
            "--endpoint",
            url,
            "--session-rate",
            "300",
            "--warmup",
            "1",
            "--duration",
            "5",
            "--workers",
            str(workers),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=None if core is None else lambda: os.sched_setaffinity(0, {core}),
    )


def _analyze(run_dir: Path, *args: str) -> str:
    return subprocess.run(
        [*REPLAYER, "analyze", str(run_dir), *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def busy_trace(tmp_path: Path) -> Path:
    """~1,500 requests/s at --session-rate 300: sessions of 5 turns, 10 ms think gaps,
    4 output tokens each."""
    sessions = (growing_session(f"s{k}", 5, think=0.01, out=4) for k in range(3000))
    return write_trace(trace_of(*sessions), tmp_path / "t.jsonl")


def test_selfcheck_flags_a_client_overloaded_on_purpose(
    instant_server: tuple[str, int], busy_trace: Path, tmp_path: Path
) -> None:
    # One worker on the one core its zero-delay server also runs on cannot keep up.
    url, core = instant_server
    over = _run(busy_trace, url, tmp_path / "over", workers=1, core=core)
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
    (os.cpu_count() or 1) < 2 or os.getloadavg()[0] > (os.cpu_count() or 1) - 1,
    reason="needs a free core per worker (the machine is busy: a busy machine "
    "limits any client, which the self-check rightly says)",
)
def test_selfcheck_same_run_with_enough_workers_is_not_flagged(
    instant_server: tuple[str, int], busy_trace: Path, tmp_path: Path
) -> None:
    url, _core = instant_server
    enough = _run(busy_trace, url, tmp_path / "enough", workers=2, core=None)
    assert enough.returncode == 0, enough.stderr
    assert "CLIENT-LIMITED" not in enough.stderr, enough.stderr
    check = json.loads(_analyze(tmp_path / "enough", "--json"))["client_check"]
    assert check["limited"] is False
    assert check["pool_wait_ms"]["count"] > 0
