"""The report's plots, checked on their matplotlib figures (the screenshot test in
test_cli renders the whole page in Chromium): the fixes a reader asked for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import report
from analysis.load import load_run
from replayer.records import RequestRecord

MS = 1_000_000


def _summary(name: str, **rates: float) -> dict[str, Any]:
    return {"run": {"name": name}, "cache_hit_rate": rates}


def test_report_hit_chart_zooms_labels_and_keeps_the_legend_off_the_bars() -> None:
    fig = report.hit_figure(
        [_summary("a", ideal=0.964, server=0.963, prometheus=0.9635, lru=float("nan"))]
    )
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["ideal", "server", "prometheus"]  # no "lru" without a bar
    low, high = ax.get_ylim()
    assert low > 0.9  # 96.3 and 96.4 on a 0-1 axis look the same
    assert high <= 1.0
    texts = {t.get_text() for t in ax.texts}
    assert {"96.4%", "96.3%"} <= texts
    # The legend sits right of the axes, over no bar.
    anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    assert anchor.x0 > 1.0


def test_report_latency_cdf_uses_log_time(
    tmp_path: Path,
    timed: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = [
        timed(request_index=i, start_ms=i, ttft_ms=ttft, e2e_ms=ttft + 100, out=5)
        for i, ttft in enumerate([5, 8, 12, 20, 40, 5000])
    ]
    run = load_run(make_run_dir(tmp_path / "r", rows))
    (ax,) = report.cdf_figure([run], "ttft_ms").axes
    assert ax.get_xscale() == "log"


def test_report_timeline_throughput_has_no_coalescing_spike(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    # Steady requests: 100 tokens over 1 s each, one starting every 0.1 s (about
    # 1,000 tok/s), and one whose 220 tokens arrived within 1 ms (chunks read at
    # once): as an instantaneous rate that is 220,000 tok/s.
    rows = [
        rec(request_index=i, start_ns=i * 100 * MS, first_token_ns=i * 100 * MS + MS,
            end_ns=i * 100 * MS + 1001 * MS, output_tokens=100)
        for i in range(50)
    ] + [
        rec(session_id="burst", request_index=0, start_ns=2000 * MS,
            first_token_ns=2500 * MS, end_ns=2501 * MS, output_tokens=220)
    ]  # fmt: skip
    run = load_run(make_run_dir(tmp_path / "r", rows))
    t, tok_s = report._binned_output_rate(
        run.requests, report.m.column(run.requests, "end_ns")
    )
    assert t.size == 200
    total = float(np.sum(tok_s * np.diff(np.append(t, t[-1] + (t[1] - t[0])))))
    assert total == pytest.approx(50 * 100 + 220, rel=1e-6)  # every token counted once
    assert tok_s.max() < 10_000  # the burst spreads over its bin, no 220K spike
    fig = report.timeline_figure(run)
    top = fig.axes[0]
    assert top.get_ylim()[1] < 10_000
