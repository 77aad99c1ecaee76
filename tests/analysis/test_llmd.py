"""`analyze RUN --format llmd-br`: llm-d's Benchmark Report v0.2 from a run directory,
checked against the schema's required fields and allowed keys, its figures equal to
`analyze --json`'s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.data.golden.make import INPUTS
from tests.processes import run_cli

# The v0.2 schema, as the pydantic models of llm-d/llm-d-benchmark define it:
# benchmark_report/schema_v0_2.py (commit 08e0c227ecc1afe3f411f6c36fa2b1c9d71c8647),
# units from benchmark_report/base.py. Per model: (required fields, allowed fields
# (extra="forbid"), the model of each nested field). None: anything goes.
_STATS = "Statistics"
SCHEMA: dict[str, tuple[set[str], set[str] | None, dict[str, str]]] = {
    "BenchmarkReportV02": (
        {"run", "results"},
        {"version", "run", "scenario", "results"},
        {"run": "Run", "scenario": "Scenario", "results": "Results"},
    ),
    "Run": (set(), {"uid", "eid", "cid", "time", "user"}, {"time": "RunTime"}),
    "RunTime": (set(), {"start", "end", "duration"}, {}),
    "Scenario": (set(), {"stack", "load"}, {"load": "Load"}),
    "Load": (
        {"metadata", "standardized", "native"},
        {"metadata", "standardized", "native"},
        {
            "metadata": "LoadMetadata",
            "standardized": "LoadStandardized",
            "native": "LoadNative",
        },
    ),
    "LoadMetadata": (set(), {"schema_version", "cfg_id", "description"}, {}),
    "LoadStandardized": (
        {"tool", "tool_version", "source", "input_seq_len"},
        {
            "tool",
            "tool_version",
            "source",
            "stage",
            "input_seq_len",
            "output_seq_len",
            "prefix",
            "multi_turn",
            "rate_qps",
            "concurrency",
        },
        {
            "input_seq_len": "SequenceLength",
            "output_seq_len": "SequenceLength",
            "multi_turn": "MultiTurn",
        },
    ),
    "SequenceLength": (
        {"distribution", "value"},
        {"distribution", "value", "std_dev", "min", "max"},
        {},
    ),
    "MultiTurn": (set(), {"enabled", "max_turns"}, {"max_turns": "SequenceLength"}),
    "LoadNative": (set(), {"args", "envars", "config"}, {}),
    "Results": (
        set(),
        {"request_performance", "observability", "profiling"},
        {"request_performance": "RequestPerformance"},
    ),
    "RequestPerformance": (
        set(),
        {"aggregate", "time_series"},
        {"aggregate": "AggregateRequestPerformance"},
    ),
    "AggregateRequestPerformance": (
        set(),
        {"requests", "latency", "throughput"},
        {
            "requests": "AggregateRequests",
            "latency": "AggregateLatency",
            "throughput": "AggregateThroughput",
        },
    ),
    "AggregateRequests": (
        {"total"},
        {"total", "failures", "incomplete", "input_length", "output_length"},
        {"input_length": _STATS, "output_length": _STATS},
    ),
    "AggregateLatency": (
        set(),
        {
            "time_to_first_token",
            "normalized_time_per_output_token",
            "time_per_output_token",
            "inter_token_latency",
            "request_latency",
        },
        dict.fromkeys(
            (
                "time_to_first_token",
                "normalized_time_per_output_token",
                "time_per_output_token",
                "inter_token_latency",
                "request_latency",
            ),
            _STATS,
        ),
    ),
    "AggregateThroughput": (
        set(),
        {"input_token_rate", "output_token_rate", "total_token_rate", "requests_rate"},
        dict.fromkeys(
            (
                "input_token_rate",
                "output_token_rate",
                "total_token_rate",
                "requests_rate",
            ),
            _STATS,
        ),
    ),
    _STATS: ({"units", "mean"}, None, {}),
}
# Units each Statistics field accepts (UNITS_TIME, UNITS_GEN_LATENCY, ...).
UNITS = {
    "time_to_first_token": {"ms", "s"},
    "request_latency": {"ms", "s"},
    "time_per_output_token": {"ms/token", "s/token"},
    "inter_token_latency": {"ms/token", "s/token"},
    "input_token_rate": {"tokens/s"},
    "output_token_rate": {"tokens/s"},
    "total_token_rate": {"tokens/s"},
    "requests_rate": {"queries/s"},
    "input_length": {"count"},
    "output_length": {"count"},
}


def check(obj: Any, model: str, where: str = "report") -> list[str]:
    """Every way ``obj`` breaks ``model``: a required field missing, a field the
    model forbids, a wrong unit, a value out of its range."""
    required, allowed, nested = SCHEMA[model]
    if not isinstance(obj, dict):
        return [f"{where}: expected an object"]
    errors = [f"{where}.{k}: required" for k in sorted(required - obj.keys())]
    if allowed is not None:
        errors += [f"{where}.{k}: not allowed" for k in sorted(obj.keys() - allowed)]
    for key, value in obj.items():
        if key in nested and value is not None:
            errors += check(value, nested[key], f"{where}.{key}")
        wrong = isinstance(value, dict) and value.get("units") not in UNITS.get(
            key, {value.get("units")}
        )
        if wrong:
            errors.append(f"{where}.{key}.units: {value.get('units')!r}")
    if model == "SequenceLength":
        if obj.get("distribution") not in {"fixed", "gaussian", "random", "other"}:
            errors.append(f"{where}.distribution: {obj.get('distribution')!r}")
        if not obj.get("value", 0) >= 1:
            errors.append(f"{where}.value: below 1")
    if model == "LoadStandardized" and obj.get("source") not in {"random", "sampled"}:
        errors.append(f"{where}.source: {obj.get('source')!r}")
    if model == "BenchmarkReportV02" and obj.get("version") != "0.2":
        errors.append(f"{where}.version: {obj.get('version')!r}")
    return errors


def test_the_checker_catches_what_the_schema_forbids() -> None:
    assert check({"run": {}, "results": {}, "extra": 1}, "BenchmarkReportV02") == [
        "report.extra: not allowed",
        "report.version: None",
    ]
    stats = {"requests": {"input_length": {"units": "ms", "mean": 1}}}
    assert check(stats, "AggregateRequestPerformance") == [
        "report.requests.total: required",
        "report.requests.input_length.units: 'ms'",
    ]


@pytest.mark.parametrize("name", ["plain", "agentx"])
def test_llmd_report_has_the_schemas_fields_and_analyzes_figures(name: str) -> None:
    run = INPUTS / name
    out = run_cli("analyze", str(run), "--format", "llmd-br")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert check(report, "BenchmarkReportV02") == []
    figures = run_cli("analyze", str(run), "--json")
    summary = json.loads(figures.stdout)
    agg = report["results"]["request_performance"]["aggregate"]
    for br_key, ours in (
        ("time_to_first_token", "ttft_ms"),
        ("time_per_output_token", "tpot_ms"),
        ("inter_token_latency", "itl_ms"),
        ("request_latency", "e2e_ms"),
    ):
        got = agg["latency"][br_key]
        assert {k: got[k] for k in ("mean", "p50", "p90", "p99")} == {
            k: summary[ours][k] for k in ("mean", "p50", "p90", "p99")
        }
    tput = summary["throughput_tok_s"]
    assert agg["throughput"]["input_token_rate"]["mean"] == tput["input"]
    assert agg["throughput"]["output_token_rate"]["mean"] == tput["output"]
    assert agg["throughput"]["total_token_rate"]["mean"] == tput["total"]
    assert agg["throughput"]["requests_rate"]["mean"] == tput["requests"]
    assert agg["requests"]["total"] == summary["requests"]
    errors = summary["errors"]
    assert agg["requests"]["incomplete"] == errors.get("skipped", 0)
    assert agg["requests"]["failures"] == sum(
        n for s, n in errors.items() if s != "skipped"
    )
    hit = report["results"]["observability"]["kv_cache_hit_rate"]
    assert hit["ideal"] == summary["cache_hit_rate"]["ideal"]
    meta = json.loads((run / "run.json").read_text())
    assert report["run"]["uid"] == meta["run_id"]
    assert report["scenario"]["load"]["native"]["config"] == meta["config"]
    assert (
        report["scenario"]["load"]["standardized"]["tool_version"]
        == (meta["tool_version"])
    )


def test_llmd_report_of_a_sweep_is_one_report_a_level() -> None:
    out = run_cli("analyze", str(INPUTS / "sweep"), "--format", "llmd-br")
    assert out.returncode == 0, out.stderr
    reports = json.loads(out.stdout)
    assert isinstance(reports, list)
    assert len(reports) == len([p for p in (INPUTS / "sweep").iterdir() if p.is_dir()])
    assert all(check(r, "BenchmarkReportV02") == [] for r in reports)
    levels = {r["scenario"]["load"]["standardized"].get("concurrency") for r in reports}
    assert len(levels) == len(reports)
