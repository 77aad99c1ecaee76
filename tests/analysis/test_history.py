"""The results store (analysis.history, `replayer history`): idempotent adds, sweep and
capacity folders, the same P90s as `analyze`, trend's refusal to mix traces, planted
regressions, the cache-hit canary, and a store that survives errors and a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from replayer.cli import main
from replayer.records import RequestRecord
from tests.builders import growing_session, timed_record, trace_of
from tests.processes import REPLAYER

MS = 1_000_000
DAY_NS = 86_400 * 10**9
T0 = 1_780_000_000 * 10**9


def _cli(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    return result


def _json(*args: str) -> Any:
    return json.loads(_cli(*args, "--json").output)


def _rows(seed: int, n: int, ttft_scale: float = 1.0) -> list[RequestRecord]:
    """``n`` rows with lognormal TTFTs (x ``ttft_scale``), some warm-up, failed,
    single-token and cache-less rows, as the figures' populations must handle."""
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(np.log(300), 0.5, n) * ttft_scale
    out = rng.integers(1, 40, n)
    status = rng.choice(["ok", "timeout", "http_error"], n, p=[0.9, 0.05, 0.05])
    prompt = rng.integers(1000, 50_000, n)
    rows = []
    for i in range(n):
        cached = None if i % 5 == 0 else int(prompt[i] * 0.6)
        rows.append(
            timed_record(
                start_ms=i * 7.0,
                ttft_ms=float(ttft[i]),
                e2e_ms=float(ttft[i]) + 20.0 * int(out[i]),
                out=int(out[i]),
                session_id=f"s{i % 9}",
                request_index=i,
                status=str(status[i]),
                warmup=i < n // 20,
                prompt_tokens=int(prompt[i]),
                cached_tokens=cached,
                ideal_cached_tokens=int(prompt[i] * 0.7),
            )
        )
    return rows


def _run(
    path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
    *,
    run_id: str,
    day: int = 0,
    rows: list[RequestRecord] | None = None,
    trace_hash: str = "trace-a",
    **labels: Any,
) -> Path:
    meta = make_meta(
        run_id=run_id,
        start_unix_ns=T0 + day * DAY_NS,
        end_unix_ns=T0 + day * DAY_NS + 10**10,
        labels={"engine": "vllm", "gpus": 8, "hardware": "H100", **labels},
        trace={"content_hash": trace_hash, "path": None, "block_size": 64},
    )
    return make_run_dir(path, _rows(day, 200) if rows is None else rows, meta=meta)


def test_history_add_is_idempotent_and_finds_a_moved_run_by_its_id(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    db = str(tmp_path / "h.duckdb")
    run = _run(tmp_path / "r1", make_run_dir, make_meta, run_id="r1")
    first = _json("history", "add", str(run), "--db", db)
    assert [r["status"] for r in first["runs"]] == ["added"]
    again = _json("history", "add", str(run), "--db", db)
    assert [r["status"] for r in again["runs"]] == ["already"]
    assert len(_json("history", "show", "--db", db)["runs"]) == 1

    later = _run(tmp_path / "r2", make_run_dir, make_meta, run_id="r2", day=1)
    _cli("history", "add", str(later), "--db", db)
    moved = run.rename(tmp_path / "archive-r1")
    (stored,) = _json("history", "show", "--db", db, "--run-id", "r1")["runs"]
    assert stored["path_exists"] is False  # found by id, its directory gone
    gone = _cli("history", "regressions", "--db", db, code=2)  # r2 against r1's rows
    assert "r1: its directory" in gone.output
    assert "add` it again" in gone.output
    out = _json("history", "add", str(moved), "--db", db)
    assert [r["status"] for r in out["runs"]] == ["moved"]
    (stored,) = _json("history", "show", "--db", db, "--run-id", "r1")["runs"]
    assert stored["path"] == str(moved.resolve())
    assert stored["path_exists"] is True
    assert _json("history", "regressions", "--db", db)["comparisons"]


def test_history_adds_every_cell_of_a_sweep_and_of_a_capacity_folder(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    from tests.builders import capacity_cell

    sweep = tmp_path / "sweep"
    for c in (1, 2, 4):
        _run(sweep / f"c{c}", make_run_dir, make_meta, run_id=f"sw-c{c}")
    (sweep / "sweep.json").write_text(json.dumps({"levels": ["c1", "c2", "c4"]}))
    cap = tmp_path / "cap"
    names = ["c8", "c16", "c12", "c12-wide"]  # a borderline cell run again, wider
    for k, name in enumerate(names):
        _run(cap / name, make_run_dir, make_meta, run_id=f"cap-{name}", day=k)
    doc = {
        "search": {"slo": {"ttft_ms": 100.0}, "percentile": 90},
        "cells": [capacity_cell(n, 8, (50, True), (20, True)) for n in names],
        "result": {"status": "found", "max_level": 8},
    }
    (cap / "capacity.json").write_text(json.dumps(doc))
    (cap / "sweep.json").write_text(json.dumps({"levels": ["c8", "c12-wide"]}))
    db = str(tmp_path / "h.duckdb")
    added = _json("history", "add", str(sweep), str(cap), "--db", db)["runs"]
    assert sorted(r["run_id"] for r in added) == sorted(
        [f"sw-c{c}" for c in (1, 2, 4)] + [f"cap-{n}" for n in names]
    )
    assert len(_json("history", "show", "--db", db)["runs"]) == 7


# analyze --json key → the store's column, for every figure the store keeps.
_SAME = {
    ("ttft_ms", "p50"): "ttft_ms_p50",
    ("ttft_ms", "p90"): "ttft_ms_p90",
    ("ttft_ms", "p99"): "ttft_ms_p99",
    ("tpot_ms", "p50"): "tpot_ms_p50",
    ("tpot_ms", "p90"): "tpot_ms_p90",
    ("e2e_ms", "p50"): "e2e_ms_p50",
    ("e2e_ms", "p90"): "e2e_ms_p90",
    ("interactivity_tok_s", "p90"): "interactivity_tok_s_p90",
    ("throughput_tok_s", "output"): "throughput_output_tok_s",
    ("throughput_tok_s", "total"): "throughput_total_tok_s",
    ("cache_hit_rate", "server"): "server_hit",
    ("cache_hit_rate", "ideal"): "ideal_hit",
}


def test_history_figures_equal_analyzes_to_the_last_digit(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    db = str(tmp_path / "h.duckdb")
    dirs = [
        _run(tmp_path / f"r{k}", make_run_dir, make_meta, run_id=f"r{k}", day=k,
             rows=_rows(k, n, scale))
        for k, (n, scale) in enumerate([(7, 1.0), (200, 1.0), (333, 3.7), (1000, 0.1)])
    ]  # fmt: skip
    # A crash left a part file half-written: skipped by both.
    (dirs[2] / "requests" / "part-9-00009.parquet").write_bytes(b"PAR1 cut short")
    _cli("history", "add", *map(str, dirs), "--db", db)
    stored = {r["run_id"]: r for r in _json("history", "show", "--db", db)["runs"]}
    for k, d in enumerate(dirs):
        got = _json("analyze", str(d))
        row = stored[f"r{k}"]
        for (key, stat), column in _SAME.items():
            assert row[column] == got[key][stat], (d.name, column)
        assert (
            row["e2e_norm_interactivity_tok_s"] == got["e2e_norm_interactivity_tok_s"]
        )
        assert row["tok_s_gpu"] == got["throughput_tok_s"]["per_gpu"]["output"]
        assert row["requests"] == got["requests"]
    # DuckDB's own quantile_cont interpolates as numpy does, but rounds differently
    # in the last bit: the store takes its percentiles by the project's definition.
    import duckdb

    x = np.random.default_rng(3).lognormal(5, 2, 1001)
    con = duckdb.connect()
    q = con.execute(
        "SELECT quantile_cont(v, 0.9) FROM (SELECT unnest(?) v)", [x.tolist()]
    )
    assert q.fetchone()[0] == pytest.approx(np.percentile(x, 90), rel=1e-15)


def test_history_trend_refuses_mixed_trace_hashes_unless_mixed(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    db = str(tmp_path / "h.duckdb")
    for k, (version, trace) in enumerate([("0.9", "trace-a"), ("0.10", "trace-a"),
                                          ("0.10", "trace-b")]):  # fmt: skip
        run = _run(tmp_path / f"r{k}", make_run_dir, make_meta, run_id=f"r{k}",
                   day=k, engine_version=version, trace_hash=trace)  # fmt: skip
        _cli("history", "add", str(run), "--db", db)
    dated = _json("history", "show", "--db", db, "--since", "2026-05-29T21:00",
                  "--until", "2026-05-31")  # fmt: skip
    assert [r["run_id"] for r in dated["runs"]] == ["r2"]  # day 2: 05-30 20:26 UTC
    later = _json("history", "show", "--db", db, "--since", "2026-05-29T22:00+02:00")
    assert [r["run_id"] for r in later["runs"]] == ["r1", "r2"]  # 20:00 UTC
    refused = _cli("history", "trend", "ttft_p90", "--db", db, code=2)
    assert "do not compare" in refused.output
    assert "--mixed" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    one = _json("history", "trend", "ttft_p90", "--db", db, "--trace", "trace-a")
    assert one["comparable"] is True
    (series,) = one["configurations"]
    assert [p["engine_version"] for p in series["points"]] == ["0.9", "0.10"]
    both = _json("history", "trend", "ttft_p90", "--db", db, "--mixed")
    assert both["comparable"] is False
    assert len(both["configurations"]) == 2  # one line per trace
    text = _cli("history", "trend", "ttft_p90", "--db", db, "--mixed").output
    assert "MIXED" in text
    # Another tool version, or another protocol, on the same trace: refused too.
    for k, change in enumerate(
        [{"tool_version": "0.2.0"}, {"protocol": {"profile": "agentx"}}], start=3
    ):
        run = _run(tmp_path / f"r{k}", make_run_dir, make_meta, run_id=f"r{k}", day=k)
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, **change}))
        alone = str(tmp_path / f"h{k}.duckdb")  # beside r0 (trace-a, 0.1.0, none)
        _cli("history", "add", str(tmp_path / "r0"), str(run), "--db", alone)
        out = _cli("history", "trend", "server_hit", "--db", alone, code=2).output
        assert "do not compare: 2 different" in out


def test_history_trend_refusal_names_the_field_that_differs(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    # Runs alike but for their warm-up: only the protocol config tells them apart.
    db = str(tmp_path / "h.duckdb")
    for k in range(6):
        run = _run(tmp_path / f"r{k}", make_run_dir, make_meta, run_id=f"r{k}", day=k)
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, "warmup_s": 10.0 * k}))
        _cli("history", "add", str(run), "--db", db)
    out = _cli("history", "trend", "ttft_p90", "--db", db, code=2).output
    assert out == (
        "Error: the selected runs do not compare: 6 different (trace hash, protocol, "
        "protocol config, tool version) sets, which differ in protocol_config "
        "(warmup_s=0.0; warmup_s=10.0; warmup_s=20.0; warmup_s=30.0; and 2 more); "
        "narrow them with --trace / --label, or pass --mixed to draw them anyway\n"
    )


def test_history_regressions_fail_on_must_be_a_number(tmp_path: Path) -> None:
    db = str(tmp_path / "h.duckdb")
    for value in ("nan", "inf", "-1"):
        res = _cli("history", "regressions", "--db", db, "--fail-on", value, code=2)
        assert "--fail-on" in res.output
        assert "Traceback" not in res.output


def test_history_regressions_flags_a_planted_20pct_p90_ttft_regression(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    db = str(tmp_path / "h.duckdb")
    plans = {"H100": 1.20, "MI355X": 1.01}  # the latest run's TTFT vs its predecessor
    for hw, scale in plans.items():
        for k, (version, s) in enumerate([("1.0", 1.0), ("1.1", scale)]):
            run = _run(tmp_path / f"{hw}-{k}", make_run_dir, make_meta,
                       run_id=f"{hw}-{k}", day=k, rows=_rows(10 + k, 1500, s),
                       hardware=hw, engine_version=version)  # fmt: skip
            _cli("history", "add", str(run), "--db", db)
    found = _json("history", "regressions", "--db", db, "--resamples", "400")
    ttft = {r["name"]: r for r in found["comparisons"] if r["figure"] == "ttft_ms_p90"}
    (h100,) = [r for n, r in ttft.items() if "H100" in n]
    (mi355,) = [r for n, r in ttft.items() if "MI355X" in n]
    assert h100["flagged"]
    assert h100["verdict"] == "worse"
    assert h100["ci_low"] > 0
    assert 10 < h100["delta_pct"] < 30
    assert not mi355["flagged"]  # 1% sits inside its CI
    assert mi355["ci_low"] < 0 < mi355["ci_high"]
    failing = _cli("history", "regressions", "--db", db, "--resamples", "400",
                   "--fail-on", "10", code=1)  # fmt: skip
    assert "FAIL" in failing.output
    assert "H100" in failing.output
    # A delta and its CI in one unit: ms beside ms, % beside %.
    (row,) = [
        ln
        for ln in failing.output.splitlines()
        if "H100" in ln and "ttft_ms_p90" in ln and "predecessor" in ln
    ]
    ms_delta = (f"{h100['delta']:+,.2f} [{h100['ci_low']:+,.2f}, "
                f"{h100['ci_high']:+,.2f}]")  # fmt: skip
    pct = (f"{h100['delta_pct']:+,.1f} [{h100['ci_low_pct']:+,.1f}, "
           f"{h100['ci_high_pct']:+,.1f}]")  # fmt: skip
    assert ms_delta in " ".join(row.split())
    assert pct in " ".join(row.split())
    assert h100["ci_low_pct"] == pytest.approx(h100["ci_low"] / h100["a"] * 100)
    assert "delta (ms)" in failing.output
    assert "95% CI (%)" in failing.output
    _cli("history", "regressions", "--db", db, "--resamples", "400", "--fail-on", "40")
    # Against a baseline: the H100 configuration's run of engine 1.0.
    base = _json("history", "regressions", "--db", db, "--resamples", "400",
                 "--baseline", "1.0", "--label", "hardware=H100")  # fmt: skip
    assert {r["against"] for r in base["comparisons"]} == {"predecessor", "baseline"}
    # The m-out-of-n bootstrap (what runs of more than --bootstrap-rows take: 300 of
    # each run's 1,500 values a resample, deviations scaled by sqrt(300 / 1,500)):
    # the same verdicts, and CIs about as wide as the plain bootstrap's.
    small = _json("history", "regressions", "--db", db, "--resamples", "400",
                  "--bootstrap-rows", "300")  # fmt: skip
    assert small["bootstrap_rows"] == 300
    by_name = {(r["name"], r["figure"]): r for r in small["comparisons"]}
    for plain in found["comparisons"]:
        mn = by_name[plain["name"], plain["figure"]]
        assert mn["delta_pct"] == plain["delta_pct"]  # the point: all the rows
        assert mn["flagged"] == plain["flagged"]
        width, mn_width = (
            r["ci_high"] - r["ci_low"] for r in (plain, mn)
        )  # fmt: skip
        assert 0.5 < mn_width / width < 2.0, (plain, mn)


def test_history_canary_flags_a_run_10_points_under_its_lru_estimate(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    from replayer.records.rundir import trace_content_hash
    from traces.io import write_trace

    trace = trace_of(*(growing_session(f"s{k}", 6) for k in range(4)))
    trace_path = write_trace(trace, tmp_path / "trace.jsonl")
    db = str(tmp_path / "h.duckdb")
    real = trace_content_hash(trace_path)
    for name, lost, digest in (
        ("good", 0.03, real), ("bad", 0.12, real), ("other", 0.12, "another trace")
    ):  # fmt: skip
        rows = []
        for s in trace.sessions:
            for i, req in enumerate(s.requests):
                ideal = 4 * (1 + i) if i else 0  # the blocks of the turn before
                rows.append(
                    timed_record(
                        start_ms=len(rows) * 10.0, ttft_ms=5.0, e2e_ms=20.0, out=3,
                        session_id=s.session_id, request_index=i,
                        prompt_tokens=req.input_tokens,
                        cached_tokens=max(0, ideal - round(lost * req.input_tokens)),
                        ideal_cached_tokens=ideal,
                    )
                )  # fmt: skip
        meta = make_meta(
            run_id=name,
            trace={"content_hash": digest, "path": str(trace_path), "block_size": 4},
        )
        make_run_dir(tmp_path / name, rows, meta=meta)
        said = _cli("history", "add", str(tmp_path / name), "--db", db,
                    "--kv-capacity-tokens", "100000").output  # fmt: skip
    # The file at run.json's trace path no longer holds what that run replayed.
    assert "no LRU estimate" in said
    assert "no longer holds the trace replayed" in said
    found = {r["run_id"]: r for r in _json("history", "canary", "--db", db)["runs"]}
    other = found.pop("other")
    assert other["lru_hit"] is None
    assert not other["flagged"]  # no estimate, never flagged
    for r in found.values():
        assert r["lru_hit"] == pytest.approx(r["ideal_hit"])  # a cache that holds all
    assert found["bad"]["under_lru_points"] >= 10
    assert found["bad"]["flagged"]
    assert 0 < found["good"]["under_lru_points"] < 10
    assert not found["good"]["flagged"]
    strict = _json("history", "canary", "--db", db, "--points", "2")["runs"]
    assert [r["flagged"] for r in strict] == [True, True, False]


def test_history_errors_are_one_line_and_lose_nothing(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    import duckdb

    db = tmp_path / "h.duckdb"
    kept = _run(tmp_path / "kept", make_run_dir, make_meta, run_id="kept")
    _cli("history", "add", str(kept), "--db", str(db))
    bare = tmp_path / "bare"
    (bare / "requests").mkdir(parents=True)
    fresh = _run(tmp_path / "fresh", make_run_dir, make_meta, run_id="fresh")
    # A run directory without run.json: nothing of this add is recorded.
    out = _cli("history", "add", str(fresh), str(bare), "--db", str(db), code=2)
    assert "no run.json" in out.output
    assert str(bare) in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert [r["run_id"] for r in _json("history", "show", "--db", str(db))["runs"]] == [
        "kept"
    ]
    # Locked by another process's writer.
    holder = subprocess.Popen(
        [*REPLAYER[:1], "-c",
         "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(60)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        out = _cli("history", "add", str(fresh), "--db", str(db), code=2)
        assert "locked by another process" in out.output
        assert len(out.output.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.communicate()
    assert len(_json("history", "show", "--db", str(db))["runs"]) == 1
    # A corrupt file, and a DuckDB file that is not a store.
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"not a database" * 500)
    out = _cli("history", "show", "--db", str(bad), code=2)
    assert "cannot open the results store" in out.output
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    out = _cli("history", "show", "--db", str(other), code=2)
    assert "not a results store" in out.output
    out = _cli("history", "show", "--db", str(tmp_path / "none.duckdb"), code=2)
    assert "no results store here" in out.output


def test_history_add_killed_midway_keeps_the_runs_it_had_added(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    dirs = [
        str(_run(tmp_path / f"r{k:02d}", make_run_dir, make_meta, run_id=f"r{k:02d}",
                 day=k, rows=_rows(k, 200)))
        for k in range(24)
    ]  # fmt: skip
    db = str(tmp_path / "h.duckdb")
    proc = subprocess.Popen(
        [*REPLAYER, "history", "add", *dirs, "--db", db],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    said = [proc.stdout.readline() for _ in range(3)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    added = {line.split()[1] for line in said if line.startswith("added")}
    assert len(added) == 3
    stored = {r["run_id"] for r in _json("history", "show", "--db", db)["runs"]}
    assert added <= stored  # every run it said it added is there, intact
    assert len(stored) < len(dirs)  # and it was killed midway
    for r in _json("history", "show", "--db", db)["runs"]:
        assert r["ttft_ms_p90"] > 0
    done = _json("history", "add", *dirs, "--db", db)["runs"]
    assert {r["status"] for r in done if r["run_id"] in stored} == {"already"}
    assert len(_json("history", "show", "--db", db)["runs"]) == 24


def test_report_history_draws_a_line_per_configuration_with_versions_marked(
    tmp_path: Path,
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    from analysis import history as h
    from analysis import report
    from tests.analysis.test_cli import _screenshot

    db = tmp_path / "h.duckdb"
    runs = []
    for hw in ("H100", "MI355X"):
        for k, version in enumerate(["0.9", "0.9", "0.10"]):
            runs.append(
                _run(tmp_path / f"{hw}{k}", make_run_dir, make_meta,
                     run_id=f"{hw}{k}", day=k, hardware=hw, engine_version=version)
            )  # fmt: skip
    _cli("history", "add", *map(str, runs), "--db", str(db))
    with h.Store(db, read_only=True) as store:
        stored = store.runs()
    trends = [h.trend(stored, metric, by="engine_version") for metric, _ in
              report.HISTORY_CHARTS]  # fmt: skip
    fig = report.history_figure(trends)
    assert len(fig.axes) == 4
    for ax in fig.axes:
        assert len(ax.get_lines()) == 2  # one line per configuration
        marks = sorted(t.get_text() for t in ax.texts)
        # Where the version changes, once for both lines (they change the same day).
        assert marks == ["0.10", "0.9"]
    out = tmp_path / "report.html"
    said = _cli("report", "--history", str(db), "-o", str(out)).output
    assert "h.duckdb's trends" in said
    page = out.read_text()
    assert "<h2>Results over time</h2>" in page
    assert "All points compare: trace trace-a" in page
    assert page.count("data:image/png;base64,") == 1
    assert 'src="http' not in page
    _screenshot(out, tmp_path)
    both = tmp_path / "both.html"
    _cli("report", str(runs[0]), "--history", str(db), "-o", str(both))
    text = both.read_text()
    assert text.index("<h2>Summary</h2>") < text.index("<h2>Results over time</h2>")
    _cli("report", "-o", str(both), code=2)  # neither runs nor a store


def test_history_of_replays_in_virtual_time_matches_analyze_and_estimates_lru(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    _cli("generate", "-o", str(trace), "--sessions", "2")
    db = str(tmp_path / "h.duckdb")
    for version, kv in (("0.9", "300000"), ("0.10", "300000"), ("0.10", "400000")):
        out = tmp_path / f"v{version}-{kv}"
        _cli(
            "run", str(trace), "--virtual", "sim", "--concurrency", "2", "--out",
            str(out), "--engine", "vllm", "--engine-version", version, "--gpus", "2",
            "--sim-args", f"--kv-capacity-tokens {kv}", "--quiet",
        )  # fmt: skip
        _cli("history", "add", str(out), "--db", db)
        got = _json("analyze", str(out), "--kv-capacity-tokens", kv)
        row = _json("history", "show", "--db", db)["runs"][-1]
        for (key, stat), column in _SAME.items():
            assert row[column] == got[key][stat], (version, column)
        # The LRU estimate at the engine model's KV, as analyze takes it.
        assert row["lru_hit"] == got["cache_hit_rate"]["lru"]
        assert row["lru_capacity_tokens"] == int(kv)
    # Another KV size is another configuration: its own line.
    found = _json("history", "trend", "server_hit", "--db", db)["configurations"]
    assert [[p["engine_version"] for p in s["points"]] for s in found] == [
        ["0.9", "0.10"],
        ["0.10"],
    ]
