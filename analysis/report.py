"""The self-contained HTML report: tables plus PNG plots embedded as base64.

Plots use matplotlib's Agg backend (no display). Input: loaded runs and their
summaries; output: one HTML string (the CLI writes the file).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis import metrics as m
from analysis.load import Run
from analysis.text import fmt_value, summary_rows

_NS_PER_S = 1e9
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
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
    fn = m.ttft_ms if metric == "ttft_ms" else m.e2e_ms
    fig, (ax,) = _figure()
    for run in runs:
        v = np.sort(fn(run.requests))
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=run.name)
    ax.axhline(0.9, color="#999", lw=0.8, ls="--")
    ax.set_xlabel(f"{metric.removesuffix('_ms').upper()} (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{metric.removesuffix('_ms').upper()} CDF (ok, measured requests)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


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


def _gauge(sm: pd.DataFrame, metric: str) -> pd.Series:
    rows = sm[sm["metric"] == metric]
    return rows.groupby("scrape_ns")["value"].mean()


def _counter_rate(sm: pd.DataFrame, num: str, den: str) -> pd.Series:
    a = sm[sm["metric"] == num].groupby("scrape_ns")["value"].sum().diff()
    b = sm[sm["metric"] == den].groupby("scrape_ns")["value"].sum().diff()
    ratio = a / b
    return ratio[b > 0]


def timeline_plot(run: Run) -> str:
    """Output throughput and in-flight requests over time, plus the scraped server
    KV usage and per-interval prefix-cache hit rate when present."""
    df = run.requests
    start = m.column(df, "start_ns")
    end = m.column(df, "end_ns")
    sent = ~np.isnan(start)
    end = np.where(np.isnan(end), start, end)
    sm = run.server_metrics
    has_server = not sm.empty
    fig, axes = _figure(rows=3 if has_server else 2, height=2.4)
    if sent.any():
        # Each ok request decodes its output tokens evenly from first token to end:
        # +rate at its first token, -rate at its end; the running sum is tok/s.
        ok = m.has_status(df, "ok") & sent
        first = m.column(df, "first_token_ns")
        out = np.nan_to_num(m.column(df, "output_tokens"))
        span = (end - first) / _NS_PER_S
        dec = ok & ~np.isnan(first) & (span > 0)
        rate = out[dec] / span[dec]
        t = np.concatenate([first[dec], end[dec]])
        order = np.argsort(t, kind="stable")
        steps = np.concatenate([rate, -rate])[order]
        axes[0].step(t[order] / _NS_PER_S, np.cumsum(steps), where="post")
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
    return _png(fig)


def hit_plot(summaries: Sequence[dict[str, Any]]) -> str:
    """Ideal vs achieved prefix-cache hit rate per run (server, Prometheus, LRU)."""
    kinds = ("ideal", "server", "prometheus", "lru")
    fig, (ax,) = _figure()
    x = np.arange(len(summaries))
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        vals = [s["cache_hit_rate"].get(kind) for s in summaries]
        vals = [np.nan if v is None else v for v in vals]
        ax.bar(x + k * width, vals, width, label=kind)
    ax.set_xticks(x + width * (len(kinds) - 1) / 2)
    ax.set_xticklabels([s["run"]["name"] for s in summaries])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("prefix-cache hit rate")
    ax.set_title("Ideal (trace) vs achieved hit rate")
    ax.legend(fontsize="small")
    return _png(fig)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(
    runs: Sequence[Run],
    summaries: Sequence[dict[str, Any]],
    *,
    sweep: pd.DataFrame | None = None,
) -> str:
    """The whole report as one HTML document (no external resources)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>Replay report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Agentic trace replay report</h1>",
    ]
    for s in summaries:
        r = s["run"]
        sim = " (simulated endpoint)" if r.get("simulated") else ""
        parts.append(
            f"<p class='note'><b>{html.escape(r['name'])}</b>: model "
            f"{html.escape(str(r.get('model')))} at "
            f"{html.escape(str(r.get('endpoint')))}{sim}; mode "
            f"{html.escape(json.dumps(r.get('mode')))}</p>"
        )
    rows = summary_rows(summaries)
    parts.append("<h2>Summary</h2>")
    parts.append(_table(["", *(s["run"]["name"] for s in summaries)], rows))
    parts.append("<h2>Latency</h2>")
    parts.append(cdf_plot(runs, "ttft_ms"))
    parts.append(cdf_plot(runs, "e2e_ms"))
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
    parts.append("<h2>Timelines</h2>")
    parts.extend(timeline_plot(run) for run in runs)
    parts.append("</body></html>")
    return "\n".join(parts)
