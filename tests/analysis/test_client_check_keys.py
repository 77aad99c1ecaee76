"""analyze --json keeps the self-check's wait maxima that earlier releases printed:
``client_check.{pool_wait,slot_wait,connect}_ms.max``, from the rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner

from replayer.cli import main

LIVE = Path(__file__).resolve().parents[1] / "data/golden/inputs/live"


def _analyze(path: Path) -> dict[str, object]:
    out = CliRunner().invoke(main, ["analyze", str(path), "--json"])
    assert out.exit_code == 0, out.output
    check = json.loads(out.output)["client_check"]
    assert isinstance(check, dict)
    return check


def test_wait_maxima_come_from_the_rows() -> None:
    rows = pq.read_table(LIVE / "requests").to_pandas()
    check = _analyze(LIVE)
    for figure, column in (
        ("pool_wait_ms", "pool_wait_ns"),
        ("slot_wait_ms", "slot_wait_ns"),
        ("connect_ms", "connect_ns"),
    ):
        got = check[figure]
        assert isinstance(got, dict)
        assert got["max"] == rows[column].max() / 1e6, figure
        # The keys the summary had before stay beside it.
        assert {"mean", "p50", "p90", "p99", "count"} <= set(got)
    assert check["connect_ms"]["max"] > 0  # type: ignore[index]


def test_a_run_without_the_wait_columns_keeps_the_recorded_maxima(
    tmp_path: Path,
) -> None:
    run = tmp_path / "old"
    shutil.copytree(LIVE, run)
    for part in (run / "requests").glob("*.parquet"):
        table = pq.read_table(part)
        keep = [
            c for c in table.column_names if c not in ("slot_wait_ns", "connect_ns")
        ]
        pq.write_table(table.select(keep), part)
    recorded = json.loads((run / "run.json").read_text())["client_check"]
    check = _analyze(run)
    assert check["slot_wait_ms"]["max"] == recorded["slot_wait_ms"]["max"]  # type: ignore[index]
    assert check["connect_ms"]["max"] == recorded["connect_ms"]["max"]  # type: ignore[index]
