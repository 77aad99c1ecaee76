"""Steady-state windows (MSER-5), percentile CIs, SLO verdicts and the queue-inclusive
latencies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
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
from traces.stats import mser_cuts

FloatArray = npt.NDArray[np.float64]


def test_mser_by_hand() -> None:
    # batch 1, series 0 10 10 10: (head 0, tail 0) → mean 7.5, SSE 75, /4² = 4.69;
    # (1, 0) → SSE 0, and it cuts least among the zeros: cut one point at the head.
    assert mser_cuts(np.array([0, 10, 10, 10.0]), batch=1) == (1, 0)
    assert mser_cuts(np.array([10, 10, 10, 0.0]), batch=1) == (0, 1)  # the tail
    assert mser_cuts(np.full(100, 3.0)) == (0, 0)  # flat: nothing to cut
    assert mser_cuts(np.ones(9)) == (0, 0)  # fewer than two batches of 5


def test_mser_finds_a_ramp_and_a_drain() -> None:
    rng = np.random.default_rng(1)
    ramp = np.linspace(0, 10, 50)  # the load rises over the first 50 points
    head, tail = mser_cuts(np.r_[ramp, 10 + rng.normal(0, 1, 450)])
    assert 35 <= head <= 50
    assert tail == 0
    head, tail = mser_cuts(np.r_[ramp, 10 + rng.normal(0, 1, 400), ramp[::-1]])
    assert 35 <= head <= 50
    assert 35 <= tail <= 50


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


def _lanes(
    rng: np.random.Generator,
    joins_s: npt.ArrayLike,
    leaves_s: npt.ArrayLike,
    *,
    dur_s: float,
    subagents: Callable[[float], float],
) -> tuple[FloatArray, FloatArray]:
    """(start_s, end_s) of lanes that join at ``joins_s`` and send back to back
    (requests of 0.5-1.5 x ``dur_s``) until they leave at ``leaves_s``; a request
    sent at t brings 1-2 subagent requests alongside with probability
    ``subagents(t)`` (the plateau's noise)."""
    starts, ends = [], []
    for join, leave in zip(np.asarray(joins_s), np.asarray(leaves_s), strict=True):
        t = float(join)
        while t < leave:
            d = float(rng.uniform(0.5, 1.5)) * dur_s
            starts.append(t)
            ends.append(t + d)
            if rng.random() < subagents(t):
                for _ in range(int(rng.integers(1, 3))):
                    starts.append(t)
                    ends.append(t + float(rng.uniform(0.3, 1.0)) * d)
            t += d
    return np.array(starts), np.array(ends)


def test_steady_window_of_the_readme_weka_run_ends_before_the_drain(
    tmp_path: Path, make_run_dir: Callable[..., Path]
) -> None:
    # The README's Weka run at concurrency 8: 8-11 requests in flight (subagents,
    # busiest in the first seconds) from ~4 s to 65 s, then 5 -> 2 -> 1 over the
    # last 35 s. On the recorded run the alternating cuts kept the whole drain
    # (18.2-101.2 s); here they drop the first 18 s of steady load.
    from tests.builders import timed_record

    rng = np.random.default_rng(0)
    joins = np.linspace(0, 4, 8)
    leaves = np.array([65, 65.5, 66, 71, 71.5, 72, 80, 100.0])
    starts, ends = _lanes(
        rng,
        joins,
        leaves,
        dur_s=0.25,
        subagents=lambda t: 0.5 if t < 18 else 0.15 if t < 65 else 0.0,
    )
    rows = [
        timed_record(
            start_ms=st * 1000,
            ttft_ms=20.0,
            e2e_ms=(en - st) * 1000,
            out=8,
            session_id=f"r{k}",
            scheduled_ns=int(st * 1e9),
        )
        for k, (st, en) in enumerate(zip(starts, ends, strict=True))
    ]
    run = load_run(make_run_dir(tmp_path / "weka", rows))
    w = window_of(m.numeric_view(run.requests))
    assert w is not None
    assert w.start_ns <= 10e9  # keeps the steady load from the start
    assert 55e9 <= w.end_ns <= 67e9  # ends where the drain begins
    window = summarize(run).as_dict()["steady_state"]["window"]
    assert window["end_s"] == pytest.approx(w.end_ns / 1e9)
    assert window["tail_excluded_s"] >= 34


def _ramp_plateau_drain(seed: int) -> tuple[FloatArray, FloatArray, float, float]:
    """A random run of lanes: a ramp (lanes join), a noisy plateau, a drain (lanes
    leave, often in a long tail); (start_s, end_s, plateau start, plateau end)."""
    rng = np.random.default_rng(seed)
    lanes = int(rng.integers(4, 17))
    total = float(rng.uniform(60, 600))
    ramp = float(rng.uniform(0, 0.15)) * total
    drain = float(rng.uniform(0.05, 0.35)) * total
    plateau_end = total - drain
    # Powers spread the joins and leaves unevenly: a few early, a long tail, ...
    joins = ramp * (np.arange(lanes) / (lanes - 1)) ** np.exp(rng.uniform(-1, 1))
    leave_at = (np.arange(1, lanes + 1) / lanes) ** np.exp(rng.uniform(-1, 2))
    leaves = plateau_end + drain * leave_at
    first_leave = float(leaves.min())
    rate = float(rng.uniform(0.05, 0.4))
    starts, ends = _lanes(
        rng,
        joins,
        rng.permutation(leaves),
        dur_s=float(rng.uniform(0.2, 3)),
        subagents=lambda t: rate if ramp <= t < first_leave else 0.0,
    )
    return starts, ends, ramp, first_leave


@pytest.mark.parametrize("seed", range(60))
def test_steady_window_lies_inside_a_known_plateau_and_covers_most_of_it(
    seed: int,
) -> None:
    starts, ends, p0, p1 = _ramp_plateau_drain(seed)
    w = steady_window(starts * 1e9, ends * 1e9)
    assert w is not None
    # The window moves in batches of 5 bins, and the first lane to leave still
    # ends its last request (at most 1.5 x 3 s): that much slack at each edge.
    batch_s = 5 * (w.run_end_ns - w.run_start_ns) / w.bins / 1e9
    start_s, end_s = w.start_ns / 1e9, w.end_ns / 1e9
    assert start_s >= p0 - batch_s
    assert end_s <= p1 + 4.5 + batch_s
    assert min(end_s, p1) - max(start_s, p0) >= 0.8 * (p1 - p0)


@pytest.mark.parametrize("seed", range(0, 80, 4))
def test_steady_window_of_the_reversed_run_is_the_mirror_image(seed: int) -> None:
    # One choice of both cuts, no alternation that starts from one end: played
    # backwards, the ramp is the drain and the window is the same, mirrored (an
    # iteration cap has nothing to change).
    starts, ends, _, _ = _ramp_plateau_drain(seed)
    fwd = steady_window(starts * 1e9, ends * 1e9)
    top = float(ends.max())
    back = steady_window((top - ends) * 1e9, (top - starts) * 1e9)
    assert fwd is not None
    assert back is not None
    assert back.bins == fwd.bins
    one_bin_s = (fwd.run_end_ns - fwd.run_start_ns) / fwd.bins / 1e9
    assert back.head_s == pytest.approx(fwd.tail_s, abs=one_bin_s)
    assert back.tail_s == pytest.approx(fwd.head_s, abs=one_bin_s)


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
    figures = steady_state(df)
    assert figures is not None
    p90 = figures.queued_ttft_ms.p90
    assert slo_verdict(df, m.Slo(ttft_ms=p90 * 2)).passed
    bad = slo_verdict(df, m.Slo(ttft_ms=p90 / 2, tpot_ms=1000))
    assert not bad.passed
    assert not bad.borderline
    assert len(bad.reasons) == 1
    assert bad.reasons[0].startswith("queued_ttft p90")
    near = slo_verdict(df, m.Slo(ttft_ms=p90 + 0.01))
    assert near.passed
    assert near.borderline
    # The percentile is the caller's.
    p50 = figures.queued_ttft_ms.p50
    assert slo_verdict(df, m.Slo(ttft_ms=p50 + 1), percentile=50).passed
    assert not slo_verdict(df, m.Slo(ttft_ms=p50 + 1), percentile=90).passed


def test_percentile_ci_point_is_numpys_linear_percentile_for_large_samples() -> None:
    rng = np.random.default_rng(5)
    x = rng.lognormal(3.0, 1.0, EXACT_BOOTSTRAP_MAX * 3 + 7)
    x[::100] = np.nan
    got = [p for p, _, _ in percentile_ci(x, [50, 90, 99, 99.9])]
    want = np.percentile(x[~np.isnan(x)], [50, 90, 99, 99.9])
    np.testing.assert_allclose(got, want, rtol=1e-12)
