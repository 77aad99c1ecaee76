"""The self-contained HTML report: tables plus PNG plots (matplotlib's Agg backend)
embedded as base64, one HTML string out. See docs/metrics.md#analyze-compare-report."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from analysis.load import Run
from analysis.results import CacheRates, as_json
from analysis.summary import Summary
from analysis.text import capacity_headline, fmt_value, summary_rows
from replayer.records.capacity import CapacityCell, CapacityDoc, SloCheck

_NS_PER_S = 1e9
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
.wide{max-width:100%;overflow-x:auto;margin:1em 0}
table{border-collapse:collapse;font-size:90%}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left;position:sticky;left:0;background:#fff}
img{max-width:100%;display:block;margin:1em 0}
.note{color:#666;font-size:90%}
"""


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _figure(rows: int = 1, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(8, height * rows), squeeze=False)
    return fig, axes[:, 0]


def cdf_plot(runs: Sequence[Run], metric: str) -> str:
    """CDF of per-request ``ttft_ms`` or ``e2e_ms``, one line per run."""
    return _png(cdf_figure(runs, metric))


def line_styles(n: int) -> list[tuple[Any, str]]:
    """``n`` (colour, line style) pairs, all different: matplotlib's ten colours
    up to ten lines; beyond, tab20's ten dark shades solid, then its ten light
    ones dashed, then dotted and dash-dotted rounds."""
    import matplotlib as mpl

    if n <= 10:
        cmap = mpl.colormaps["tab10"]
        return [(cmap(i), "-") for i in range(n)]
    cmap = mpl.colormaps["tab20"]
    shades = [cmap(i) for i in range(0, 20, 2)] + [cmap(i) for i in range(1, 20, 2)]
    dashes = ["-", "--", ":", "-."]
    return [(shades[i % 20], dashes[(i // 10) % 4]) for i in range(n)]


def cdf_figure(runs: Sequence[Run], metric: str) -> Any:
    """The figure of :func:`cdf_plot`."""
    fn = m.ttft_ms if metric == "ttft_ms" else m.e2e_ms
    fig, (ax,) = _figure()
    for run, (colour, dash) in zip(runs, line_styles(len(runs)), strict=True):
        v = np.sort(fn(run.requests))
        if v.size:
            ax.plot(
                v,
                np.arange(1, v.size + 1) / v.size,
                label=run.name,
                color=colour,
                ls=dash,
            )
    ax.axhline(0.9, color="#999", lw=0.8, ls="--")
    # Log time: latencies span orders of magnitude, and on a linear axis the body
    # of the distribution sits in a sliver left of the tail.
    if ax.has_data() and ax.dataLim.x0 > 0:
        ax.set_xscale("log")
    ax.set_xlabel(f"{metric.removesuffix('_ms').upper()} (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{metric.removesuffix('_ms').upper()} CDF (ok, measured requests)")
    ax.grid(alpha=0.3)
    if len(runs) > 6:  # a long legend beside the lines, not over them
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")
    return fig


def pareto_plot(table: pd.DataFrame) -> str:
    """Throughput (per GPU when known) against E2E-normalized interactivity."""
    fig, (ax,) = _figure(height=4)
    ax.plot(table["interactivity_tok_s"], table["throughput_tok_s"], "o", color="#888")
    front = table[table["pareto"]].sort_values("interactivity_tok_s")
    ax.plot(front["interactivity_tok_s"], front["throughput_tok_s"], "o-", color="C1")
    for r in table.itertuples():
        ax.annotate(str(r.level), (r.interactivity_tok_s, r.throughput_tok_s))
    ax.set_xlabel("E2E-normalized interactivity (tok/s/user)")
    per_gpu = bool(table["per_gpu"].all())
    ax.set_ylabel("output tok/s per GPU" if per_gpu else "output tok/s")
    ax.set_title("Pareto front")
    ax.grid(alpha=0.3)
    return _png(fig)


def capacity_plot(doc: CapacityDoc) -> str:
    """A capacity search (``capacity.json``): each SLO metric's percentile against
    the level, one panel per metric, with the target line, the CI of each cell, and
    the knee (the highest level within the SLO) marked. A cell is coloured in each
    panel by that metric's own verdict; client-limited cells, which count for
    nothing, are grey squares."""
    return _png(capacity_figure(doc))


def capacity_notes(doc: CapacityDoc) -> list[str]:
    """What qualifies the answer: client-limited cells, a client-set bound, a range
    (keys a search before them lacks: no notes)."""
    result, notes = doc.result, []
    if result is None:
        return []
    limited = result.client_limited_cells
    if limited:
        notes.append(
            f"CLIENT-LIMITED cells, not counted (the replayer, not the server, set "
            f"their latencies): {', '.join(limited)}"
        )
    if result.lower_bound_by_client and result.client_limit is not None:
        notes.append(
            f"The answer is a lower bound set by the client "
            f"({result.client_limit.name} was client-limited); add --workers "
            "or --ray"
        )
    span = result.answer_range
    if result.thin and span:
        notes.append(
            f"Thin evidence: the cells support anything from {span[0]:g} to "
            f"{span[1]:g} ({'; '.join(result.thin_because)})"
        )
    return notes


def capacity_figure(doc: CapacityDoc) -> Any:
    """The figure of :func:`capacity_plot`."""
    search, result = doc.search, doc.result
    cells = sorted(doc.cells, key=lambda c: (c.level, c.duration_s or 0.0))
    # The last cell run at each level decides it (a widened one over its first).
    decided = {c.level: c for c in doc.cells}
    slos = list(search.slo)
    fig, axes = _figure(rows=max(1, len(slos)), height=3.0)
    pct = search.percentile
    what = (
        "session rate (trees/s)"
        if search.mode == "session_rate"
        else ("concurrent session trees")
    )
    for ax, key in zip(axes, slos, strict=False):
        target = search.slo[key]
        shown = [c for c in cells if decided[c.level] is c]

        def check(c: CapacityCell, slo: str = key) -> SloCheck:
            return next(k for k in c.checks if k.slo == slo)

        for kind, marker, colour, label in (
            (True, "o", "C2", "within SLO"),
            (False, "x", "C3", "over SLO"),
            (None, "s", "#999", "client-limited (not counted)"),
        ):
            pts = [
                c
                for c in shown
                if (None if c.client_limited else check(c).passed) is kind
            ]
            checks = [check(c) for c in pts]
            x = [c.level for c in pts]
            y = [k.value_ms for k in checks]
            err = [
                [max(0.0, k.value_ms - k.ci_ms[0]) for k in checks],
                [max(0.0, k.ci_ms[1] - k.value_ms) for k in checks],
            ]
            if x:
                ax.errorbar(x, y, yerr=err, fmt=marker, color=colour, label=label,
                            capsize=3)  # fmt: skip
        ax.axhline(target, color="#555", ls="--", lw=1, label=f"SLO {target:g} ms")
        knee = None if result is None else result.max_level
        if knee:
            ax.axvline(knee, color="C0", lw=1, label=f"knee: {knee:g}")
        if len({c.level for c in cells}) > 2:
            # The ramp is geometric: a log axis spaces its levels evenly.
            from matplotlib.ticker import FuncFormatter

            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        values = [
            k.value_ms
            for c in cells
            for k in c.checks
            if k.slo == key and k.value_ms and k.value_ms > 0
        ]
        if values and max([*values, target]) > 10 * min([*values, target]):
            # Past the knee latencies run away: on a linear axis everything within
            # the SLO would sit flat on the target line.
            ax.set_yscale("log")
        name = key.removesuffix("_ms").upper()
        queued = " from scheduled send" if key != "tpot_ms" else ""
        ax.set_ylabel(f"{name} p{pct:g}{queued} (ms)")
        ax.set_xlabel(what)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    axes[0].set_title(
        f"Capacity search: p{pct:g} over each cell's steady-state window (bars: 95% CI)"
    )
    return fig


def _gauge(sm: pd.DataFrame, metric: str) -> pd.Series:
    rows = sm[sm["metric"] == metric]
    return rows.groupby("scrape_ns")["value"].mean()


def _counter_rate(sm: pd.DataFrame, num: str, den: str) -> pd.Series:
    a = sm[sm["metric"] == num].groupby("scrape_ns")["value"].sum().diff()
    b = sm[sm["metric"] == den].groupby("scrape_ns")["value"].sum().diff()
    ratio = a / b
    return ratio[b > 0]


def _binned_output_rate(
    df: pd.DataFrame, end: npt.NDArray[np.float64], bins: int = 200
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Output tok/s per time bin (bin starts in s, rates). Each ok request's tokens
    are spread evenly from its first token to its end; a bin's rate is the tokens
    that fall in it over its width, so a burst of chunks read at once shows as what
    it is, not as an instant spike of hundreds of thousands of tok/s."""
    ok = m.has_status(df, "ok")
    first = m.column(df, "first_token_ns")
    out = np.nan_to_num(m.column(df, "output_tokens"))
    dec = ok & ~np.isnan(first) & ~np.isnan(end) & (out > 0)
    lo, hi, n = first[dec], np.maximum(end[dec], first[dec]), out[dec]
    if lo.size == 0:
        return np.zeros(1), np.zeros(1)
    t0, t1 = float(lo.min()), float(hi.max())
    edges = np.linspace(t0, t1 if t1 > t0 else t0 + 1.0, bins + 1)
    # Tokens emitted by time t: the integral of the summed rates, piecewise linear
    # between the start and end events; evaluated at the bin edges.
    span = np.maximum(hi - lo, 1.0)
    rate = n / span
    times = np.concatenate([lo, hi])
    order = np.argsort(times, kind="stable")
    times = times[order]
    slope = np.cumsum(np.concatenate([rate, -rate])[order])
    emitted = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(times))])
    at_edges = np.interp(edges, times, emitted)
    width_s = np.diff(edges) / _NS_PER_S
    return edges[:-1] / _NS_PER_S, np.diff(at_edges) / width_s


def timeline_plot(run: Run) -> str:
    """Output throughput and in-flight requests over time, plus the scraped server
    KV usage and per-interval prefix-cache hit rate when present."""
    return _png(timeline_figure(run))


def timeline_figure(run: Run) -> Any:
    """The figure of :func:`timeline_plot`."""
    df = run.requests
    start = m.column(df, "start_ns")
    end = m.column(df, "end_ns")
    sent = ~np.isnan(start)
    end = np.where(np.isnan(end), start, end)
    sm = run.server_metrics
    has_server = not sm.empty
    fig, axes = _figure(rows=3 if has_server else 2, height=2.4)
    if sent.any():
        t, tok_s = _binned_output_rate(df, end)
        axes[0].step(t, tok_s, where="post")
        events = np.concatenate([start[sent], end[sent]])
        steps = np.concatenate([np.ones(sent.sum()), -np.ones(sent.sum())])
        order = np.argsort(events, kind="stable")
        axes[1].step(events[order] / _NS_PER_S, np.cumsum(steps[order]), where="post")
    if run.meta.measure_start_ns:
        for ax in axes:
            ax.axvline(
                run.meta.measure_start_ns / _NS_PER_S, color="#999", ls="--", lw=0.8
            )
    axes[0].set_ylabel("output tok/s")
    axes[1].set_ylabel("in flight")
    axes[0].set_title(f"Timeline: {run.name}")
    if has_server:
        usage = _gauge(sm, "vllm:kv_cache_usage_perc")
        hit = _counter_rate(sm, m.PROM_HITS, m.PROM_QUERIES)
        if not usage.empty:
            axes[2].plot(usage.index / _NS_PER_S, usage.to_numpy(), label="KV usage")
        if not hit.empty:
            axes[2].plot(hit.index / _NS_PER_S, hit.to_numpy(), label="hit rate")
        axes[2].set_ylabel("fraction")
        axes[2].set_ylim(0, 1.05)
        axes[2].legend(fontsize="small")
    axes[-1].set_xlabel("run time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig


# Session trees listed per run in the per-tier table, the most requests first.
TIER_TREES_SHOWN = 30


def tier_sections(summaries: Sequence[Summary]) -> list[str]:
    """GPU, host and overall hit per run beside the ideal and LRU, per session tree
    and over time, for the runs whose rows or counters split the hits by tier."""
    split = [s for s in summaries if s.cache_tiers is not None]
    if not split:
        return []
    parts = ["<h2>KV cache per tier: GPU and host</h2>"]
    parts.append(
        _table(
            ["run", "from", "GPU hit", "host hit", "overall", "ideal", "LRU"],
            [
                [s.run.name, t.source, fmt_value(t.gpu, "pct"),
                 fmt_value(t.host, "pct"), fmt_value(t.overall, "pct"),
                 fmt_value(t.ideal, "pct"),
                 fmt_value(s.cache_hit_rate.lru.hit_rate
                           if s.cache_hit_rate.lru is not None else None, "pct")]
                for s in split
                if (t := s.cache_tiers) is not None
            ],
        )
    )  # fmt: skip
    for s in split:
        t = s.cache_tiers
        assert t is not None
        if t.over_time is not None and not t.over_time.empty:
            parts.append(_png(tier_time_figure(s.run.name, t.over_time)))
        if t.by_tree is not None and not t.by_tree.empty:
            trees = t.by_tree.sort_values("requests", ascending=False)
            parts.append(
                f"<p class='note'>{html.escape(s.run.name)}: per session tree "
                f"({min(len(trees), TIER_TREES_SHOWN)} of {len(trees)}, the most "
                "requests first)</p>"
            )
            parts.append(
                _table(
                    ["tree", "requests", "GPU hit", "host hit", "overall", "ideal"],
                    [
                        [str(r.root_session_id), fmt_value(r.requests, "int"),
                         fmt_value(r.gpu, "pct"), fmt_value(r.host, "pct"),
                         fmt_value(r.overall, "pct"), fmt_value(r.ideal, "pct")]
                        for r in trees.head(TIER_TREES_SHOWN).itertuples()
                    ],
                )
            )  # fmt: skip
    return parts


def tier_time_figure(name: str, over_time: pd.DataFrame) -> Any:
    """Each interval's GPU, host, overall and ideal hit rates and both tiers' KV
    usage, against the interval's middle."""
    fig, (ax,) = _figure(rows=1, height=2.6)
    mid = (over_time["start_s"] + over_time["end_s"]) / 2
    for col, label, style in (
        ("gpu", "GPU hit", "-"),
        ("host", "host hit", "-"),
        ("overall", "overall hit", "-"),
        ("ideal", "ideal hit", ":"),
        ("gpu_kv_usage", "GPU KV usage", "--"),
        ("host_kv_usage", "host KV usage", "--"),
    ):
        values = over_time[col].to_numpy(dtype=float)
        if np.isfinite(values).any():
            ax.plot(mid, values, style, label=label)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("fraction")
    ax.set_xlabel("run time (s)")
    ax.set_title(f"Hits per tier over time: {name}")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def hit_plot(summaries: Sequence[Summary]) -> str:
    """Ideal vs achieved prefix-cache hit rate per run (server, Prometheus, LRU):
    only the kinds some run has, each bar labelled with its value, and an axis
    zoomed to the values (96.3% beside 96.4% must read as different)."""
    return _png(hit_figure([(s.run.name, s.cache_hit_rate) for s in summaries]))


def _hit(rates: CacheRates, kind: str) -> float:
    if kind == "lru":
        return np.nan if rates.lru is None else rates.lru.hit_rate
    value: float = getattr(rates, kind)
    return value if _finite(value) else np.nan


def hit_figure(runs: Sequence[tuple[str, CacheRates]]) -> Any:
    """The figure of :func:`hit_plot`: each run's name and hit rates."""
    kinds = [
        kind
        for kind in ("ideal", "server", "prometheus", "lru")
        if any(_finite(_hit(rates, kind)) for _, rates in runs)
    ]
    fig, (ax,) = _figure()
    if not kinds:
        ax.set_title("Ideal (trace) vs achieved hit rate: no run has one")
        return fig
    x = np.arange(len(runs))
    width = 0.8 / len(kinds)
    shown: list[float] = []
    for k, kind in enumerate(kinds):
        vals = [_hit(rates, kind) for _, rates in runs]
        bars = ax.bar(x + k * width, vals, width, label=kind)
        ax.bar_label(
            bars, labels=[f"{v:.1%}" if np.isfinite(v) else "" for v in vals],
            fontsize="x-small", padding=2,
        )  # fmt: skip
        shown += [v for v in vals if np.isfinite(v)]
    ax.set_xticks(x + width * (len(kinds) - 1) / 2)
    ax.set_xticklabels([name for name, _ in runs])
    low, high = min(shown), max(shown)
    pad = max(0.01, (high - low) * 0.25)
    ax.set_ylim(max(0.0, low - pad), min(1.0, high + pad) + pad / 2)
    ax.yaxis.set_major_formatter(
        lambda v, _pos: f"{v:.0%}" if pad > 0.05 else f"{v:.1%}"
    )
    ax.set_ylabel("prefix-cache hit rate (axis zoomed)")
    ax.set_title("Ideal (trace) vs achieved hit rate")
    # Outside the axes: a legend inside covers a bar.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and bool(np.isfinite(value))


def position_plot(summary: Summary) -> str:
    """TTFT p90 and the prefix hit rates by turn bucket, for one run."""
    rows = summary.by_turn
    fig, axes = _figure(rows=2, height=2.6)
    labels = [r.group for r in rows]
    x = np.arange(len(rows))
    axes[0].plot(x, [r.ttft_ms_p90 for r in rows], "o-", label="TTFT p90")
    axes[0].plot(x, [r.ttft_ms_p50 for r in rows], "o-", label="TTFT p50")
    axes[0].set_ylabel("ms")
    axes[0].set_title(f"By turn within the session: {summary.run.name}")
    for key, label in (
        ("hit_rate_ideal", "ideal"),
        ("hit_rate_server", "server"),
        ("hit_rate_lru", "lru"),
    ):
        vals = [getattr(r, key) for r in rows]
        if any(_finite(v) for v in vals):
            axes[1].plot(
                x, [v if _finite(v) else np.nan for v in vals], "o-", label=label
            )
    axes[1].set_ylabel("prefix hit rate")
    axes[1].set_xlabel("turn index")
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize="small")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


# The trends the report draws from a results store: (trend METRIC, axis label).
HISTORY_CHARTS = (
    ("ttft_p90", "P90 TTFT (ms)"),
    ("tok_s_gpu", "output tok/s/GPU"),
    ("interactivity", "P90 interactivity (tok/s/user)"),
    ("server_hit", "server prefix hit"),
)


def history_figure(trends: Sequence[dict[str, Any]]) -> Any:
    """One panel per trend (``analysis.history.trend``): the figure over run date,
    one line per configuration, each point's ``by`` (the engine version) written
    where it changes along the line."""
    from datetime import datetime

    from matplotlib.dates import ConciseDateFormatter

    fig, axes = _figure(rows=len(trends), height=2.8)
    for ax, found in zip(axes, trends, strict=True):
        series = found["configurations"]
        by = found["by"]
        marked: set[tuple[Any, Any]] = set()
        for (colour, dash), s in zip(line_styles(len(series)), series, strict=True):
            points = [p for p in s["points"] if _finite(p["value"])]
            if not points:
                continue
            x = [datetime.fromisoformat(p["run_date"]) for p in points]
            y = [p["value"] for p in points]
            ax.plot(x, y, marker="o", ms=3, color=colour, ls=dash, label=s["name"])
            last = object()
            for xi, yi, p in zip(x, y, points, strict=True):
                # Once per version and day: lines that change together share it.
                if p[by] != last and (xi.date(), p[by]) not in marked:
                    marked.add((xi.date(), p[by]))
                    ax.annotate(str(p[by]), (xi, yi), xytext=(2, 5), fontsize=7,
                                textcoords="offset points", color=colour)  # fmt: skip
                last = p[by]
        label = dict(HISTORY_CHARTS).get(found["metric"], found["metric"])
        ax.set_ylabel(label, fontsize="small")
        ax.set_title(f"{label} ({by} marked where it changes)", fontsize="medium")
        ax.grid(alpha=0.3)
        dates = ConciseDateFormatter(ax.xaxis.get_major_locator())  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_formatter(dates)
        if ax is axes[0] and ax.get_legend_handles_labels()[0]:  # one legend for all
            ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.subplots_adjust(hspace=0.55)
    return fig


def history_section(trends: Sequence[dict[str, Any]]) -> str:
    """The report's "Results over time" section (a results store's trends)."""
    parts = ["<h2>Results over time</h2>"]
    sets = trends[0]["sets"] if trends else []
    if len(sets) > 1:
        parts.append(
            "<p><b>MIXED: these runs replayed different traces, protocols or tool "
            "versions; lines of different ones do not compare.</b></p>"
        )
    elif sets:
        (one,) = sets
        parts.append(
            f"<p class='note'>All points compare: trace "
            f"{html.escape(str(one['trace_hash'])[:12])}, protocol "
            f"{html.escape(str(one['protocol']))}, tool "
            f"{html.escape(str(one['tool_version']))}.</p>"
        )
    if not any(t["configurations"] for t in trends):
        parts.append("<p>The results store holds no runs.</p>")
        return "\n".join(parts)
    parts.append(_png(history_figure(trends)))
    return "\n".join(parts)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
        for r in rows
    )
    # A scroll box: a run (or cell) per column outgrows the page at a dozen.
    return f"<div class='wide'><table><tr>{head}</tr>{body}</table></div>"


def render_html(
    runs: Sequence[Run],
    summaries: Sequence[Summary],
    *,
    sweep: pd.DataFrame | None = None,
    capacity: CapacityDoc | None = None,
    history: Sequence[dict[str, Any]] | None = None,
) -> str:
    """The whole report as one HTML document (no external resources): the runs'
    sections, then a results store's trends (``history``) when given."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>Replay report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Agentic trace replay report</h1>",
    ]
    if runs:
        parts.extend(_run_sections(runs, summaries, sweep=sweep, capacity=capacity))
    if history is not None:
        parts.append(history_section(history))
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_sections(
    runs: Sequence[Run],
    summaries: Sequence[Summary],
    *,
    sweep: pd.DataFrame | None,
    capacity: CapacityDoc | None,
) -> list[str]:
    parts: list[str] = []
    for s in summaries:
        r = s.run
        sim = " (simulated endpoint)" if r.simulated else ""
        where = (
            f"in virtual time on {html.escape(r.virtual)} (predicted, not measured)"
            if r.virtual is not None
            else f"at {html.escape(str(r.endpoint))}{sim}"
        )
        parts.append(
            f"<p class='note'><b>{html.escape(r.name)}</b>: model "
            f"{html.escape(str(r.model))} {where}; mode "
            f"{html.escape(json.dumps(as_json(r.mode)))}</p>"
        )
    rows = summary_rows(summaries)
    parts.append("<h2>Summary</h2>")
    parts.append(_table(["", *(s.run.name for s in summaries)], rows))
    parts.append("<h2>Latency</h2>")
    parts.append(cdf_plot(runs, "ttft_ms"))
    parts.append(cdf_plot(runs, "e2e_ms"))
    if capacity is not None and capacity.cells and capacity.result is not None:
        result = capacity.result
        parts.append("<h2>Capacity under the SLO</h2>")
        headline = capacity_headline(capacity)
        if headline is not None:
            parts.append(f"<p><b>{html.escape(headline)}</b></p>")
        source = "virtual: predicted, " if result.source == "virtual" else ""
        parts.append(
            f"<p>Highest level within the SLO: <b>{result.max_level:g}</b>"
            f" ({source}{html.escape(result.status)}); "
            + html.escape("; ".join(result.failed_because) or "no failing level")
            + "</p>"
        )
        parts.extend(
            f"<p><b>{html.escape(n)}</b></p>" for n in capacity_notes(capacity)
        )
        parts.append(capacity_plot(capacity))
    if sweep is not None and not sweep.empty:
        parts.append("<h2>Sweep</h2>")
        parts.append(pareto_plot(sweep))
        parts.append(
            _table(
                ["level", "interactivity (tok/s/user)", "throughput", "Pareto"],
                [
                    [
                        str(t.level),
                        fmt_value(t.interactivity_tok_s, "num"),
                        fmt_value(t.throughput_tok_s, "num"),
                        "*" if t.pareto else "",
                    ]
                    for t in sweep.itertuples()
                ],
            )
        )
    parts.append("<h2>KV cache: ideal vs achieved</h2>")
    parts.append(hit_plot(summaries))
    parts.extend(tier_sections(summaries))
    parts.append("<h2>By turn and subagent depth</h2>")
    for s in summaries:
        parts.append(position_plot(s))
        for by, title in ((s.by_turn, "turn"), (s.by_depth, "subagent depth")):
            lru = any(r.hit_rate_lru is not None for r in by)
            parts.append(
                _table(
                    [title, "requests", "TTFT p50 (ms)", "TTFT p90 (ms)",
                     "E2E p90 (ms)", "hit server", "hit ideal",
                     *(["hit LRU"] if lru else [])],
                    [
                        [r.group, fmt_value(r.requests, "int"),
                         fmt_value(r.ttft_ms_p50, "num"),
                         fmt_value(r.ttft_ms_p90, "num"),
                         fmt_value(r.e2e_ms_p90, "num"),
                         fmt_value(r.hit_rate_server, "pct"),
                         fmt_value(r.hit_rate_ideal, "pct"),
                         *([fmt_value(r.hit_rate_lru, "pct")] if lru else [])]
                        for r in by
                    ],
                )
            )  # fmt: skip
    parts.append("<h2>Timelines</h2>")
    parts.extend(timeline_plot(run) for run in runs)
    return parts
