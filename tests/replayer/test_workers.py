"""The ``--workers`` supervisor watches its workers' reports: the run's status line
prints as plain lines when its stream is not a terminal, and a worker that falls
silent (SIGSTOP) while its peer goes on is named in one warning line."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

from replayer.config import EndpointConfig, Lanes, ReplayConfig
from replayer.launch import running_endpoint
from replayer.records import RunMeta
from replayer.runner.workers import replay_with_workers
from tests.orphans import long_trace


def _stop_worker_1(stream: io.StringIO, named: threading.Event) -> None:
    """Once the status line shows, SIGSTOP worker 1 until it is named (at most
    60 s), then SIGCONT it."""
    deadline = time.monotonic() + 60
    while "[" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.1)
    (worker,) = [p for p in mp.active_children() if p.name == "replayer-worker-1"]
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        while "warning: worker 1" not in stream.getvalue():
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        named.set()
    finally:
        os.kill(worker.pid, signal.SIGCONT)


def test_workers_status_lines_without_a_terminal_and_a_stopped_worker_named(
    tmp_path: Path,
) -> None:
    trace = long_trace(tmp_path / "t.jsonl")
    config = ReplayConfig(
        endpoint=EndpointConfig(),
        schedule=Lanes(concurrency=2),
        workers=2,
        duration_s=8.0,
        sim_args=("--speed", "1"),
        scrape_interval_s=0.0,
    )
    stream = io.StringIO()  # not a terminal
    named = threading.Event()
    stopper = threading.Thread(target=_stop_worker_1, args=(stream, named))
    stopper.start()
    try:
        with running_endpoint(config) as (resolved, _sim):
            summary = replay_with_workers(
                trace,
                resolved,
                tmp_path / "run",
                meta=RunMeta(run_id="r", tool_version="test"),
                progress=stream,
                stall_s=3.0,
                status_interval_s=0.5,
            )
    finally:
        stopper.join()
    text = stream.getvalue()
    assert named.is_set(), text
    assert "\r" not in text
    lines = text.splitlines()
    assert sum(line.startswith("[") and "done" in line for line in lines) >= 2, text
    (warning,) = [line for line in lines if line.startswith("warning: worker 1 ")]
    assert "(pid " in warning
    assert "made no progress report for" in warning
    assert summary.requests > 0
