"""The Bailian (Qwen usage traces) reader, on small files built exactly as the published
schema documents them (no public sample is shipped here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from traces.bailian import looks_like_bailian, read_bailian
from traces.errors import TraceFormatError
from traces.io import check_trace, read_trace, write_trace
from traces.stats import trace_stats


def _req(
    chat: int, parent: int, ts: float, n_in: int, ids: list[int], **kw: Any
) -> dict:
    row = {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": n_in,
        "output_length": kw.pop("out", 10),
        "type": kw.pop("type", "text"),
        "turn": kw.pop("turn", 1),
        "hash_ids": ids,
    }
    row.update(kw)
    return row


ROWS = [
    _req(1, -1, 0.5, 40, [1, 2, 3]),  # 40 tokens: 3 blocks of 16, the last partial
    _req(2, -1, 1.0, 32, [4, 5], type="search"),
    _req(3, 1, 4.0, 70, [1, 2, 6, 7, 8], turn=2),  # continues chat 1
    _req(4, 1, 5.0, 70, [1, 2, 9, 10, 11], turn=2),  # a second answer to chat 1
    _req(5, 99, 6.0, 16, [12], turn=3),  # its parent is outside the file
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bailian_sessions_follow_parent_chat_ids(tmp_path: Path) -> None:
    trace = read_bailian(_write(tmp_path / "qwen_traceA_blksz_16.jsonl", ROWS))
    assert trace.source_format == "bailian"
    ids = [s.session_id for s in trace.sessions]
    assert ids == ["bailian-1", "bailian-2", "bailian-4", "bailian-5"]
    first = trace.sessions[0]
    assert [r.input_tokens for r in first.requests] == [40, 70]
    assert [r.t_s for r in first.requests] == [0.0, 3.5]
    # Arrivals only: the think time is the gap between arrivals.
    assert [r.think_time_s for r in first.requests] == [0.0, 3.5]
    assert first.start_s == 0.5
    assert (first.block_size, first.hash_id_scope) == (16, "global")
    assert first.requests[1].extra == {"turn": 2}
    assert trace.sessions[1].requests[0].input_types == ("search",)
    assert np.array_equal(trace.sessions[2].requests[0].hash_ids, [1, 2, 9, 10, 11])


def test_bailian_hash_ids_are_shared_across_sessions(tmp_path: Path) -> None:
    stats = trace_stats(read_bailian(_write(tmp_path / "t.jsonl", ROWS)))
    # Chats 3 and 4 each hit blocks 1-2 (32 tokens) of chat 1: 64 of 228 tokens.
    assert stats.as_dict()["ideal_cache_hit_rate"] == pytest.approx(64 / 228)


def test_bailian_round_trips_through_native_and_parquet(tmp_path: Path) -> None:
    trace = read_bailian(_write(tmp_path / "t.jsonl", ROWS))
    for name in ("n.jsonl", "n.parquet"):
        assert (
            read_trace(write_trace(trace, tmp_path / name)).sessions == trace.sessions
        )


def test_bailian_problems_name_file_line_and_field(tmp_path: Path) -> None:
    rows = [
        ROWS[0],
        _req(2, -1, 1.0, 32, [4, 5, 6]),  # 3 blocks cannot hold 32 tokens of 16
        _req(3, -1, -1.0, 16, [7]),
        ROWS[0],
    ]
    path = _write(tmp_path / "t.jsonl", rows)
    with pytest.raises(TraceFormatError) as info:
        read_bailian(path)
    got = [str(p) for p in info.value.problems]
    assert got[0].startswith(f"{path}:2, field 'hash_ids': 3 blocks do not fit")
    assert got[1].startswith(f"{path}:3, field 'timestamp': expected seconds")
    assert got[2].startswith(f"{path}:4, field 'chat_id': duplicate chat_id 1")
    assert len(got) == 3


def test_bailian_detection_rule() -> None:
    assert looks_like_bailian(ROWS[0])
    mooncake = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}
    assert not looks_like_bailian(mooncake)


def test_bailian_file_is_detected_by_read_trace_and_validate(tmp_path: Path) -> None:
    # read_trace (so `trace stats`, `validate` and `run`) finds the format itself;
    # Mooncake's reader, which Bailian rows would also half-match, is not asked.
    path = _write(tmp_path / "qwen.jsonl", ROWS)
    trace = read_trace(path)
    assert trace.source_format == "bailian"
    assert trace.sessions == read_bailian(path).sessions
    bad = _write(tmp_path / "bad.jsonl", [{**ROWS[0], "turn": "x"}, *ROWS[1:]])
    loaded, problems = check_trace(bad)
    assert loaded is None
    assert problems
    assert problems[0].line == 1
