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
