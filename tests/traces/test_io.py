"""Reading and writing traces: format detection, lossless round trips through native
JSONL (plain and gzip) and the Parquet store, on generated and on the real traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces import TraceError, read_trace, write_trace
from traces.model import Trace

_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _same(a: Trace, b: Trace) -> None:
    assert a.sessions == b.sessions  # Request.__eq__ compares hash ids by value


@_SETTINGS
@given(data=st.data())
def test_io_round_trip_generated_is_lossless(
    tmp_path: Path, trace_strategy: st.SearchStrategy[Trace], data: st.DataObject
) -> None:
    trace = data.draw(trace_strategy)
    for suffix in (".jsonl", ".jsonl.gz", ".parquet"):
        _same(read_trace(write_trace(trace, tmp_path / f"t{suffix}")), trace)
    # Weka-style JSONL -> native model -> Parquet store -> model.
    native = read_trace(tmp_path / "t.jsonl")
    stored = read_trace(write_trace(native, tmp_path / "t2.parquet"))
    _same(stored, trace)
    # Loaded hash ids are read-only int64 arrays whatever the source.
    for session, _ in stored.all_sessions():
        for r in session.requests:
            assert r.hash_ids.dtype == np.int64
            assert not r.hash_ids.flags.writeable


def _raw_requests(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for e in entries:
        if e["type"] == "subagent":
            out.extend(_raw_requests(e["requests"]))  # type: ignore[arg-type]
        else:
            out.append(e)
    return out


def test_io_reads_every_real_weka_session(weka_dir: Path) -> None:
    files = sorted(weka_dir.glob("*.json"))
    assert len(files) == 30
    trace = read_trace(weka_dir)
    assert trace.source_format == "weka"
    by_id = {s.session_id: s for s in trace.sessions}
    assert len(by_id) == 30
    for f in files:
        raw = json.loads(f.read_text())
        session = by_id[str(raw["id"])]
        raw_reqs = _raw_requests(raw["requests"])
        got = [r for _, _, r in session.ordered_requests()]
        assert len(got) == len(raw_reqs)
        for r, want in zip(got, raw_reqs, strict=True):
            assert r.input_tokens == want["in"]
            assert r.output_tokens == want["out"]
            assert r.hash_ids.tolist() == want["hash_ids"]
            assert r.kind == want["type"]
            assert r.ttft_s == want.get("ttft")


def test_io_real_weka_round_trip_through_jsonl_gz_and_store(
    weka_dir: Path, tmp_path: Path
) -> None:
    weka = read_trace(weka_dir)
    gz = read_trace(write_trace(weka, tmp_path / "w.jsonl.gz"))
    assert gz.source_format == "native"
    with gzip.open(tmp_path / "w.jsonl.gz", "rt") as fh:
        assert sum(1 for _ in fh) == 30  # one session per line
    stored = read_trace(write_trace(gz, tmp_path / "w.parquet"))
    _same(gz, weka)
    _same(stored, weka)


def test_io_native_jsonl_is_weka_compatible(weka_dir: Path, tmp_path: Path) -> None:
    # Each line of our JSONL is a Weka session object: the original file, re-read by
    # plain json, has the same requests as our line (other tools can read it).
    one = sorted(weka_dir.glob("*.json"))[0]
    out = write_trace(read_trace(one), tmp_path / "one.jsonl")
    ours = json.loads(out.read_text())
    theirs = json.loads(one.read_text())
    assert ours["id"] == theirs["id"]
    assert ours["totals"] == theirs["totals"]
    assert _raw_requests(ours["requests"]) == _raw_requests(theirs["requests"])


def test_io_reads_real_mooncake(mooncake_file: Path) -> None:
    trace = read_trace(mooncake_file)
    assert trace.source_format == "mooncake"
    lines = mooncake_file.read_text().splitlines()
    assert trace.request_count() == len(lines)
    first = json.loads(lines[0])
    r = trace.sessions[0].requests[0]
    assert (r.input_tokens, r.output_tokens) == (
        first["input_length"],
        first["output_length"],
    )
    assert r.hash_ids.tolist() == first["hash_ids"]
    assert trace.sessions[0].block_size == 512
    assert trace.sessions[0].hash_id_scope == "global"


def test_io_detects_single_json_list_and_gzip(tmp_path: Path) -> None:
    session = {
        "id": "s1",
        "block_size": 4,
        "requests": [{"t": 0, "type": "n", "in": 9, "out": 1, "hash_ids": [1, 2]}],
    }
    (tmp_path / "one.json").write_text(json.dumps(session, indent=2))
    (tmp_path / "list.json").write_text(json.dumps([session, {**session, "id": "s2"}]))
    (tmp_path / "s.jsonl.gz").write_bytes(
        gzip.compress((json.dumps({**session, "id": "s3"}) + "\n").encode())
    )
    assert [s.session_id for s in read_trace(tmp_path / "one.json").sessions] == ["s1"]
    assert len(read_trace(tmp_path / "list.json").sessions) == 2
    assert read_trace(tmp_path / "s.jsonl.gz").sessions[0].session_id == "s3"


def test_io_write_rejects_unknown_suffix(tmp_path: Path) -> None:
    trace = Trace(sessions=())
    with pytest.raises(TraceError, match="unknown output format"):
        write_trace(trace, tmp_path / "t.csv")
