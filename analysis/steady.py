"""Steady-state figures and SLO verdicts: percentiles over a run's steady-state window
with confidence intervals. Pure: a request DataFrame in, records out.
See docs/capacity.md#definitions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from analysis.compare import bootstrap
from analysis.results import (
    Interval,
    Latency,
    SteadyFigure,
    SteadyState,
    SteadyThroughput,
    Throughput,
)
from replayer.records import SteadyRecord, SteadyWindow, steady_window
from replayer.records.capacity import SloCheck
from traces.quantile import LinearPlan, order_statistics
from traces.stats import PERCENTILE_METHOD

FloatArray = npt.NDArray[np.float64]
RESAMPLES = 1000
EXACT_BOOTSTRAP_MAX = 5000
CONFIDENCE = 0.95
QUANTILES = (50.0, 90.0, 99.0)

# The steady-state metrics: name → metric function (its population and formula).
METRICS: dict[str, Callable[[pd.DataFrame], FloatArray]] = {
    "ttft_ms": m.ttft_ms,
    "queued_ttft_ms": m.queued_ttft_ms,
    "tpot_ms": m.tpot_ms,
    "e2e_ms": m.e2e_ms,
    "queued_e2e_ms": m.queued_e2e_ms,
}
# What an SLO on each metric is judged on: the queue-inclusive latencies (a request
# that waited in the client for a slot waited all the same); TPOT has no queue.
SLO_METRICS = {
    "ttft_ms": "queued_ttft_ms",
    "tpot_ms": "tpot_ms",
    "e2e_ms": "queued_e2e_ms",
}
# The request columns the steady-state figures read.
COLUMNS = (
    "status",
    "warmup",
    "scheduled_ns",
    "start_ns",
    "first_token_ns",
    "end_ns",
    "ttft_ns",
    "e2e_ns",
    "tpot_ns",
    "prompt_tokens",
    "output_tokens",
)


def window_of(df: pd.DataFrame) -> SteadyWindow | None:
    """The steady-state window of a run's rows (sent rows: not ``skipped``)."""
    sent = ~m.has_status(df, "skipped")
    return steady_window(
        m.kept_column(df, "start_ns", sent), m.kept_column(df, "end_ns", sent)
    )


def in_window(df: pd.DataFrame, window: SteadyWindow) -> pd.DataFrame:
    """``df`` with its latency population (``measured_ok``) narrowed to the rows
    sent inside ``window``. Every steady-state figure is taken over that population
    (:data:`METRICS`, throughput, request count), so these are the figures of the
    rows in the window, in row order, with no row copied (a copy of 10M rows' columns
    was 0.75 GiB)."""
    # Compared as float64, as metrics.column gives them: a narrow integer column
    # is cast inside the comparison, not copied.
    raw = m.plain_column(df, "start_ns")
    start = raw if raw is not None else m.column(df, "start_ns")
    keep = np.greater_equal(start, float(window.start_ns))  # (a float64 loop)
    keep &= np.less_equal(start, float(window.end_ns))
    out: dict[str, Any] = {c: df[c] for c in df.columns if c != m.MEASURED_OK}
    out[m.MEASURED_OK] = m.measured_ok(df) & keep
    return pd.DataFrame(out, index=df.index, copy=False)


def percentile_ci(
    values: npt.ArrayLike,
    qs: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> list[tuple[float, float, float]]:
    """(percentile, CI low, CI high) for each q in ``qs`` (module docstring: the
    bootstrap, or the order-statistic interval for large samples). NaNs dropped; no
    values: NaNs.

    Confidence intervals of a percentile: the percentile bootstrap (seeded resamples of
    the requests, :data:`RESAMPLES` of them) up to :data:`EXACT_BOOTSTRAP_MAX` values;
    above that, the distribution-free order-statistic interval (ranks n·p ±
    z·√(n·p·(1-p)) of the sorted values), which is what the bootstrap interval of a
    percentile converges to and costs one sort instead of thousands of resamples.
    """
    x = np.asarray(values, dtype=np.float64)  # read, never written
    nan = np.isnan(x)
    if nan.any():  # else no copy of millions of values
        x = x[~nan]
    del nan
    n = x.size
    if n == 0:
        return [(math.nan, math.nan, math.nan) for _ in qs]
    alpha = (1.0 - confidence) / 2
    if n <= EXACT_BOOTSTRAP_MAX:
        points = m.percentiles(x, qs)
        rng = np.random.default_rng(seed)
        qs_list = list(qs)

        def stat(rows: FloatArray) -> FloatArray:
            # One column per resample, one row per quantile.
            res = np.percentile(rows, qs_list, axis=-1, method=PERCENTILE_METHOD)
            return np.asarray(res, dtype=np.float64).T

        boot = bootstrap(x, stat, resamples=RESAMPLES, rng=rng)  # (resamples, len(qs))
        boot = boot.reshape(RESAMPLES, len(qs_list))
        lo = np.quantile(boot, alpha, axis=0)
        hi = np.quantile(boot, 1 - alpha, axis=0)
        return [(p, float(a), float(b)) for p, a, b in zip(points, lo, hi, strict=True)]
    plan = _CiPlan(n, qs, confidence)
    part: Any = order_statistics(x, plan.ranks)  # the same values, faster
    if part is None:
        part = np.partition(x, plan.ranks)
    return plan.intervals(part)


class _CiPlan:
    """The ranks :func:`percentile_ci`'s order-statistic intervals (and point
    estimates) of ``n`` values read, and the intervals from them."""

    def __init__(self, n: int, qs: Sequence[float], confidence: float) -> None:
        z = NormalDist().inv_cdf(1 - (1.0 - confidence) / 2)
        self.bounds = []
        for q in qs:
            frac = q / 100.0
            half = z * math.sqrt(n * frac * (1 - frac))
            self.bounds.append(
                (
                    max(0, math.floor(n * frac - half) - 1),
                    min(n - 1, math.ceil(n * frac + half)),
                )
            )
        # Only some ranks are needed: one partition, not a sort. The point estimate
        # is numpy's "linear" percentile, read from the same partition: the values
        # at the floor and ceiling of the virtual index (n - 1)·q, interpolated.
        self.virtual = [(n - 1) * q / 100.0 for q in qs]
        kth = {r for pair in self.bounds for r in pair}
        kth |= {math.floor(v) for v in self.virtual}
        kth |= {math.ceil(v) for v in self.virtual}
        self.ranks = sorted(kth)

    def intervals(self, part: Any) -> list[tuple[float, float, float]]:
        """(percentile, CI low, CI high) each, from ``part``: the values at (at
        least) :attr:`ranks` by rank (a partitioned array or a dict)."""
        out = []
        for v, (r_lo, r_hi) in zip(self.virtual, self.bounds, strict=True):
            below, above = part[math.floor(v)], part[math.ceil(v)]
            point = float(below + (above - below) * (v - math.floor(v)))
            out.append((point, float(part[r_lo]), float(part[r_hi])))
        return out


def _figure(values: FloatArray, seed: int) -> SteadyFigure:
    (p50, lo50, hi50), (p90, lo90, hi90), (p99, lo99, hi99) = percentile_ci(
        values, QUANTILES, seed=seed
    )
    return SteadyFigure(
        p50=p50,
        p90=p90,
        p99=p99,
        count=int(np.count_nonzero(~np.isnan(values))),
        ci=Interval(p50=(lo50, hi50), p90=(lo90, hi90), p99=(lo99, hi99)),
    )


def steady_state(df: pd.DataFrame, *, seed: int = 0) -> SteadyState | None:
    """The ``steady_state`` block of ``analyze --json``: the window, and over it
    each latency's p50/p90/p99 with their CIs, and the throughput (None: no request
    ended).

    The window is :func:`replayer.records.steady_window` (MSER-5; its docstring is the
    definition), computed from the rows, so a run recorded before the window existed
    gets one too. Within it, the population of each metric is the one
    ``analysis.metrics`` gives it, restricted to requests *sent* inside the window.
    """
    window = window_of(df)
    if window is None:
        return None
    sub = in_window(df, window)
    return _state(
        window,
        int(m.measured_ok(sub).sum()),
        {name: _figure(metric(sub), seed) for name, metric in METRICS.items()},
        m.throughput_tok_s(sub),
    )


def _state(
    window: SteadyWindow,
    requests: int,
    figures: dict[str, SteadyFigure],
    tp: Throughput,
) -> SteadyState:
    """The steady-state block of ``window`` from its figures (by :data:`METRICS`
    name) and its throughput."""
    return SteadyState(
        window=window.record(),
        requests=requests,
        confidence=CONFIDENCE,
        ttft_ms=figures["ttft_ms"],
        queued_ttft_ms=figures["queued_ttft_ms"],
        tpot_ms=figures["tpot_ms"],
        e2e_ms=figures["e2e_ms"],
        queued_e2e_ms=figures["queued_e2e_ms"],
        throughput_tok_s=SteadyThroughput(
            input=tp.input, output=tp.output, total=tp.total, requests=tp.requests
        ),
    )


def with_run_figures(
    df: pd.DataFrame, *, seed: int = 0, gpus: int | None = None
) -> tuple[SteadyState | None, dict[str, Latency], Throughput]:
    """(:func:`steady_state`, ``metrics.describe`` of each of :data:`METRICS` over
    the run's population, ``metrics.throughput_tok_s(df, gpus)``): the same
    figures as apart. When the window holds every measured row (a run without
    warm-up or drain) its populations are the run's: each latency array is built
    once and its order statistics found in one pass for both."""
    window = window_of(df)
    sub = in_window(df, window) if window is not None else None
    run_tp = m.throughput_tok_s(df, gpus)
    requests = int(m.measured_ok(sub).sum()) if sub is not None else 0
    whole = sub is not None and requests == int(m.measured_ok(df).sum())
    figures: dict[str, Latency] = {}
    steady: dict[str, SteadyFigure] = {}
    for name, metric in METRICS.items():
        if sub is not None and not whole:
            steady[name] = _figure(metric(sub), seed)
        values = metric(df)
        both = _both(values, seed) if whole else None
        if both is not None:
            figures[name], steady[name] = both
            continue
        if whole:
            steady[name] = _figure(values, seed)  # read before describe reorders
        figures[name] = m.describe(values, scratch=True)
    if window is None or sub is None:
        return None, figures, run_tp
    tp = run_tp if whole else m.throughput_tok_s(sub)
    return _state(window, requests, steady, tp), figures, run_tp


def _both(values: FloatArray, seed: int) -> tuple[Latency, SteadyFigure] | None:
    """(``metrics.describe``, :func:`_figure`) of NaN-free ``values`` from one
    :func:`order_statistics` of the ranks both read (None: small, or a bracket
    missed: call them apart)."""
    n = values.size
    linear = LinearPlan.of(n, [50, 90, 99])
    if linear is None or n <= EXACT_BOOTSTRAP_MAX:
        return None
    ci = _CiPlan(n, QUANTILES, CONFIDENCE)
    found = order_statistics(values, sorted({*linear.ranks, *ci.ranks}))
    if found is None:
        return None
    p50, p90, p99 = linear.percentiles(found)
    latency = Latency(mean=float(values.mean()), p50=p50, p90=p90, p99=p99, count=n)
    (s50, lo50, hi50), (s90, lo90, hi90), (s99, lo99, hi99) = ci.intervals(found)
    figure = SteadyFigure(
        p50=s50,
        p90=s90,
        p99=s99,
        count=n,
        ci=Interval(p50=(lo50, hi50), p90=(lo90, hi90), p99=(lo99, hi99)),
    )
    return latency, figure


@dataclass(frozen=True, slots=True, kw_only=True)
class SloVerdict:
    """A run judged against an SLO over its steady-state window."""

    passed: bool  # every objective met, and a request in the window succeeded
    borderline: bool  # some objective's CI contains its target
    percentile: float
    checks: tuple[SloCheck, ...]
    reasons: tuple[str, ...]  # per failing objective: value against target
    window: SteadyRecord | None
    requests: int  # ok measured requests in the window


def slo_verdict(
    df: pd.DataFrame, slo: m.Slo, *, percentile: float = 90.0, seed: int = 0
) -> SloVerdict:
    """Whether the run meets ``slo`` at ``percentile`` over its steady-state window.

    Each objective is judged on the queue-inclusive latency (:data:`SLO_METRICS`).
    A metric passes when its percentile is ≤ the target; it is ``borderline`` when
    its CI contains the target (more requests could tip it). The run passes when
    every metric passes and at least one request in the window succeeded.
    ``reasons`` say, for each failing metric, value against target.
    """
    window = window_of(df)
    sub = in_window(df, window) if window is not None else df.iloc[:0]
    checks: list[SloCheck] = []
    for key, target in slo.as_dict().items():
        metric = SLO_METRICS[key]
        ((value, lo, hi),) = percentile_ci(
            METRICS[metric](sub), [percentile], seed=seed
        )
        checks.append(
            SloCheck(
                slo=key,
                metric=metric,
                target_ms=target,
                value_ms=value,
                ci_ms=(lo, hi),
                passed=bool(value <= target),  # NaN (no data) fails
                borderline=bool(lo <= target <= hi),
            )
        )
    n_ok = int(m.measured_ok(sub).sum())
    reasons = [
        f"{c.metric.removesuffix('_ms')} p{percentile:g} "
        f"{_ms(c.value_ms)} > {_ms(c.target_ms)} "
        f"(CI {_ms(c.ci_ms[0])} to {_ms(c.ci_ms[1])})"
        for c in checks
        if not c.passed and not math.isnan(c.value_ms)
    ]
    if n_ok == 0:
        reasons.insert(0, "no request succeeded in the steady-state window")
    return SloVerdict(
        passed=n_ok > 0 and all(c.passed for c in checks),
        borderline=any(c.borderline for c in checks),
        percentile=percentile,
        checks=tuple(checks),
        reasons=tuple(reasons),
        window=window.record() if window is not None else None,
        requests=n_ok,
    )


def _ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{v:.3g} ms"
