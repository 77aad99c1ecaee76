"""`replayer analyze/compare/report` on run directories built in the test."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from replayer.cli import main
from replayer.records import RequestRecord, tpot_ns

MS = 1_000_000


def _random_run(
    seed: int, n: int, rec: Callable[..., RequestRecord], ttft_scale: float = 1.0
) -> tuple[list[RequestRecord], dict[str, np.ndarray]]:
    """n rows with numpy-drawn timings; returns the records and the raw arrays."""
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, 60_000, n)) * MS
    ttft = (rng.integers(20, 2000, n) * ttft_scale).astype(np.int64) * MS
    out = rng.integers(1, 60, n)
    gaps = [rng.integers(1, 80, max(o - 1, 0)) * MS for o in out]
    chunks = [
        t + np.concatenate([[0], np.cumsum(g)]) for t, g in zip(ttft, gaps, strict=True)
    ]
    e2e = np.array([c[-1] + 5 * MS for c in chunks])
    status = rng.choice(
        ["ok", "http_error", "timeout", "skipped"], n, p=[0.85, 0.05, 0.05, 0.05]
    )
    warm = np.arange(n) < n // 10
    prompt = rng.integers(1000, 100_000, n)
    ideal = (prompt * rng.uniform(0, 1, n)).astype(np.int64)
    cached = np.where(rng.uniform(size=n) < 0.7, (ideal * 0.8).astype(np.int64), -1)
    sched = start - rng.integers(0, 50, n) * MS
    records = [
        rec(
            session_id=f"s{i % 7}", request_index=i, scheduled_ns=int(sched[i]),
            start_ns=int(start[i]), first_token_ns=int(start[i] + ttft[i]),
            end_ns=int(start[i] + e2e[i]), ttft_ns=int(ttft[i]), e2e_ns=int(e2e[i]),
            tpot_ns=tpot_ns(int(e2e[i]), int(ttft[i]), int(out[i]))
            if status[i] == "ok" and out[i] >= 2 else None,
            chunk_times_ns=[int(c) for c in chunks[i]], output_tokens=int(out[i]),
            prompt_tokens=int(prompt[i]), ideal_cached_tokens=int(ideal[i]),
            cached_tokens=int(cached[i]) if cached[i] >= 0 else None,
            status=str(status[i]), warmup=bool(warm[i]),
        )
        for i in range(n)
    ]  # fmt: skip
    raw = dict(start=start, ttft=ttft, e2e=e2e, out=out, status=status, warm=warm,
               prompt=prompt, ideal=ideal, cached=cached, sched=sched)  # fmt: skip
    raw["chunks"] = np.array(chunks, dtype=object)
    return records, raw


def _invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def _stats(v: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": v.mean(), "p50": p50, "p90": p90, "p99": p99, "count": v.size}


def test_analyze_json_matches_numpy(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    records, r = _random_run(1, 300, rec)
    path = make_run_dir(tmp_path / "run", records, parts=3)
    got = json.loads(_invoke("analyze", str(path), "--json", "--gpus", "4").output)

    ok = (r["status"] == "ok") & ~r["warm"]
    assert got["requests"] == 300
    assert got["ok"] == int((r["status"] == "ok").sum())
    assert got["errors"]["timeout"] == int((r["status"] == "timeout").sum())
    assert got["warmup"] == int(r["warm"].sum())
    for key, v in (("ttft_ms", r["ttft"][ok] / MS), ("e2e_ms", r["e2e"][ok] / MS)):
        assert got[key] == pytest.approx(_stats(v))
    multi = ok & (r["out"] >= 2)
    # The engine's integer TPOT (replayer.records.tpot_ns).
    tpot = (r["e2e"] - r["ttft"])[multi] // (r["out"][multi] - 1) / MS
    assert got["tpot_ms"] == pytest.approx(_stats(tpot))
    itl = np.concatenate([np.diff(c) for c in r["chunks"][ok]]) / MS
    assert got["itl_ms"] == pytest.approx(_stats(itl))
    assert got["interactivity_tok_s"]["p90"] == pytest.approx(
        1000 / np.percentile(tpot, 90)
    )
    norm = (r["e2e"][ok] / 1e9) / r["out"][ok]
    assert got["e2e_norm_interactivity_tok_s"] == pytest.approx(
        1 / np.percentile(norm, 90)
    )
    window = ((r["start"] + r["e2e"])[ok].max() - r["start"][ok].min()) / 1e9
    tp = got["throughput_tok_s"]
    assert tp["input"] == pytest.approx(r["prompt"][ok].sum() / window)
    assert tp["output"] == pytest.approx(r["out"][ok].sum() / window)
    assert tp["per_gpu"]["total"] == pytest.approx(
        (r["prompt"][ok].sum() + r["out"][ok].sum()) / window / 4
    )
    rep = ok & (r["cached"] >= 0)
    assert got["cache_hit_rate"]["server"] == pytest.approx(
        r["cached"][rep].sum() / r["prompt"][rep].sum()
    )
    assert got["cache_hit_rate"]["ideal"] == pytest.approx(
        r["ideal"][ok].sum() / r["prompt"][ok].sum()
    )
    assert got["cache_hit_rate"]["prometheus"] is None  # nothing scraped: null
    lag = ((r["start"] - r["sched"])[~r["warm"] & (r["status"] != "skipped")]) / MS
    assert got["dispatch_lag_ms"]["p99"] == pytest.approx(np.percentile(lag, 99))


def test_analyze_table_and_several_runs(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    a = make_run_dir(tmp_path / "a", _random_run(1, 50, rec)[0])
    b = make_run_dir(tmp_path / "b", _random_run(2, 50, rec)[0])
    table = _invoke("analyze", str(a), str(b), "--slo", "ttft=1s").output
    assert re.search(r"^\s+a\s+b$", table.splitlines()[0])
    assert "TTFT p90 (ms)" in table
    assert "goodput (fraction)" in table
    got = json.loads(_invoke("analyze", str(a), str(b), "--json").output)
    assert [s["run"]["name"] for s in got["runs"]] == ["a", "b"]
    assert got["sweeps"] == []


def test_analyze_sweep_marks_pareto_front(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_sweep_dir: Callable[..., Path],
) -> None:
    levels = {f"c{c}": _random_run(c, 40, rec)[0] for c in (1, 2, 4)}
    sweep = make_sweep_dir(tmp_path / "sw", levels)
    got = json.loads(_invoke("analyze", str(sweep), "--json", "--gpus", "2").output)
    assert [s["run"]["name"] for s in got["runs"]] == ["c1", "c2", "c4"]
    rows = got["sweeps"][0]["levels"]
    assert [r["concurrency"] for r in rows] == [1, 2, 4]
    assert any(r["pareto"] for r in rows)
    assert all(r["per_gpu"] for r in rows)
    assert "Pareto" in _invoke("analyze", str(sweep)).output


def test_analyze_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert "not a run directory" in result.output
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--slo", "x=1"])
    assert result.exit_code == 2
    assert "bad SLO" in result.output


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_analyze_and_report_of_a_run_json_of_no_run_exit_2(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "run.json").write_text('{"hello":1}')
    out = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    result = CliRunner().invoke(main, [command, str(tmp_path), *out])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {tmp_path}: not a run directory (run.json names no run_id and no "
        "readable requests/part-*.parquet)\n"
    )
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("part", [None, b"PAR1 truncated"])
def test_analyze_of_a_run_without_readable_rows_says_so(
    tmp_path: Path, make_run_dir: Callable[..., Path], part: bytes | None
) -> None:
    """A run killed before its first part, or whose only part is unreadable: the
    figures of no rows (ITL too: no chunk times to read), the problem named, no
    traceback."""
    path = make_run_dir(tmp_path / "r", [], parts=1)
    for old in (path / "requests").iterdir():
        old.unlink()
    if part is not None:
        (path / "requests" / "part-0-00000.parquet").write_bytes(part)
    doc = json.loads(_invoke("analyze", str(path), "--json").output)
    assert doc["requests"] == 0
    assert doc["itl_ms"]["count"] == 0
    if part is not None:
        assert any("unreadable, skipped" in p for p in doc["run"]["problems"])
    assert "Traceback" not in _invoke("analyze", str(path)).output


def test_analyze_lru_needs_a_trace(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    path = make_run_dir(tmp_path / "r", [rec()])
    result = CliRunner().invoke(
        main, ["analyze", str(path), "--kv-capacity-tokens", "1000"]
    )
    assert result.exit_code == 2
    assert "names no trace path" in result.output


def test_compare_verdicts_and_determinism(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    a = make_run_dir(tmp_path / "a", _random_run(1, 300, rec)[0])
    b = make_run_dir(tmp_path / "b", _random_run(1, 300, rec, ttft_scale=0.3)[0])
    first = _invoke("compare", str(a), str(b), "--json").output
    assert first == _invoke("compare", str(a), str(b), "--json").output  # seeded
    figs = {(f["metric"], f["stat"]): f for f in json.loads(first)["figures"]}
    ttft = figs[("ttft_ms", "p90")]
    assert ttft["verdict"] == "better"
    assert ttft["ci_low"] <= ttft["delta"] <= ttft["ci_high"] < 0
    assert figs[("tpot_ms", "p50")]["verdict"] == "no clear difference"  # same decode
    same = json.loads(_invoke("compare", str(a), str(a), "--json").output)
    assert {f["verdict"] for f in same["figures"]} == {"no clear difference"}
    assert "B is" in _invoke("compare", str(a), str(b)).output


def _pngs(page: str) -> list[bytes]:
    return [
        base64.b64decode(m)
        for m in re.findall(r'<img[^>]*src="data:image/png;base64,([^"]+)"', page)
    ]


def test_report_is_self_contained_html(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
    make_sweep_dir: Callable[..., Path],
) -> None:
    scrapes: list[tuple[int, str, dict[str, str], float]] = [
        (t * 10**9, metric, {}, float(v))
        for t in range(6)
        for metric, v in (
            ("vllm:prefix_cache_hits_total", 50 * t),
            ("vllm:prefix_cache_queries_total", 100 * t),
            ("vllm:kv_cache_usage_perc", 0.1 * t),
        )
    ]
    run = make_run_dir(
        tmp_path / "run", _random_run(3, 80, rec)[0], server_metrics=scrapes
    )
    sweep = make_sweep_dir(
        tmp_path / "sw", {f"c{c}": _random_run(c, 30, rec)[0] for c in (1, 2)}
    )
    out = tmp_path / "report.html"
    _invoke("report", str(run), str(sweep), "-o", str(out))
    page = out.read_text()
    assert "<table>" in page
    assert "Pareto front" in page or "Sweep" in page
    assert 'src="http' not in page  # nothing external
    pngs = _pngs(page)
    # TTFT CDF, E2E CDF, Pareto, hit rates, 3 by-turn plots, 3 timelines.
    assert len(pngs) == 10
    assert page.count("<th>subagent depth</th>") == 3
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 1000 for p in pngs)
    _screenshot(out, tmp_path)


_WINDOW_PX = 1200


def _chromium(tmp_path: Path, *args: str) -> str:
    chromium = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if chromium is None:
        pytest.skip("chromium not installed (.ci/run installs it): no screenshot check")
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'prof'}",
         f"--window-size={_WINDOW_PX},2000", *args],
        check=True, capture_output=True, timeout=90, text=True,
    ).stdout  # fmt: skip


def _screenshot(page: Path, tmp_path: Path) -> Path:
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG")
    assert len(data) > 20_000
    return shot


def _page_width_px(page: Path, tmp_path: Path) -> int:
    """How wide the page lays out in the screenshot's window (Chromium's own
    layout: a copy of the page that writes its scroll width into the DOM)."""
    probe = tmp_path / "probe.html"
    probe.write_text(
        page.read_text().replace(
            "</body>",
            "<script>document.body.setAttribute('data-width', "
            "document.documentElement.scrollWidth)</script></body>",
        )
    )
    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    found = re.search(r'data-width="(\d+)"', dom)
    assert found, dom[:200]
    return int(found.group(1))


def test_report_of_a_14_cell_capacity_search_fits_the_page(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_sweep_dir: Callable[..., Path],
) -> None:
    from analysis.metrics import Slo
    from replayer.cli.capacity import format_capacity
    from replayer.records.capacity import CapacityCell, CapacityDoc, SearchSettings
    from replayer.studies.capacity import CapacitySearch, _result, _Search
    from tests.builders import capacity_cell

    levels = list(range(1, 15))
    folder = make_sweep_dir(
        tmp_path / "cap", {f"c{c}": _random_run(c, 30, rec)[0] for c in levels}
    )
    # TTFT fails from 9 on, TPOT never; 12 and up were client-limited.
    cells = [
        CapacityCell.from_dict(capacity_cell(
            f"c{c}", c, (40.0 * c, c < 9), (30.0, True),
            client_limited=c >= 12, client_reasons=["dispatch lag P99 80 ms > 50 ms"],
        ))
        for c in levels
    ]  # fmt: skip
    search = CapacitySearch(slo=Slo(ttft_ms=350.0, tpot_ms=100.0))
    bounds = _Search(search)
    for c in cells:
        bounds.record(c.level, c.passed, client_limited=c.client_limited)
    doc = CapacityDoc(
        search=SearchSettings(slo={"ttft_ms": 350.0, "tpot_ms": 100.0},
                              percentile=90, mode="concurrency"),
        cells=tuple(cells),
        result=_result(search, bounds, cells, "found", None),
    )  # fmt: skip
    (folder / "capacity.json").write_text(json.dumps(doc.as_dict()))
    assert "c12   12     CLIENT-LIMITED" in format_capacity(doc)
    out = tmp_path / "report.html"
    _invoke("report", str(folder), "-o", str(out))
    page = out.read_text()
    assert "CLIENT-LIMITED cells, not counted" in page
    assert "c12, c13, c14" in page
    assert _page_width_px(out, tmp_path) <= _WINDOW_PX  # the 15-column table scrolls
    _screenshot(out, tmp_path)


def test_import_analysis_does_not_load_aiohttp() -> None:
    code = (
        "import sys, analysis, analysis.report, analysis.compare; "
        "assert 'aiohttp' not in sys.modules, 'aiohttp loaded'; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib loaded eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_analyze_lru_estimate_reloads_the_trace(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    from tests.builders import request, session, trace_of
    from traces.io import write_trace

    reqs = [request([1, 2, 3], input_tokens=30, out=2) for _ in range(3)]
    trace_path = tmp_path / "trace.jsonl"
    write_trace(trace_of(session("s0", reqs, block_size=10)), trace_path)
    meta = make_meta(trace={"path": str(trace_path), "block_size": 10})
    rows = [rec(request_index=i, start_ns=i, prompt_tokens=30) for i in range(3)]
    path = make_run_dir(tmp_path / "r", rows, meta=meta)
    got = json.loads(
        _invoke("analyze", str(path), "--json", "--kv-capacity-tokens", "100").output
    )
    # Cold, then two full hits: 60 / 90.
    assert got["cache_hit_rate"]["lru"] == pytest.approx(60 / 90)
    tiny = json.loads(
        _invoke("analyze", str(path), "--json", "--kv-capacity-tokens", "0").output
    )
    assert tiny["cache_hit_rate"]["lru"] == pytest.approx(0.0)
