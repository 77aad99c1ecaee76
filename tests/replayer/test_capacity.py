"""The capacity search: its level sequence (pure), and the real CLI against the
built-in simulator (a KV knee, an impossible SLO, a cell budget, the report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis import metrics as m
from analysis.load import load_run
from analysis.steady import slo_verdict
from replayer.errors import ConfigError
from replayer.records.capacity import CapacityCell, CapacityDoc, SearchSettings
from replayer.studies.capacity import CapacitySearch, _Search
from tests.builders import capacity_cell, request, session, trace_of
from traces.io import write_trace

REPLAYER = [sys.executable, "-m", "replayer"]
# A search waits up to 300 s for `capacity`, the knee test also for analyze and the
# report: over pytest's default 120 s.
pytestmark = pytest.mark.timeout(660)


def _levels(search: CapacitySearch, holds: float) -> tuple[list[float], _Search]:
    """The levels the search runs against a server that holds ``holds``."""
    bounds = _Search(search)
    seen = []
    level = bounds.next_level()
    while level is not None:
        seen.append(level)
        bounds.record(level, level <= holds)
        level = bounds.next_level()
        assert len(seen) < 50
    return seen, bounds


def test_search_ramps_then_bisects_concurrency() -> None:
    seen, b = _levels(CapacitySearch(slo=m.Slo(ttft_ms=1)), holds=5)
    assert seen == [1, 2, 4, 8, 6, 5]  # 8 fails; bisect (4, 8) → 6 fails → 5 passes
    assert (b.passed, b.failed, b.status) == (5, 6, "found")
    seen, b = _levels(CapacitySearch(slo=m.Slo(ttft_ms=1), start=8), holds=2)
    assert seen == [8, 4, 2, 3]  # a failing first level is bisected down from 0
    assert (b.passed, b.failed) == (2, 3)
    seen, b = _levels(CapacitySearch(slo=m.Slo(ttft_ms=1)), holds=0)
    assert seen == [1]
    assert (b.passed, b.failed, b.status) == (0, 1, "found")
    seen, b = _levels(CapacitySearch(slo=m.Slo(ttft_ms=1), max_level=6), holds=100)
    assert seen == [1, 2, 4, 6]
    assert b.status == "ceiling"
    seen, _ = _levels(CapacitySearch(slo=m.Slo(ttft_ms=1), growth=1.5), holds=3)
    assert seen == [1, 2, 3, 5, 4]  # ceil(1.5) = 2, ceil(3) = 3, ceil(4.5) = 5


def test_search_bisects_rates_geometrically_to_the_resolution() -> None:
    seen, b = _levels(
        CapacitySearch(slo=m.Slo(ttft_ms=1), rate=True, start=1.0), holds=3.3
    )
    # 1, 2 pass; 4 fails; √8 = 2.83 passes; √(2.83·4) = 3.36 fails;
    # √(2.83·3.36) = 3.08 passes; 3.36 / 3.08 = 1.09 ≤ 1.1: done.
    assert seen[:3] == [1.0, 2.0, 4.0]
    assert seen[3:] == pytest.approx([8**0.5, (8**0.5 * 4) ** 0.5, 3.0844], rel=1e-3)
    assert b.passed == pytest.approx(3.0844, rel=1e-3)
    assert b.status == "found"


def test_search_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="percentile"):
        CapacitySearch(slo=m.Slo(ttft_ms=1), percentile=100)
    with pytest.raises(ConfigError, match="growth"):
        CapacitySearch(slo=m.Slo(ttft_ms=1), growth=1.0)
    with pytest.raises(ConfigError, match="below the first"):
        CapacitySearch(slo=m.Slo(ttft_ms=1), start=8, max_level=4)


def _knee_trace(path: Path) -> Path:
    """16 sessions of 24 turns, each turn one 64-token block longer than the last
    (30..53 blocks, ~1.9K-3.4K tokens); no think time. A turn that hits its prefix
    prefills 67 tokens; one that misses, thousands."""
    sessions = [
        session(
            f"s{k}",
            [
                request(blocks=30 + i, block_size=64, extra_tokens=3, out=4)
                for i in range(24)
            ],
            block_size=64,
        )
        for k in range(16)
    ]
    return write_trace(trace_of(*sessions), path)


def _capacity(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REPLAYER, "capacity", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# A KV cache of 10,000 tokens holds about three of these sessions' prefixes: at four
# lanes LRU evicts each one before its next turn, and every turn prefills it all.
_SMALL_KV = "--kv-capacity-tokens 10000 --max-model-len 3600"


def _cell(doc: dict[str, Any], level: float) -> dict[str, Any]:
    """The cell that decided ``level`` (the last run there)."""
    cells: list[dict[str, Any]] = doc["cells"]
    return [c for c in cells if c["level"] == level][-1]


def test_capacity_finds_the_kv_knee_of_the_sim(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = _capacity(
        str(_knee_trace(tmp_path / "t.jsonl")),
        "--slo", "ttft=60ms", "--out", str(out), "--duration", "3",
        "--sim-args", _SMALL_KV, "--max-level", "16", "--gpus", "2", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "capacity.json").read_text())
    result = doc["result"]
    assert result["status"] == "found"
    best = result["max_concurrency"]
    assert 1 <= best < 16
    assert result["next_level"] == best + 1
    assert result["per_gpu"] == best / 2
    assert _cell(doc, best)["pass"]
    assert not _cell(doc, best + 1)["pass"]
    assert result["failed_because"]
    assert "queued_ttft p90" in result["failed_because"][0]
    # Judged again from the run directories alone: the max passes, the next fails.
    for level, ok in ((best, True), (best + 1, False)):
        run = load_run(out / _cell(doc, level)["name"])
        verdict = slo_verdict(m.numeric_view(run.requests), m.Slo(ttft_ms=60))
        assert verdict.passed is ok
        assert run.meta.steady_state is not None  # the window is in run.json

    # The knee is the KV cache's: past three lanes the server's prefix hit collapses.
    def hit(level: int) -> float:
        return m.server_hit_rate(m.numeric_view(load_run(out / f"c{level}").requests))

    assert hit(4) < min(hit(1), hit(2)) - 0.05
    # Every cell had a salt of its own: no cell was served from another's cache.
    salts = {
        json.loads((out / c["name"] / "run.json").read_text())["salt"]
        for c in doc["cells"]
    }
    assert len(salts) == len(doc["cells"])
    # The folder reads as a sweep, and the report draws the search.
    sweep = json.loads((out / "sweep.json").read_text())["levels"]
    assert sorted(sweep) == sorted(c["name"] for c in doc["cells"])
    a = subprocess.run(
        [*REPLAYER, "analyze", str(out), "--json"], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert a.returncode == 0, a.stderr
    (entry,) = json.loads(a.stdout)["sweeps"]
    assert entry["capacity"] == result
    assert len(entry["levels"]) == len(doc["cells"])
    rep = subprocess.run(
        [*REPLAYER, "report", str(out), "-o", str(tmp_path / "r.html")],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    assert "Capacity under the SLO" in (tmp_path / "r.html").read_text()


def test_capacity_impossible_slo_reports_zero_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = _capacity(
        str(_knee_trace(tmp_path / "t.jsonl")),
        "--slo", "ttft=1us", "--out", str(out), "--duration", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "max concurrency within the SLO (p90 ttft ≤ 0.0 ms): 0" in r.stdout
    assert "1 fails: queued_ttft p90" in r.stdout
    doc = json.loads((out / "capacity.json").read_text())
    assert [c["name"] for c in doc["cells"]] == ["c1"]
    assert doc["result"]["max_concurrency"] == 0
    assert doc["result"]["status"] == "found"


def test_capacity_max_cells_stops_with_the_best_bound(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = _capacity(
        str(_knee_trace(tmp_path / "t.jsonl")),
        "--slo", "ttft=100s", "--out", str(out), "--duration", "1",
        "--max-cells", "2", "--no-widen", "--reset-cache", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [c["name"] for c in doc["cells"]] == ["c1", "c2"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["c1", "c2"]
    result = doc["result"]
    assert result["status"] == "budget"
    assert "--max-cells 2" in result["stopped_because"]
    assert result["max_concurrency"] == 2
    assert result["next_level"] is None
    # The simulator answered the reset between the two cells.
    assert doc["reset_cache"]["resets"] == 1
    assert doc["reset_cache"]["failed"] == 0


def test_capacity_bad_input_is_one_line(tmp_path: Path) -> None:
    trace = str(_knee_trace(tmp_path / "t.jsonl"))
    r = _capacity(trace, "--slo", "ttft=fast", "--out", str(tmp_path / "c"))
    assert r.returncode == 2
    assert "bad SLO duration" in r.stderr
    assert "Traceback" not in r.stderr
    r = _capacity(
        trace, "--slo", "ttft=1s", "--out", str(tmp_path / "c"), "--timestamps"
    )
    assert r.returncode == 2
    assert "--timestamps" in r.stderr
    r = _capacity(
        trace, "--slo", "ttft=1s", "--out", str(tmp_path / "c"),
        "--endpoint", "http://127.0.0.1:9", "--model", "m", "--duration", "1",
    )  # fmt: skip
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_capacity_searches_the_session_rate_and_honours_max_time(
    tmp_path: Path,
) -> None:
    out = tmp_path / "cap"
    r = _capacity(
        str(_knee_trace(tmp_path / "t.jsonl")),
        "--slo", "ttft=100s", "--out", str(out), "--duration", "1",
        "--session-rate", "2", "--max-time", "1.5", "--no-widen", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # The first cell (1 s) fits in 1.5 s; the second would end after it.
    assert [c["name"] for c in doc["cells"]] == ["r2"]
    assert doc["search"]["mode"] == "session_rate"
    result = doc["result"]
    assert result["status"] == "budget"
    assert "--max-time 1.5" in result["stopped_because"]
    assert result["max_session_rate"] == 2.0
    meta = json.loads((out / "r2" / "run.json").read_text())
    assert meta["mode"]["kind"] == "session_rate"
    assert meta["mode"]["session_rate"] == 2.0


def test_search_takes_a_client_limited_level_as_a_bound_not_a_failure() -> None:
    # The server holds 10; the client cannot drive 6 or more.
    bounds = _Search(CapacitySearch(slo=m.Slo(ttft_ms=1)))
    seen = []
    level = bounds.next_level()
    while level is not None:
        seen.append(level)
        bounds.record(level, level <= 10, client_limited=level >= 6)
        level = bounds.next_level()
    assert seen == [1, 2, 4, 8, 6, 5]
    assert (bounds.passed, bounds.failed, bounds.client) == (5, None, 6)
    assert bounds.status == "found"
    assert bounds.client_bound


def _fake_cell(name: str, level: float, ok: bool, borderline: bool) -> CapacityCell:
    return CapacityCell.from_dict(
        capacity_cell(
            name,
            int(level),
            (99.0 if ok else 100.2, ok),
            (20.0, True),
            borderline=borderline,
            duration_s=2.0 if name.endswith("-wide") else 1.0,
            client_limited=False,
            reasons=[] if ok else ["queued_ttft p90 100.2 ms > 100 ms"],
        )
    )


def test_capacity_answer_is_a_range_when_cells_disagree_within_their_cis() -> None:
    from replayer.cli.capacity import format_capacity
    from replayer.studies.capacity import _result

    search = CapacitySearch(slo=m.Slo(ttft_ms=100), start=32)
    runs = [  # (name, level, pass, borderline), in the order they ran
        ("c32", 32, True, False), ("c64", 64, False, False),
        ("c48", 48, False, True), ("c48-wide", 48, False, True),
        ("c40", 40, True, False), ("c44", 44, True, False),
        ("c46", 46, False, False),
        ("c45", 45, False, True), ("c45-wide", 45, True, True),
    ]  # fmt: skip
    bounds = _Search(search)
    cells = []
    for name, level, ok, borderline in runs:
        cells.append(_fake_cell(name, level, ok, borderline))
        if not borderline or name.endswith("-wide"):
            bounds.record(level, ok)
    result = _result(search, bounds, cells, bounds.status, None)
    assert result.as_dict()["max_concurrency"] == 45
    # 44 and below passed clearly; 45 failed once and passed widened, within its
    # CI; 46 failed clearly. 48 failed only within its CI, but above 46.
    assert result.answer_range == (44, 45)
    assert result.thin is True
    assert result.thin_because == (
        "c45 failed within its CI",
        "c45-wide passed within its CI",
    )
    # Without the clear failure at 46, 48's failures within their CIs leave 48 open.
    cells = [c for c in cells if c.name != "c46"]
    result = _result(search, bounds, cells, bounds.status, None)
    assert result.answer_range == (44, 48)
    search_doc = {"slo": {"ttft_ms": 100}, "percentile": 90, "mode": "concurrency"}
    text = format_capacity(
        CapacityDoc(
            search=SearchSettings.from_dict(search_doc),
            cells=tuple(cells),
            result=result,
        )
    )
    assert "thin evidence: the cells support anything from 44 to 48, not 45" in text
    # Clear verdicts on both sides: one number.
    clear = [_fake_cell("c4", 4, True, False), _fake_cell("c5", 5, False, False)]
    b = _Search(search)
    b.record(4, True)
    b.record(5, False)
    result = _result(search, b, clear, "found", None)
    assert result.answer_range == (4, 4)
    assert result.thin is False
    assert result.lower_bound_by_client is False


def test_capacity_never_counts_a_client_limited_cell(tmp_path: Path) -> None:
    # --max-inflight 1 under 16 lanes: each request waits for the other fifteen in
    # the client, so the self-check flags the cell (requests sent late), whatever
    # the SLO says.
    out = tmp_path / "cap"
    sim = "--decode-base-ms 1 --prefill-us-per-token 1"
    r = _capacity(
        str(_knee_trace(tmp_path / "t.jsonl")),
        "--slo", "ttft=100s", "--out", str(out), "--duration", "5",
        "--start", "16", "--max-level", "16", "--max-cells", "1",
        "--max-inflight", "1", "--sim-args", sim,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "capacity.json").read_text())
    (cell,) = doc["cells"]
    assert cell["client_limited"] is True
    assert cell["client_reasons"]
    assert cell["slo_pass"] is True  # the SLO held, but it is no evidence
    assert cell["pass"] is False
    result = doc["result"]
    assert result["max_concurrency"] == 0
    assert result["client_limited_cells"] == ["c16"]
    assert result["lower_bound_by_client"] is True
    assert result["client_limit"]["name"] == "c16"
    assert "c16: CLIENT-LIMITED" in r.stderr
    assert r.stdout.splitlines()[1].split()[:3] == ["c16", "16", "CLIENT-LIMITED"]
    (line,) = [s for s in r.stdout.splitlines() if "lower bound set by the client" in s]
    assert "add --workers or --ray" in line
