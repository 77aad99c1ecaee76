"""Steady-state windows (MSER-5), percentile CIs, SLO verdicts and the queue-inclusive
latencies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from analysis import metrics as m
from analysis.load import load_run
from analysis.steady import (
    EXACT_BOOTSTRAP_MAX,
    percentile_ci,
    slo_verdict,
    steady_state,
    window_of,
)
from analysis.summary import summarize
from replayer.records import RequestRecord, steady_window
from traces.stats import mser_truncation


def test_mser_by_hand() -> None:
    # batch 1, series 0 10 10 10: d=0 → mean 7.5, SSE 56.25 + 3·6.25 = 75, /4² = 4.69;
    # d=1 → SSE 0. The first minimum wins: cut one point.
    assert mser_truncation([0, 10, 10, 10], batch=1) == 1
    # d ≤ k/2: a "transient" longer than half the series is not cut beyond half.
    assert mser_truncation([0, 0, 0, 10, 10], batch=1) <= 2
    assert mser_truncation(np.full(100, 3.0)) == 0  # flat: nothing to cut
    assert mser_truncation([1.0] * 9) == 0  # fewer than two batches of 5


def test_mser_finds_a_ramp() -> None:
    rng = np.random.default_rng(1)
    series = np.r_[np.linspace(0, 10, 50), 10 + rng.normal(0, 1, 450)]
    cut = mser_truncation(series)
    assert 35 <= cut <= 60  # the ramp is the first 50 points


def _closed_loop(
    *,
    lanes: int,
    ramp_s: float,
    steady_end_s: float,
    tail_s: float,
    seed: int = 0,
) -> list[RequestRecord]:
    """Lanes that join one by one over ``ramp_s``, then keep one request each in
    flight back to back until they leave one by one over ``tail_s``: a slow start
    and a long drain tail around a steady middle."""
    from tests.builders import timed_record

    rng = np.random.default_rng(seed)
    rows = []
    for lane in range(lanes):
        t = ramp_s * lane / (lanes - 1)
        leave = steady_end_s + tail_s * (lane + 1) / lanes
        k = 0
        while t < leave:
            e2e = float(rng.uniform(1.5, 2.5))
            rows.append(
                timed_record(
                    start_ms=t * 1000,
                    ttft_ms=200.0,
                    e2e_ms=e2e * 1000,
                    out=10,
                    session_id=f"lane{lane}",
                    request_index=k,
                    scheduled_ns=int(t * 1e9),
                )
            )
            t += e2e
            k += 1
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steady_window_excludes_slow_start_and_long_tail(
    tmp_path: Path, make_run_dir: Callable[..., Path], seed: int
) -> None:
    rows = _closed_loop(lanes=8, ramp_s=100, steady_end_s=400, tail_s=200, seed=seed)
    run = load_run(make_run_dir(tmp_path / "r", rows))
    w = window_of(m.numeric_view(run.requests))
    assert w is not None
    # The last lane joins at 100 s; the first leaves after its last request that
    # starts before 425 s (so by 427.5 s), the last at 600 s.
    assert 90 * 1e9 <= w.start_ns <= 130 * 1e9
    assert 375 * 1e9 <= w.end_ns <= 427.5 * 1e9
    assert w.head_s >= 90
    assert w.tail_s >= 170
    # analyze carries it, and the figures over it count only rows sent inside it.
    s = summarize(run).as_dict()
    window = s["steady_state"]["window"]
    assert window["start_s"] == pytest.approx(w.start_ns / 1e9)
    assert window["end_s"] == pytest.approx(w.end_ns / 1e9)
    starts = np.array([r.start_ns for r in rows])
    inside = int(((starts >= w.start_ns) & (starts <= w.end_ns)).sum())
    assert s["steady_state"]["requests"] == inside < len(rows)
    # Whole-run figures stay.
    assert s["e2e_ms"]["count"] == len(rows)


def test_steady_window_of_a_flat_run_is_the_whole_run() -> None:
    rng = np.random.default_rng(2)
    # 4 lanes, each back to back from 0 to 300 s: no ramp, ends together.
    starts, ends = [], []
    for _ in range(4):
        t = 0.0
        while t < 300:
            d = rng.uniform(1.5, 2.5)
            starts.append(t)
            ends.append(min(t + d, 300.0))
            t += d
    w = steady_window(np.array(starts) * 1e9, np.array(ends) * 1e9)
    assert w is not None
    assert w.head_s < 15
    assert w.tail_s < 15


def test_steady_window_few_rows_keeps_everything() -> None:
    w = steady_window([0, 10, 20], [5, 15, 30])
    assert w is not None
    assert w.bins == 0
    assert (w.start_ns, w.end_ns) == (0, 30)
    assert steady_window([], []) is None


def test_percentile_ci_bootstrap_and_order_statistics() -> None:
    rng = np.random.default_rng(3)
    small = rng.exponential(100.0, 2000)
    ((p, lo, hi),) = percentile_ci(small, [90])
    assert p == pytest.approx(np.percentile(small, 90))
    assert lo < p < hi
    # The interval shrinks like 1/sqrt(n): large samples take the rank interval.
    big = rng.exponential(100.0, EXACT_BOOTSTRAP_MAX * 40)
    ((pb, lob, hib),) = percentile_ci(big, [90])
    assert lob < pb < hib
    assert (hib - lob) < (hi - lo) / 3
    # Both methods agree in width where they meet (within sampling noise).
    mid = rng.exponential(100.0, EXACT_BOOTSTRAP_MAX)
    mid_big = np.r_[mid, mid[:1]]  # one more value: the rank interval
    ((_, a_lo, a_hi),) = percentile_ci(mid, [90])
    ((_, b_lo, b_hi),) = percentile_ci(mid_big, [90])
    assert (b_hi - b_lo) == pytest.approx(a_hi - a_lo, rel=0.35)
    assert percentile_ci([], [50])[0][0] != percentile_ci([], [50])[0][0]  # NaN


def test_queue_inclusive_latency_adds_the_queue_delay(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    timed: Callable[..., RequestRecord],
) -> None:
    delay_ms = 300.0
    rows = [
        timed(
            start_ms=1000.0 * k + delay_ms,
            ttft_ms=50.0 + k,
            e2e_ms=500.0,
            out=5,
            scheduled_ns=int(1000.0 * k * 1e6),
            request_index=k,
        )
        for k in range(30)
    ]
    run = load_run(make_run_dir(tmp_path / "r", rows))
    df = m.numeric_view(run.requests)
    np.testing.assert_allclose(m.queued_ttft_ms(df) - m.ttft_ms(df), delay_ms)
    np.testing.assert_allclose(m.queued_e2e_ms(df) - m.e2e_ms(df), delay_ms)
    s = summarize(run).as_dict()
    assert s["queued_ttft_ms"]["p90"] == pytest.approx(s["ttft_ms"]["p90"] + delay_ms)


def test_slo_verdict_pass_fail_and_borderline(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    timed: Callable[..., RequestRecord],
) -> None:
    rng = np.random.default_rng(4)
    ttfts = rng.uniform(100, 300, 400)
    rows = [
        timed(
            start_ms=100.0 * k,
            ttft_ms=float(t),
            e2e_ms=float(t) + 200,
            out=11,
            scheduled_ns=int(100.0 * k * 1e6),
            request_index=k,
        )
        for k, t in enumerate(ttfts)
    ]
    df = m.numeric_view(load_run(make_run_dir(tmp_path / "r", rows)).requests)
    p90 = steady_state(df)["queued_ttft_ms"]["p90"]
    assert slo_verdict(df, m.Slo(ttft_ms=p90 * 2))["pass"]
    bad = slo_verdict(df, m.Slo(ttft_ms=p90 / 2, tpot_ms=1000))
    assert not bad["pass"]
    assert not bad["borderline"]
    assert len(bad["reasons"]) == 1
    assert bad["reasons"][0].startswith("queued_ttft p90")
    near = slo_verdict(df, m.Slo(ttft_ms=p90 + 0.01))
    assert near["pass"]
    assert near["borderline"]
    # The percentile is the caller's.
    p50 = steady_state(df)["queued_ttft_ms"]["p50"]
    assert slo_verdict(df, m.Slo(ttft_ms=p50 + 1), percentile=50)["pass"]
    assert not slo_verdict(df, m.Slo(ttft_ms=p50 + 1), percentile=90)["pass"]


def test_percentile_ci_point_is_numpys_linear_percentile_for_large_samples() -> None:
    rng = np.random.default_rng(5)
    x = rng.lognormal(3.0, 1.0, EXACT_BOOTSTRAP_MAX * 3 + 7)
    x[::100] = np.nan
    got = [p for p, _, _ in percentile_ci(x, [50, 90, 99, 99.9])]
    want = np.percentile(x[~np.isnan(x)], [50, 90, 99, 99.9])
    np.testing.assert_allclose(got, want, rtol=1e-12)
