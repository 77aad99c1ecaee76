"""Request part files: which hold a run's rows, and the end-of-run compaction that
joins a worker's small parts (rows, order and values unchanged; nothing lost when it
cannot finish)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.load import SMALL_PARTS_HINT, load_run
from replayer.play.recorder import ParquetRecorder
from replayer.records import RUN_METADATA_KEY, RunMeta, records_to_table
from replayer.records import parts as parts_mod
from replayer.records.parts import (
    compact_parts,
    compact_run,
    part_name,
    read_request_parts,
    request_parts,
    write_part,
)
from tests.builders import make_record

META = json.dumps(RunMeta(run_id="r1").as_dict()).encode()
_NAME_SMALL = re.compile(r"part-000-\d{5}\.parquet")


def _table(first: int, n: int) -> pa.Table:
    rows = [
        make_record(
            run_id="r1",
            session_id=f"s{i // 3}",
            request_index=i,
            scheduled_ns=i,
            chunk_times_ns=[i, i + 5, i + 5] if i % 4 else None,
            cached_tokens=None if i % 5 else i,
        )
        for i in range(first, first + n)
    ]
    return records_to_table(rows).replace_schema_metadata({RUN_METADATA_KEY: META})


def _write(folder: Path, sizes: list[int], worker: int = 0) -> pa.Table:
    """Parts of ``sizes`` rows; the table of all their rows, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    tables, at = [], 0
    for seq, n in enumerate(sizes):
        tables.append(_table(at, n))
        write_part(tables[-1], folder / part_name(worker, seq))
        at += n
    return pa.concat_tables(tables)


def _rows(run_dir: Path) -> pa.Table:
    return pa.concat_tables(
        pq.read_table(p).replace_schema_metadata(None) for p in request_parts(run_dir)
    )


def test_compaction_keeps_rows_order_and_values(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    every = _write(folder, [7, 5, 9, 3, 8, 6])
    joined = compact_parts(folder, 0, 6, META, part_rows=20, group_rows=8)
    assert joined == 5  # the last part, alone in its group, stays as it is
    names = [p.name for p in request_parts(tmp_path)]
    # Up to 20 rows a part: 7+5 (+9 would pass it), 9+3+8, 6 alone (left as it is).
    assert names == [
        "part-000-00000-00001.parquet",
        "part-000-00002-00004.parquet",
        "part-000-00005.parquet",
    ]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)  # no temp left
    assert _rows(tmp_path).equals(every.replace_schema_metadata(None))
    big = pq.ParquetFile(folder / names[1])
    assert [big.metadata.row_group(g).num_rows for g in range(3)] == [8, 8, 4]
    assert big.schema_arrow.metadata[RUN_METADATA_KEY] == META
    assert big.metadata.row_group(0).column(0).compression == "LZ4"


def _dictionary_columns(path: Path) -> set[str]:
    """The columns of ``path`` with dictionary-encoded pages."""
    md = pq.read_metadata(path)
    return {
        md.row_group(g).column(c).path_in_schema.split(".")[0]
        for g in range(md.num_row_groups)
        for c in range(md.num_columns)
        if md.row_group(g).column(c).has_dictionary_page
    }


def test_nanosecond_columns_are_written_without_a_dictionary(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "requests"
    _write(folder, [7, 5])
    small = _dictionary_columns(folder / part_name(0, 0))
    compact_parts(folder, 0, 2, META, part_rows=20, group_rows=8)
    joined = _dictionary_columns(folder / part_name(0, 0, 1))
    for dictionary in (small, joined):
        assert {"session_id", "status", "request_index"} <= dictionary
        assert not dictionary & {"start_ns", "end_ns", "ttft_ns", "chunk_times_ns"}
        assert not dictionary & set(parts_mod.PLAIN_COLUMNS)
    assert {"start_ns", "chunk_times_ns", "pool_wait_ns"} <= parts_mod.PLAIN_COLUMNS


def test_joined_ids_keep_their_dictionary_pages(tmp_path: Path) -> None:
    # The recorder's ids are strings, which each part stores as a dictionary of
    # its own ids; joined, a row group is still one dictionary and indices, not
    # plain pages (which a reader would hash back into a dictionary id by id:
    # 3.5x the time, as when dictionary-typed parts with differing dictionaries
    # are joined).
    folder = tmp_path / "requests"
    folder.mkdir()
    sid = "x" * 40
    for seq in range(6):
        rows = [
            make_record(run_id="r1", session_id=f"{sid}{(seq * 30 + i) // 3}")
            for i in range(30)
        ]
        table = records_to_table(rows).replace_schema_metadata({RUN_METADATA_KEY: META})
        write_part(table, folder / part_name(0, seq))
    compact_parts(folder, 0, 6, META, part_rows=1000, group_rows=90)
    joined = folder / part_name(0, 0, 5)
    md = pq.read_metadata(joined)
    at = pq.read_schema(joined).get_field_index("session_id")
    plain = 90 * (4 + len(sid) + 2)  # a length and the id, each row
    for g in range(md.num_row_groups):
        column = md.row_group(g).column(at)
        assert column.has_dictionary_page
        assert column.total_uncompressed_size < plain / 2
    got = pq.read_table(joined).column("session_id").to_pylist()
    assert got == [f"{sid}{i // 3}" for i in range(180)]


def test_parts_a_compacted_part_holds_are_read_once(tmp_path: Path) -> None:
    # A run stopped after writing the compacted part but before removing the
    # parts it joined: every reader sees each row once.
    folder = tmp_path / "requests"
    every = _write(folder, [4, 4, 4])
    kept = {p.name: p.read_bytes() for p in folder.iterdir()}
    compact_parts(folder, 0, 3, META, part_rows=100)
    for name, data in kept.items():
        if name != "part-000-00002.parquet":
            (folder / name).write_bytes(data)  # two of the three not yet removed
    assert len(list(folder.iterdir())) == 3
    assert [p.name for p in request_parts(tmp_path)] == ["part-000-00000-00002.parquet"]
    assert _rows(tmp_path).equals(every.replace_schema_metadata(None))


def test_request_parts_orders_by_worker_then_sequence(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    folder.mkdir()
    for name in (
        "part-001-00000.parquet",
        "part-000-100000.parquet",  # past 99,999 parts: six digits
        "part-000-99999.parquet",
        "part-000-00003-00010.parquet",
        "part-000-00004.parquet",  # held by the compacted part above
        "part-extra.parquet",
    ):
        (folder / name).write_bytes(b"")
    # Beside a part it holds, a joined part is trusted only if its footer reads.
    write_part(_table(0, 3), folder / "part-000-00003-00010.parquet")
    assert [p.name for p in request_parts(tmp_path)] == [
        "part-000-00003-00010.parquet",
        "part-000-99999.parquet",
        "part-000-100000.parquet",
        "part-001-00000.parquet",
        "part-extra.parquet",
    ]
    assert [p.name for p in request_parts(tmp_path, 1)] == ["part-001-00000.parquet"]
    assert request_parts(tmp_path / "nothing") == []


def test_an_unreadable_part_is_left_and_splits_the_groups(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    _write(folder, [3, 3, 3, 3, 3])
    (folder / part_name(0, 2)).write_bytes(b"not parquet")
    assert compact_parts(folder, 0, 5, META) == 4
    assert sorted(p.name for p in folder.iterdir()) == [
        "part-000-00000-00001.parquet",
        "part-000-00002.parquet",
        "part-000-00003-00004.parquet",
    ]


def test_mixed_columns_are_left_as_they_are(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    _write(folder, [3, 3])
    older = _table(3, 3).drop_columns(["live_drift_tokens"])
    write_part(older, folder / part_name(0, 1))
    assert compact_parts(folder, 0, 2, META) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        "part-000-00000.parquet",
        "part-000-00001.parquet",
    ]


def test_a_full_disk_leaves_the_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "requests"
    every = _write(folder, [3, 3, 3])
    real = parts_mod.pq.ParquetWriter

    class FullDisk(real):  # type: ignore[misc, valid-type]
        def write_table(self, *args: Any, **kw: Any) -> None:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(parts_mod.pq, "ParquetWriter", FullDisk)
    assert compact_parts(folder, 0, 3, META) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        part_name(0, k) for k in range(3)
    ]
    assert _rows(tmp_path).equals(every.replace_schema_metadata(None))


def test_a_stop_leaves_the_groups_not_begun(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    _write(folder, [3, 3, 3, 3])
    stop = threading.Event()
    stop.set()
    assert compact_parts(folder, 0, 4, META, stop=stop, part_rows=6) == 0
    assert len(list(folder.iterdir())) == 4


async def test_recorder_compacts_its_parts_on_exit(tmp_path: Path) -> None:
    async with ParquetRecorder(
        tmp_path, flush_rows=3, metadata=RunMeta(run_id="r1"), flush_interval_s=60
    ) as rec:
        for i in range(10):
            rec.put(make_record(run_id="r1", session_id="s", request_index=i))
            if i % 3 == 2:
                async with asyncio.timeout(30):  # a failed flush fails, not hangs
                    while rec.rows_written <= i - 1:  # noqa: ASYNC110 - a thread
                        await asyncio.sleep(0.001)
    names = [p.name for p in (tmp_path / "requests").iterdir()]
    assert names == ["part-000-00000-00003.parquet"]
    assert rec.parts_compacted == 4
    table = pq.read_table(tmp_path / "requests" / names[0])
    assert table.column("request_index").to_pylist() == list(range(10))


def test_parts_joined_while_they_are_read_are_read_once(tmp_path: Path) -> None:
    # Another worker's recorder joins its parts while this one reads the run's
    # rows (each worker reads every worker's parts for its end-of-run summary).
    folder = tmp_path / "requests"
    every = _write(folder, [4, 4, 4])
    calls = 0

    def read(part: Path) -> pa.Table:
        nonlocal calls
        calls += 1
        if calls == 2:  # the list in hand is out of date from here on
            compact_parts(folder, 0, 3, META)
        return pq.read_table(part).replace_schema_metadata(None)

    tables = read_request_parts(tmp_path, read)
    assert pa.concat_tables(tables).equals(every.replace_schema_metadata(None))
    assert calls == 3  # two of the old list, then the joined part


def test_compact_command_joins_a_killed_runs_parts(tmp_path: Path) -> None:
    # A killed run: small parts, and a joined part whose parts were not all
    # removed yet. The real CLI joins the rest; analyze gives the same figures.
    run = tmp_path / "run"
    folder = run / "requests"
    every = _write(folder, [4, 4, 4, 5, 5, 5])
    compact_parts(folder, 0, 2, META)  # parts 0-1 joined ...
    write_part(_table(0, 4), folder / part_name(0, 0))  # ... part 0 not yet removed
    (run / "run.json").write_text(json.dumps(RunMeta(run_id="r1").as_dict()))
    analyze = [sys.executable, "-m", "replayer", "analyze", "--json", str(run)]
    before = json.loads(subprocess.run(analyze, capture_output=True, check=True).stdout)
    out = subprocess.run(
        [sys.executable, "-m", "replayer", "compact", "--json", str(run)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {
        "runs": [{"run_dir": str(run), "parts_before": 6, "parts_after": 2}]
    }
    assert [p.name for p in request_parts(run)] == [
        "part-000-00000-00001.parquet",
        "part-000-00002-00005.parquet",
    ]
    assert _rows(run).equals(every.replace_schema_metadata(None))
    after = json.loads(subprocess.run(analyze, capture_output=True, check=True).stdout)
    assert after == before
    assert after["requests"] == 27


def test_analyze_of_many_small_parts_says_to_join_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(run / "requests", [2] * (SMALL_PARTS_HINT + 1))
    (run / "run.json").write_text(json.dumps(RunMeta(run_id="r1").as_dict()))
    analyze = [sys.executable, "-m", "replayer", "analyze", str(run)]
    before = subprocess.run(analyze, capture_output=True, text=True, check=True)
    hint = f"{SMALL_PARTS_HINT + 1} small part files"
    assert hint in before.stdout
    assert f"`replayer compact {run}` joins them" in before.stdout
    compact = [sys.executable, "-m", "replayer", "compact", str(run)]
    subprocess.run(compact, capture_output=True, check=True)
    after = subprocess.run(analyze, capture_output=True, text=True, check=True)
    assert "small part files" not in after.stdout
    # A finished run of many workers, one part each (nothing to join): no note.
    for worker in range(1, SMALL_PARTS_HINT + 2):
        _write(run / "requests", [2], worker=worker)
    assert not [p for p in load_run(run).problems if "small part files" in p]


def test_compact_command_says_what_is_not_a_run(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "replayer", "compact", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"Error: {tmp_path}: not a run directory (no requests/)"
    )


async def test_a_run_that_stopped_on_an_error_keeps_its_parts(tmp_path: Path) -> None:
    rec = ParquetRecorder(tmp_path, flush_rows=2)

    async def record() -> None:
        async with rec:
            for i in range(6):
                rec.put(make_record(run_id="r1", session_id="s", request_index=i))
                await asyncio.sleep(0.05)  # the writer flushes each pair
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        await record()
    names = sorted(p.name for p in (tmp_path / "requests").iterdir())
    assert len(names) >= 2
    assert all(_NAME_SMALL.fullmatch(n) for n in names)
    assert rec.parts_compacted == 0
    assert _rows(tmp_path).column("request_index").to_pylist() == list(range(6))


def test_an_unreadable_joined_part_does_not_hide_the_parts_it_names(
    tmp_path: Path,
) -> None:
    # A power loss after the rename: the joined part's name is there, its bytes
    # not. The parts it would hold are read, and compact joins them again.
    run = tmp_path / "run"
    folder = run / "requests"
    every = _write(folder, [3, 3, 3])
    (folder / part_name(0, 0, 2)).write_bytes(b"")
    (folder / ".part-000-00000-00002.parquet.123-ab.tmp").write_bytes(b"half")
    assert [p.name for p in request_parts(run)] == [part_name(0, k) for k in range(3)]
    assert compact_run(run) == (4, 1)
    assert sorted(p.name for p in folder.iterdir()) == [part_name(0, 0, 2)]
    assert _rows(run).equals(every.replace_schema_metadata(None))


def test_a_workers_outcome_reads_its_own_parts(tmp_path: Path) -> None:
    folder = tmp_path / "requests"
    _write(folder, [2, 2], worker=0)
    _write(folder, [5], worker=1)
    one = read_request_parts(tmp_path, lambda p: pq.read_metadata(p).num_rows, 1)
    every = read_request_parts(tmp_path, lambda p: pq.read_metadata(p).num_rows)
    assert (one, every) == ([5], [2, 2, 5])
