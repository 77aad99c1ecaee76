"""ParquetRecorder: part files, metadata, and no silent loss when the disk refuses."""

from __future__ import annotations

import asyncio
import errno
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from replayer.errors import RecorderError
from replayer.play import recorder as recorder_mod
from replayer.play.recorder import ParquetRecorder
from replayer.records import (
    RECORD_FIELDS,
    RECORD_SCHEMA,
    RUN_METADATA_KEY,
    RequestRecord,
    RunMeta,
)
from tests.builders import make_record


def _rec(i: int) -> RequestRecord:
    return make_record(run_id="r1", session_id="s", request_index=i, scheduled_ns=i)


def test_record_schema_matches_dataclass() -> None:
    assert RECORD_SCHEMA.names == list(RECORD_FIELDS)


async def test_recorder_writes_parts_with_metadata(tmp_path: Path) -> None:
    async with ParquetRecorder(
        tmp_path, flush_rows=3, metadata=RunMeta(run_id="r1")
    ) as rec:
        for i in range(7):
            rec.put(_rec(i))
    parts = sorted((tmp_path / "requests").glob("part-*.parquet"))
    assert parts
    df = pd.read_parquet(tmp_path / "requests")
    assert sorted(df["request_index"]) == list(range(7))
    raw = pq.read_schema(parts[0]).metadata[RUN_METADATA_KEY]
    assert RunMeta.from_dict(json.loads(raw)) == RunMeta(run_id="r1")
    assert df["cached_tokens"].isna().all()  # not reported is null, never 0


async def test_recorder_full_disk_rescues_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = recorder_mod.pq.write_table
    run_dir = tmp_path / "run"
    rescue_dir = tmp_path / "tmp"
    rescue_dir.mkdir()
    monkeypatch.setattr(recorder_mod.tempfile, "gettempdir", lambda: str(rescue_dir))

    def full_disk(table: Any, where: Any, **kw: Any) -> None:
        if str(where).startswith(str(run_dir)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(table, where, **kw)

    monkeypatch.setattr(recorder_mod.pq, "write_table", full_disk)

    async def record() -> None:
        async with ParquetRecorder(run_dir, flush_interval_s=0.01) as rec:
            for i in range(5):
                rec.put(_rec(i))

    with pytest.raises(RecorderError, match="No space left on device") as info:
        await record()
    assert "saved to" in str(info.value)
    (rescued,) = rescue_dir.glob("replayer-rescue-r1-*.parquet")
    assert sorted(pd.read_parquet(rescued)["request_index"]) == list(range(5))


async def test_recorder_final_flush_survives_a_failed_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A periodic flush that fails with a bug (not a full disk) must not cost the
    # rows: the final flush writes every row, then the error surfaces.
    real = recorder_mod.records_to_table
    calls = 0

    def fails_once(rows: list[RequestRecord]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("writer bug")
        return real(rows)

    monkeypatch.setattr(recorder_mod, "records_to_table", fails_once)

    async def record() -> None:
        async with ParquetRecorder(tmp_path, flush_interval_s=0.001) as rec:
            for i in range(3):
                rec.put(_rec(i))
            while calls == 0:  # noqa: ASYNC110 - the flush runs in a thread
                await asyncio.sleep(0.001)
            for i in range(3, 6):
                rec.put(_rec(i))

    with pytest.raises(RuntimeError, match="writer bug"):
        await record()
    df = pd.read_parquet(tmp_path / "requests")
    assert sorted(df["request_index"]) == list(range(6))


async def test_recorder_rows_put_during_flushes_land_once_with_even_columns(
    tmp_path: Path,
) -> None:
    # Thread switches every microsecond: a flush thread that shares the pending
    # list with put() loses rows or writes ragged columns here.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        async with ParquetRecorder(
            tmp_path, flush_interval_s=0.0005, flush_rows=50
        ) as rec:
            for i in range(20_000):
                rec.put(_rec(i))
                if i % 25 == 0:
                    await asyncio.sleep(0)
    finally:
        sys.setswitchinterval(old)
    df = pd.read_parquet(tmp_path / "requests")
    assert len(df) == 20_000
    assert sorted(df["request_index"]) == list(range(20_000))
