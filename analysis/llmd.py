"""A run as llm-d's Benchmark Report v0.2 (``replayer analyze RUN --format llmd-br``):
the figures of :func:`analysis.summary.summarize`, in the report's units and shape.
See docs/run-directory.md#llm-d-benchmark-report."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from typing import Any

import numpy as np

from analysis import metrics as m
from analysis.load import Run
from analysis.results import Latency
from analysis.summary import Summary

BR_VERSION = "0.2"
_COMPONENT_SCHEMA = "0.0.1"  # the load section's own schema version
# (report field, our figure, its units in the report)
_LATENCY = (
    ("time_to_first_token", "ttft_ms", "ms"),
    ("time_per_output_token", "tpot_ms", "ms/token"),
    ("inter_token_latency", "itl_ms", "ms/token"),
    ("request_latency", "e2e_ms", "ms"),
)
_THROUGHPUT = (
    ("input_token_rate", "input", "tokens/s"),
    ("output_token_rate", "output", "tokens/s"),
    ("total_token_rate", "total", "tokens/s"),
    ("requests_rate", "requests", "queries/s"),
)


def _stats(figures: Latency, units: str) -> dict[str, Any] | None:
    """A Statistics object (``units`` and ``mean`` required) from our figures; None
    when nothing was measured (no mean to give)."""
    if not math.isfinite(figures.mean):
        return None
    out: dict[str, Any] = {"units": units, "mean": figures.mean}
    for key in ("p50", "p90", "p99"):
        v = getattr(figures, key)
        if math.isfinite(v):
            out[key] = v
    return out


def _rate(value: float, units: str) -> dict[str, Any] | None:
    return {"units": units, "mean": value} if math.isfinite(value) else None


def _lengths(values: np.ndarray[Any, Any]) -> dict[str, Any] | None:
    """A SequenceLength (distribution, value >= 1, spread) of token counts."""
    v = values[~np.isnan(values)]
    if not v.size:
        return None
    return {
        "distribution": "other",
        "value": max(1.0, float(v.mean())),
        "std_dev": float(v.std()),
        "min": int(v.min()),
        "max": max(1, int(v.max())),
    }


def _iso(unix_ns: int | None) -> str | None:
    if unix_ns is None:
        return None
    t = dt.datetime.fromtimestamp(unix_ns / 1e9, tz=dt.UTC)
    return t.isoformat().replace("+00:00", "Z")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def benchmark_report(run: Run, summary: Summary) -> dict[str, Any]:
    """The Benchmark Report v0.2 of ``run`` (``summary``: its :func:`summarize`).

    Latencies in ms (per token for TPOT and ITL), rates in tokens/s and queries/s,
    over the rows ``analyze`` counts; the workload is the trace replayed (its
    prompt and output lengths as sent) and the replay's effective config as the
    load's native config; the KV hit rates (server, ideal) sit under
    observability. Figures not measured are left out, as the schema allows."""
    meta = run.meta
    df = m.numeric_view(run.requests)
    ok = m.measured_ok(df)
    recorded = meta.config.recorded  # the effective config as run.json holds it
    config_id = hashlib.sha256(
        json.dumps(recorded, sort_keys=True, default=str).encode()
    ).hexdigest()[:32]
    standardized = _drop_none(
        {
            "tool": meta.tool,
            "tool_version": meta.tool_version or "unknown",
            # Prompt tokens are made from the trace's hash ids, not sampled text.
            "source": "random",
            "stage": 0,
            "input_seq_len": _lengths(m.column(df, "prompt_tokens")[ok])
            or {"distribution": "other", "value": 1},
            "output_seq_len": _lengths(m.column(df, "requested_output_tokens")[ok]),
            "multi_turn": {"enabled": True},
            "concurrency": meta.mode.concurrency
            if meta.mode.kind == "concurrency"
            else None,
        }
    )
    duration = (
        f"PT{meta.duration_s}S" if meta.duration_s is not None else None
    )  # ISO-8601
    latency = _drop_none(
        {br: _stats(getattr(summary, ours), u) for br, ours, u in _LATENCY}
    )
    tput = summary.throughput_tok_s
    throughput = _drop_none(
        {br: _rate(getattr(tput, ours), u) for br, ours, u in _THROUGHPUT}
    )
    counts = summary.counts
    requests = _drop_none(
        {
            "total": counts.requests,
            "failures": sum(n for s, n in counts.errors.items() if s != "skipped"),
            "incomplete": counts.errors.get("skipped", 0),
            "input_length": _stats(
                m.describe(m.column(df, "prompt_tokens")[ok]), "count"
            ),
            "output_length": _stats(
                m.describe(m.column(df, "output_tokens")[ok]), "count"
            ),
        }
    )
    rates = summary.cache_hit_rate
    return {
        "version": BR_VERSION,
        "run": _drop_none(
            {
                "uid": meta.run_id or None,
                "time": _drop_none(
                    {
                        "start": _iso(meta.start_unix_ns),
                        "end": _iso(meta.end_unix_ns),
                        "duration": duration,
                    }
                )
                or None,
            }
        ),
        "scenario": {
            "load": {
                "metadata": {
                    "schema_version": _COMPONENT_SCHEMA,
                    "cfg_id": config_id,
                    "description": f"agentic trace replay of {meta.trace.path}",
                },
                "standardized": standardized,
                "native": {"config": recorded},
            }
        },
        "results": {
            "request_performance": {
                "aggregate": _drop_none(
                    {
                        "requests": requests,
                        "latency": latency or None,
                        "throughput": throughput or None,
                    }
                )
            },
            # Free-form in v0.2: the KV-cache hit rates this replayer measures.
            "observability": {
                "kv_cache_hit_rate": {
                    k: v
                    for k, v in (("server", rates.server), ("ideal", rates.ideal))
                    if math.isfinite(v)
                }
            },
        },
    }
