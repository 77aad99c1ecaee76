"""ParquetRecorder: part files, metadata, and no silent loss when the disk refuses."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from replayer import recorder as recorder_mod
from replayer.errors import RecorderError
from replayer.recorder import ParquetRecorder
from replayer.records import RECORD_FIELDS, RECORD_SCHEMA, RequestRecord


def _rec(i: int) -> RequestRecord:
    return RequestRecord(
        run_id="r1",
        session_id="s",
        root_session_id="s",
        request_index=i,
        scheduled_ns=i,
        trace_input_tokens=10,
        prompt_tokens=10,
        trace_output_tokens=2,
        requested_output_tokens=2,
        ideal_cached_tokens=0,
    )


def test_record_schema_matches_dataclass() -> None:
    assert RECORD_SCHEMA.names == list(RECORD_FIELDS)


async def test_recorder_writes_parts_with_metadata(tmp_path: Path) -> None:
    async with ParquetRecorder(
        tmp_path, flush_rows=3, metadata={"run_id": "r1"}
    ) as rec:
        for i in range(7):
            rec.put(_rec(i))
    parts = sorted((tmp_path / "requests").glob("part-*.parquet"))
    assert parts
    df = pd.read_parquet(tmp_path / "requests")
    assert sorted(df["request_index"]) == list(range(7))
    assert pq.read_schema(parts[0]).metadata[b"replayer.run"] == b'{"run_id": "r1"}'
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
