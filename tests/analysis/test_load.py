"""Loading run directories, crashed ones included, and sweep folders."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import AnalysisError
from analysis.load import load_run, load_sweep
from replayer.records import RECORD_SCHEMA, ModeInfo, RequestRecord, RunMeta


def test_load_run_reads_all_parts_with_schema_dtypes(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = [rec(request_index=i, cached_tokens=None if i % 2 else 5) for i in range(5)]
    run = load_run(make_run_dir(tmp_path / "r", rows, parts=3))
    df = run.requests.sort_values("request_index")  # part files: any row order
    assert list(df.columns) == RECORD_SCHEMA.names
    assert len(df) == 5
    assert str(df["start_ns"].dtype) == "Int64"
    assert df["cached_tokens"].isna().tolist() == [False, True, False, True, False]
    assert str(df["status"].dtype) == "category"
    assert run.meta.run_id == "run-test"
    assert run.meta.complete
    assert run.server_metrics.empty
    assert run.problems == ("no server metrics recorded",)  # the builder writes none


def test_load_run_column_subset(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    run = load_run(make_run_dir(tmp_path / "r", [rec()]), columns=["status"])
    assert list(run.requests.columns) == ["status"]
    with pytest.raises(AnalysisError, match="unknown request column"):
        load_run(tmp_path / "r", columns=["nope"])


def test_load_run_missing_or_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="no such run directory"):
        load_run(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="not a run directory"):
        load_run(tmp_path / "empty")


def test_load_run_tolerates_a_crashed_run(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    """kill -9: no run.json, a truncated last part file, no end time."""
    meta = {"run_id": "crashed", "end_unix_ns": None, "measure_start_ns": 0}
    path = make_run_dir(
        tmp_path / "r",
        [rec(request_index=i) for i in range(4)],
        meta=meta,
        parts=2,
        write_run_json=False,
    )
    (path / "requests" / "part-9-99999.parquet").write_bytes(b"PAR1 truncated")
    run = load_run(path)
    assert len(run.requests) == 4
    assert run.meta.run_id == "crashed"  # from the part files' metadata
    assert not run.meta.complete
    assert any("part-9-99999.parquet: unreadable" in p for p in run.problems)


def test_load_run_corrupt_run_json_falls_back(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    path = make_run_dir(tmp_path / "r", [rec()])
    (path / "run.json").write_text("{not json")
    run = load_run(path)
    assert run.meta.run_id == "run-test"
    assert any("run.json" in p for p in run.problems)


def test_load_run_json_of_no_run_is_not_a_run(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    (tmp_path / "hello").mkdir()
    (tmp_path / "hello" / "run.json").write_text('{"hello": 1}')
    with pytest.raises(AnalysisError, match=r"run\.json names no run_id"):
        load_run(tmp_path / "hello")
    # Beside rows, the part files' copy is used: nothing recorded is lost.
    path = make_run_dir(tmp_path / "r", [rec()])
    (path / "run.json").write_text('{"hello": 1}')
    run = load_run(path)
    assert (run.meta.run_id, len(run.requests)) == ("run-test", 1)
    assert "run.json names no run_id; using the part files' copy" in run.problems


def test_load_run_meta_round_trips_run_json(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
    make_meta: Callable[..., dict[str, Any]],
) -> None:
    written = make_meta(
        labels={"engine": "vllm", "gpus": 8},
        counts={"requests": 1, "ok": 1},
        future_key={"kept": True},  # a newer writer's key: kept in extra
    )
    run = load_run(make_run_dir(tmp_path / "r", [rec()], meta=written))
    assert isinstance(run.meta, RunMeta)
    assert run.meta == RunMeta.from_dict(written)
    assert run.meta.mode == ModeInfo(kind="concurrency", concurrency=1)
    assert run.meta.labels["gpus"] == 8
    assert run.meta.trace.block_size == 64
    assert run.meta.extra == {"future_key": {"kept": True}}
    # as_dict() gives back every key written (the counts gain their defaults).
    back = run.meta.as_dict()
    assert set(back) >= set(written)
    assert back["trace"].items() >= written["trace"].items()  # + newer fields
    assert {k: back[k] for k in written if k not in ("counts", "trace")} == {
        k: v for k, v in written.items() if k not in ("counts", "trace")
    }


def test_load_run_without_any_metadata_is_an_empty_run_meta(
    tmp_path: Path, rec: Callable[..., RequestRecord]
) -> None:
    import pyarrow.parquet as pq

    from replayer.records import records_to_table

    (tmp_path / "r" / "requests").mkdir(parents=True)
    pq.write_table(
        records_to_table([rec()]), tmp_path / "r" / "requests" / "part-0-00000.parquet"
    )
    run = load_run(tmp_path / "r")
    assert run.meta == RunMeta()
    assert not run.meta.complete
    assert "no run.json: metadata unavailable" in run.problems


def test_load_run_zero_rows(tmp_path: Path, make_run_dir: Callable[..., Path]) -> None:
    run = load_run(make_run_dir(tmp_path / "r", [], parts=2))
    assert run.requests.empty
    assert list(run.requests.columns) == RECORD_SCHEMA.names


def test_load_sweep(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_sweep_dir: Callable[..., Path],
) -> None:
    sweep = make_sweep_dir(tmp_path / "sw", {"c1": [rec()], "c2": [rec(), rec()]})
    loaded = load_sweep(sweep)
    assert loaded.levels == ("c1", "c2")
    assert [len(r.requests) for r in loaded.runs] == [1, 2]
    assert loaded.runs[1].meta.mode.concurrency == 2
    (sweep / "sweep.json").write_text(json.dumps({"levels": "c1"}))
    with pytest.raises(AnalysisError, match=r"sweep\.json"):
        load_sweep(sweep)
