"""The Parquet trace store: run-length encoding of hash ids, metadata, bad files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.builders import request, session, trace_of
from traces import TraceError, read_trace
from traces.store import read_store, write_store


def test_store_runs_across_request_boundaries_and_empty_requests(
    tmp_path: Path,
) -> None:
    # Consecutive ids spanning two requests, an empty request, descending ids, and
    # the int64 extremes (run arithmetic must not overflow).
    lists = [[5, 6, 7], [8, 9], [], [3, 2, 1], [2**63 - 2, 2**63 - 1], [-(2**63), 0]]
    reqs = [request(ids, block_size=1) for ids in lists]  # one token per id
    write_store(trace_of(session("s", reqs, block_size=1)), tmp_path / "t.parquet")
    got = read_store(tmp_path / "t.parquet").sessions[0].requests
    assert [r.hash_ids.tolist() for r in got] == lists
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column("block_runs").to_pylist()[0] == [5]  # one run for 5, 6, 7


def test_store_is_much_smaller_than_its_ids(weka_dir: Path, tmp_path: Path) -> None:
    trace = read_trace(weka_dir)
    out = tmp_path / "w.parquet"
    write_store(trace, out)
    n_ids = sum(r.hash_ids.size for s, _ in trace.all_sessions() for r in s.requests)
    assert out.stat().st_size < n_ids  # < 1 byte per 8-byte id


def test_store_rejects_plain_parquet_and_garbage(tmp_path: Path) -> None:
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), plain)
    with pytest.raises(TraceError, match="not a trace store"):
        read_store(plain)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match="not a readable Parquet trace store"):
        read_store(garbage)


def _with_column(src: Path, out: Path, name: str, index: int, value: object) -> Path:
    table = pq.read_table(src)
    values = table.column(name).to_pylist()
    values[index] = value
    field = table.schema.field(name)
    table = table.set_column(
        table.schema.get_field_index(name), field, pa.array(values, type=field.type)
    )
    pq.write_table(table, out)
    return out


def _store_of_three(tmp_path: Path) -> Path:
    reqs = [request(blocks=2, think=1.0), request(blocks=3), request(blocks=4)]
    path = tmp_path / "t.parquet"
    write_store(trace_of(session("s", reqs)), path)
    return path


@pytest.mark.parametrize(
    ("column", "value", "field", "reason"),
    [
        ("input_tokens", -100, "in", "got -100"),
        ("output_tokens", 2**62, "out", f"got {2**62}"),
        ("think_time_s", float("nan"), "think_time", "got nan"),
        ("t_s", -1.0, "t", "got -1.0"),
        ("input_tokens", 100, "hash_ids", "3 blocks do not fit in=100"),
    ],
)
def test_store_rows_get_the_json_readers_checks(
    tmp_path: Path, column: str, value: object, field: str, reason: str
) -> None:
    src = _store_of_three(tmp_path)
    bad = _with_column(src, tmp_path / "bad.parquet", column, 1, value)
    with pytest.raises(TraceError) as info:
        read_trace(bad)
    text = str(info.value)
    assert text.startswith(f"{bad}, session s, request 1, field '{field}'")
    assert reason in text


def test_store_with_negative_input_fails_validate_and_run(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from replayer.cli import main

    src = _store_of_three(tmp_path)
    bad = _with_column(src, tmp_path / "bad.parquet", "input_tokens", 2, -100)
    res = CliRunner().invoke(main, ["trace", "validate", str(bad)])
    assert res.exit_code == 1
    assert "request 2, field 'in'" in res.output
    assert "-100" in res.output
    out = tmp_path / "run"
    res = CliRunner().invoke(
        main, ["run", str(bad), "--virtual", "sim", "--quiet", "--out", str(out)]
    )
    assert res.exit_code == 2
    assert "request 2, field 'in'" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize(
    "meta",
    [
        b"{not json",
        b"[1, 2]",
        b'{"format": "replayer-trace-store/2", "sessions": 3}',
        b'{"format": "replayer-trace-store/2", "sessions": [{"n": "3"}]}',
    ],
)
def test_store_with_bad_metadata_is_one_trace_error(
    tmp_path: Path, meta: bytes
) -> None:
    src = _store_of_three(tmp_path)
    table = pq.read_table(src)
    md = dict(table.schema.metadata)
    md[b"replayer.trace"] = meta
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata(md), bad)
    with pytest.raises(TraceError) as info:
        read_store(bad)
    assert str(info.value).startswith(f"{bad}: trace store metadata")
    assert "\n" not in str(info.value)
