"""The live status line: counts done of the trace's one pass, or under --loop (no
fixed total) the count done and the passes it makes; a workers' run alike."""

from __future__ import annotations

import io

from replayer.play.progress import Progress, RunCounters
from replayer.runner.workers import Reports
from tests.fakes import FakeClock


def _counters(ok: int) -> RunCounters:
    counters = RunCounters()
    counters.by_status["ok"] = ok
    return counters


def test_progress_line_counts_done_of_the_trace() -> None:
    clock = FakeClock()
    line = Progress(_counters(142), clock, clock.now_ns(), 3004, io.StringIO()).line()
    assert "done 142/3,004  " in line


def test_progress_line_under_loop_has_no_fixed_total() -> None:
    clock = FakeClock()
    line = Progress(
        _counters(4250), clock, clock.now_ns(), 3004, io.StringIO(), loop=True
    ).line()
    assert "done 4,250 (1.41 passes of 3,004)  " in line
    assert "/3,004" not in line


def test_workers_status_line_under_loop() -> None:
    stream = io.StringIO()
    reports = Reports(["worker 0", "worker 1"], stream, stall_s=60.0, interval_s=0.0)
    for k in range(2):
        snapshot = {
            "inflight": 1, "lanes": 1, "output_tokens": 10,
            "by_status": {"ok": 3004}, "ttfts_ns": [], "client_limit": None,
            "total": 3004, "loop": True,
        }  # fmt: skip
        reports.add(k, snapshot)
    reports.tick([0, 1], t0_ns=1)
    assert "done 6,008 (2.00 passes of 3,004)" in stream.getvalue()
