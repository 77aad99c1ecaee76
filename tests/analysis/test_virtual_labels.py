"""A virtual capacity answer is labelled virtual wherever it is shown (analyze's
text and --json, the report), and a live --confirm that refuted it is the headline,
not a footnote under "max concurrency within the SLO: N"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from replayer.cli import main

CAPACITY = Path(__file__).resolve().parents[1] / "data/golden/inputs/capacity"


def _cell(name: str, passed: bool, ttft_ms: float, hit: float) -> dict[str, Any]:
    return {
        "name": name,
        "pass": passed,
        "ok": 40,
        "checks": [
            {
                "slo": "ttft",
                "metric": "queued_ttft_ms",
                "target_ms": 2000.0,
                "value_ms": ttft_ms,
                "ci_ms": [ttft_ms * 0.9, ttft_ms * 1.1],
                "pass": passed,
                "borderline": False,
            }
        ],
        "hit": hit,
    }


def _refuted(tmp_path: Path) -> Path:
    """The golden virtual search (answer 1), its answer failed live."""
    cap = tmp_path / "cap"
    shutil.copytree(CAPACITY, cap)
    doc = json.loads((cap / "capacity.json").read_text())
    doc["confirm"] = {
        "endpoint": None,
        "cell_duration_s": 20.0,
        "levels": [
            {
                "level": 1,
                "predicted": _cell("c1", True, 214.5, 0.617),
                "measured": {
                    **_cell("confirm-c1", False, 3970.0, 0.09),
                    "client_limited": False,
                },
            }
        ],
        "agrees": False,
    }
    (cap / "capacity.json").write_text(json.dumps(doc))
    return cap


def _invoke(*args: str) -> str:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out.output


def test_analyze_says_the_answer_is_virtual_and_refuted(tmp_path: Path) -> None:
    cap = _refuted(tmp_path)
    text = _invoke("analyze", str(cap))
    head = (
        "predicted 1, refuted live at 1 (FAIL: queued_ttft p90 3.97 s > 2.00 s; "
        "hit 9.0% live against 61.7% predicted)"
    )
    assert head in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("predicted 1"))
    assert lines[at + 1].startswith("max concurrency within the SLO")
    assert lines[at + 1].endswith("[virtual: predicted, not measured]")
    assert "c1: virtual time on sim: every figure is predicted" in text
    doc = json.loads(_invoke("analyze", str(cap), "--json"))
    (sweep,) = doc["sweeps"]
    assert sweep["capacity"]["source"] == "virtual"
    assert sweep["capacity_headline"].startswith(head)
    assert sweep["confirm"]["agrees"] is False
    assert doc["runs"][0]["run"]["virtual"] == "sim"
    assert "differs from the prediction at level 1:" in text


def test_report_says_the_answer_is_virtual_and_refuted(tmp_path: Path) -> None:
    cap = _refuted(tmp_path)
    html = tmp_path / "r.html"
    _invoke("report", str(cap), "-o", str(html))
    page = html.read_text()
    assert "predicted 1, refuted live at 1" in page
    assert "virtual: predicted, found" in page
    assert "in virtual time on sim (predicted, not measured)" in page
    assert "at None" not in page


def test_a_virtual_answer_without_confirm_says_it_was_not_measured(
    tmp_path: Path,
) -> None:
    cap = tmp_path / "cap"
    shutil.copytree(CAPACITY, cap)
    text = _invoke("analyze", str(cap))
    assert "predicted 1 in virtual time on sim: not measured" in text
