"""A/B comparison of two runs: deltas of headline figures with seeded bootstrap CIs and
a verdict per figure (run B against run A). Pure: two request DataFrames in, a dict out.
See docs/metrics.md#analyze-compare-report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from replayer.records import RunMeta

Stat = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]
_MAX_CELLS = 4_000_000  # resampled values held at once (bounds memory on big runs)


def _pct(q: float, scale: float = 1.0, invert: bool = False) -> Stat:
    def stat(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        p = m.percentile_rows(x, q)
        with np.errstate(divide="ignore"):
            return np.asarray(scale / p if invert else p, dtype=np.float64)

    return stat


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One compared figure: per-request values, the statistic on them, direction."""

    metric: str  # the analyze --json key
    stat: str  # "p50", "p90", ...
    values: Callable[[pd.DataFrame], npt.NDArray[np.float64]]
    reduce: Callable[[pd.DataFrame], Stat]  # may depend on the run (its window)
    higher_is_better: bool


def _output_tokens(df: pd.DataFrame) -> npt.NDArray[np.float64]:
    return np.nan_to_num(m.column(df, "output_tokens")[m.measured_ok(df)])


def _rate(df: pd.DataFrame) -> Stat:
    window = m.measured_window_s(df)

    def stat(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.asarray(x.sum(axis=-1) / window, dtype=np.float64)

    return stat


def _latency(name: str, fn: Callable[[pd.DataFrame], Any], q: int) -> Figure:
    return Figure(
        metric=name,
        stat=f"p{q}",
        values=fn,
        reduce=lambda _df: _pct(q),
        higher_is_better=False,
    )


def _speed(
    name: str, stat: str, fn: Callable[[pd.DataFrame], Any], q: int, scale: float
) -> Figure:
    return Figure(
        metric=name,
        stat=stat,
        values=fn,
        reduce=lambda _df: _pct(q, scale, invert=True),
        higher_is_better=True,
    )


FIGURES: tuple[Figure, ...] = (
    *(
        _latency(name, fn, q)
        for name, fn in (
            ("ttft_ms", m.ttft_ms),
            ("tpot_ms", m.tpot_ms),
            ("e2e_ms", m.e2e_ms),
        )
        for q in (50, 90)
    ),
    _speed("interactivity_tok_s", "p50", m.tpot_ms, 50, 1000.0),
    _speed("interactivity_tok_s", "p90", m.tpot_ms, 90, 1000.0),
    _speed("e2e_norm_interactivity_tok_s", "value", m.e2e_per_token_s, 90, 1.0),
    Figure(
        metric="throughput_tok_s",
        stat="output",
        values=_output_tokens,
        reduce=_rate,
        higher_is_better=True,
    ),
)


def bootstrap(
    values: npt.NDArray[np.float64],
    stat: Stat,
    *,
    resamples: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """``stat`` of ``resamples`` resamples (with replacement) of ``values``."""
    n = values.size
    if n == 0:
        return np.full(resamples, np.nan)
    batch = max(1, _MAX_CELLS // n)
    out = []
    for lo in range(0, resamples, batch):
        k = min(batch, resamples - lo)
        out.append(stat(values[rng.integers(0, n, size=(k, n))]))
    return np.concatenate(out)


def verdict(low: float, high: float, higher_is_better: bool) -> str:
    """ "better" / "worse" for B when the CI of B - A excludes 0, else no difference."""
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0 <= high:
        return "no clear difference"
    b_higher = low > 0
    return "better" if b_higher == higher_is_better else "worse"


def compare_runs(
    a: pd.DataFrame,
    b: pd.DataFrame,
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Each figure of :data:`FIGURES` for A and B, B - A, its bootstrap CI, verdict.

    Formula: the CI is the percentile interval of stat(B*) - stat(A*) over
    ``resamples`` independent resamples of each run's per-request values (seeded:
    the same inputs give the same interval). Population: each figure's own (see
    ``analysis.metrics``); throughput resamples rows' output tokens over the run's
    fixed measured window.
    """
    rng = np.random.default_rng(seed)
    tail = (1 - confidence) / 2 * 100
    rows = []
    for fig in FIGURES:
        va, vb = fig.values(a), fig.values(b)
        sa, sb = fig.reduce(a), fig.reduce(b)
        point_a = float(sa(va)) if va.size else np.nan
        point_b = float(sb(vb)) if vb.size else np.nan
        deltas = bootstrap(vb, sb, resamples=resamples, rng=rng) - bootstrap(
            va, sa, resamples=resamples, rng=rng
        )
        deltas = deltas[np.isfinite(deltas)]
        low, high = m.percentiles(deltas, [tail, 100 - tail])
        delta = point_b - point_a
        rows.append(
            {
                "metric": fig.metric,
                "stat": fig.stat,
                "a": point_a,
                "b": point_b,
                "delta": delta,
                "delta_pct": delta / point_a * 100 if point_a else np.nan,
                "ci_low": low,
                "ci_high": high,
                "higher_is_better": fig.higher_is_better,
                "verdict": verdict(low, high, fig.higher_is_better),
            }
        )
    return rows


# run.json labels that describe the server (the rest are free-form notes).
SERVER_LABELS = (
    "engine", "engine_version", "tp", "ep", "pp", "gpus", "hardware", "precision",
    "disagg", "kv_offload", "spec_decode", "router",
)  # fmt: skip


def comparability_warnings(a: RunMeta, b: RunMeta) -> list[str]:
    """What makes runs A and B unlike, one sentence each: different traces (by
    content hash), different servers (endpoint, model, simulator settings, server
    labels), a run the client limited, a run that did not end well."""
    out = []
    ha, hb = a.trace.content_hash, b.trace.content_hash
    if ha and hb and ha != hb:
        out.append(
            f"A and B replayed different traces (content hash {ha[:12]} vs "
            f"{hb[:12]}): their figures describe different workloads"
        )
    servers = _server_differences(a, b)
    if servers:
        out.append(f"A and B ran against different servers ({'; '.join(servers)})")
    for name, meta in (("A", a), ("B", b)):
        check = meta.client_check
        if check is not None and check.limited:
            why = "; ".join(check.reasons)
            out.append(
                f"{name} was CLIENT-LIMITED ({why or 'see its client_check'}): its "
                "latencies include the client's own delays"
            )
        reason = meta.incomplete_reason
        if reason is not None:
            out.append(f"{name} is an incomplete run: {reason}")
    return out


def _server_differences(a: RunMeta, b: RunMeta) -> list[str]:
    pairs: list[tuple[str, Any, Any]] = [("model", a.model, b.model)]
    if a.simulated != b.simulated:
        pairs.append(("simulated", a.simulated, b.simulated))
    elif a.simulated:  # the built-in simulator listens on a new port every run
        if a.sim != b.sim:
            pairs.append(
                (
                    "simulator",
                    None if a.sim is None else a.sim.args,
                    None if b.sim is None else b.sim.args,
                )
            )
    else:
        pairs.append(("endpoint", a.endpoint, b.endpoint))
    pairs += [(k, a.labels.get(k), b.labels.get(k)) for k in SERVER_LABELS]
    return [f"{k}: {x} vs {y}" for k, x, y in pairs if x != y]
