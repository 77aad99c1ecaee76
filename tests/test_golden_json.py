"""The JSON contracts hold byte for byte: `analyze` (--json and the table) over fixed
run directories, `capacity --json`, `trace cache-curve --json` and run.json of
virtual runs give what tests/data/golden/make.py captured; run.json files read and
written back, and capacity.json, are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayer.records import CapacityDoc, RunMeta
from replayer.records.rundir import strict_json
from tests.data.golden.make import INPUTS, OUTPUTS, outputs


def test_json_outputs_match_golden(tmp_path: Path) -> None:
    got = outputs(tmp_path)
    want = {p.name: p.read_text() for p in OUTPUTS.iterdir()}
    assert sorted(got) == sorted(want)
    differ = [name for name in sorted(got) if got[name] != want[name]]
    assert not differ, f"differ from the golden files: {differ}"


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(INPUTS) for p in INPUTS.rglob("run*.json")),
    ids=str,
)
def test_run_json_reads_and_writes_back_unchanged(path: Path) -> None:
    text = (INPUTS / path).read_text()
    meta = RunMeta.from_dict(json.loads(text))
    again = json.dumps(strict_json(meta.as_dict()), indent=2, default=str) + "\n"
    assert again == text


def test_capacity_json_reads_and_writes_back_unchanged() -> None:
    text = (INPUTS / "capacity" / "capacity.json").read_text()
    doc = CapacityDoc.from_dict(json.loads(text))
    assert doc.result is not None
    assert len(doc.cells) == doc.result.cells == 3
    again = json.dumps(strict_json(doc.as_dict()), indent=2, default=str) + "\n"
    assert again == text
