"""The report's plots, checked on their matplotlib figures (the screenshot test in
test_cli renders the whole page in Chromium): the fixes a reader asked for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import metrics as m
from analysis import report
from analysis.load import load_run
from analysis.results import CacheRates, LruEstimate
from replayer.records import RequestRecord
from replayer.records.capacity import CapacityDoc, ClientLimit
from tests.builders import capacity_cell

MS = 1_000_000


def test_report_hit_chart_zooms_labels_and_keeps_the_legend_off_the_bars() -> None:
    lru = LruEstimate(
        hit_rate=float("nan"), capacity_tokens=1, host_capacity_tokens=None
    )
    rates = CacheRates(ideal=0.964, server=0.963, prometheus=0.9635, lru=lru)
    fig = report.hit_figure([("a", rates)])
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
        run.requests, m.column(run.requests, "end_ns")
    )
    assert t.size == 200
    total = float(np.sum(tok_s * np.diff(np.append(t, t[-1] + (t[1] - t[0])))))
    assert total == pytest.approx(50 * 100 + 220, rel=1e-6)  # every token counted once
    assert tok_s.max() < 10_000  # the burst spreads over its bin, no 220K spike
    fig = report.timeline_figure(run)
    top = fig.axes[0]
    assert top.get_ylim()[1] < 10_000


def test_report_capacity_markers_follow_each_metrics_own_verdict() -> None:
    doc = CapacityDoc.from_dict({
        "search": {"slo": {"ttft_ms": 100.0, "tpot_ms": 100.0}, "percentile": 90,
                   "mode": "concurrency"},
        "cells": [
            capacity_cell("c1", 1, (50, True), (20, True)),
            capacity_cell("c2", 2, (150, False), (30, True)),  # TTFT fails only
            capacity_cell("c4", 4, (40, True), (40, True), client_limited=True),
        ],
        "result": {"status": "found", "max_level": 1, "client_limited_cells": ["c4"]},
    })  # fmt: skip
    ttft_ax, tpot_ax = report.capacity_figure(doc).axes

    def levels(ax: Any) -> dict[str, list[float]]:
        return {c.get_label(): list(c.lines[0].get_xdata()) for c in ax.containers}

    assert levels(ttft_ax) == {
        "within SLO": [1], "over SLO": [2], "client-limited (not counted)": [4]
    }  # fmt: skip
    # c2 is within the TPOT target: green there, not red below the line.
    assert levels(tpot_ax) == {
        "within SLO": [1, 2], "client-limited (not counted)": [4]
    }  # fmt: skip
    notes = report.capacity_notes(doc)
    assert notes == [
        "CLIENT-LIMITED cells, not counted (the replayer, not the server, set their "
        "latencies): c4"
    ]
    assert doc.result is not None
    doc = replace(
        doc,
        result=replace(
            doc.result,
            lower_bound_by_client=True,
            client_limit=ClientLimit(name="c4", level=4, reasons=()),
            thin=True,
            answer_range=(1, 2),
            thin_because=("c2 failed within its CI",),
        ),
    )
    bound, thin = report.capacity_notes(doc)[1:]
    assert bound.startswith("The answer is a lower bound set by the client (c4")
    assert bound.endswith("add --workers or --ray")
    assert thin == (
        "Thin evidence: the cells support anything from 1 to 2 "
        "(c2 failed within its CI)"
    )


def test_report_cdf_lines_stay_distinguishable_past_ten_runs(
    tmp_path: Path,
    timed: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    def rows(k: int) -> list[RequestRecord]:
        return [
            timed(request_index=i, start_ms=i, ttft_ms=10 + k + i, e2e_ms=200, out=5)
            for i in range(5)
        ]

    runs = [load_run(make_run_dir(tmp_path / f"c{k}", rows(k))) for k in range(14)]
    (ax,) = report.cdf_figure(runs, "ttft_ms").axes
    lines = [ln for ln in ax.get_lines() if ln.get_label() in {r.name for r in runs}]
    assert len(lines) == 14
    styles = {(ln.get_color(), ln.get_linestyle()) for ln in lines}
    assert len(styles) == 14  # no two runs drawn alike
    assert len({ln.get_color() for ln in lines}) == 14  # tab20: colours alone differ
    assert len(set(report.line_styles(30))) == 30
