"""The BurstGPT reader, on small CSVs built exactly as the published schema documents
them (release v2.0 with ``Session ID``/``Elapsed time``, and release v1.1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from traces.burstgpt import looks_like_burstgpt, read_burstgpt
from traces.errors import TraceFormatError
from traces.io import read_trace, write_trace

V2_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
    "Total tokens,Log Type\n"
)
V2 = V2_HEADER + (
    "19440110.0,s-a,2,GPT-4,906,446,1352,Conversation log\n"
    "19440120.0,s-b,1,ChatGPT,36,29,65,Conversation log\n"
    "19440130.0,s-a,3,GPT-4,1400,100,1500,Conversation log\n"
    "19440200.0,,4,ChatGPT,500,0,500,API log\n"
)
V1 = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,230,1317,Conversation log\n"
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "BurstGPT.csv"
    path.write_text(text)
    return path


def test_burstgpt_v2_sessions_times_and_blocks(tmp_path: Path) -> None:
    trace = read_burstgpt(_write(tmp_path, V2))
    assert trace.source_format == "burstgpt"
    assert [s.session_id for s in trace.sessions] == ["s-a", "s-b", "burstgpt-5"]
    assert [s.start_s for s in trace.sessions] == [0.0, 10.0, 90.0]
    a = trace.sessions[0]
    assert [(r.input_tokens, r.output_tokens) for r in a.requests] == [
        (906, 446),
        (1400, 100),
    ]
    assert [r.t_s for r in a.requests] == [0.0, 20.0]
    # 20 s after the first arrival, minus its 2 s response time.
    assert a.requests[1].think_time_s == 18.0
    assert [r.api_time_s for r in a.requests] == [2.0, 3.0]
    assert a.requests[0].model == "GPT-4"
    assert a.requests[0].extra == {"log_type": "Conversation log"}
    # No published prefix structure: each request extends the previous one.
    assert a.extra == {"hash_rule": "context-growth"}
    assert a.requests[1].hash_ids.size == 1400 // 64
    assert np.array_equal(a.requests[1].hash_ids[: 906 // 64], a.requests[0].hash_ids)
    # A failed request (0 response tokens) is kept as the release has it.
    assert trace.sessions[2].requests[0].output_tokens == 0


def test_burstgpt_v1_rows_are_sessions_of_their_own(tmp_path: Path) -> None:
    trace = read_burstgpt(_write(tmp_path, V1), block_size=16)
    assert [s.start_s for s in trace.sessions] == [0.0, 40.0]
    assert [len(s.requests) for s in trace.sessions] == [1, 1]
    assert trace.sessions[1].requests[0].hash_ids.size == 1087 // 16
    assert trace.sessions[0].requests[0].api_time_s is None


def test_burstgpt_round_trips(tmp_path: Path) -> None:
    trace = read_burstgpt(_write(tmp_path, V2))
    for name in ("n.jsonl", "n.parquet"):
        assert (
            read_trace(write_trace(trace, tmp_path / name)).sessions == trace.sessions
        )


def test_burstgpt_problems_name_file_line_and_field(tmp_path: Path) -> None:
    bad = V2_HEADER + (
        "19440110.0,s-a,2,GPT-4,906,446,1352,Conversation log\n"
        "19440120.0,s-b,1,ChatGPT,lots,29,65,Conversation log\n"
        "19440130.0,s-a,3,GPT-4,1400,100,9999,Conversation log\n"
    )
    path = _write(tmp_path, bad)
    with pytest.raises(TraceFormatError) as info:
        read_burstgpt(path)
    got = [str(p) for p in info.value.problems]
    assert got == [
        f"{path}:3, field 'Request tokens': expected a non-negative integer, "
        "got 'lots'",
        f"{path}:4, field 'Total tokens': 9999 != Request tokens + Response tokens "
        "(1500)",
    ]
    with pytest.raises(TraceFormatError, match="missing column"):
        read_burstgpt(_write(tmp_path, "Time,Model\n1,GPT-4\n"))


def test_burstgpt_detection_rule() -> None:
    assert looks_like_burstgpt(V2_HEADER)
    assert looks_like_burstgpt(V1.splitlines()[0].encode())
    assert not looks_like_burstgpt("TIMESTAMP,ContextTokens,GeneratedTokens")


def test_burstgpt_csv_is_detected_by_read_trace_file_and_folder(tmp_path: Path) -> None:
    path = _write(tmp_path, V2)
    trace = read_trace(path)
    assert trace.source_format == "burstgpt"
    assert trace.sessions == read_burstgpt(path).sessions
    assert read_trace(path.parent).sessions == trace.sessions  # .csv in a folder
