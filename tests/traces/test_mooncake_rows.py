"""Mooncake session rows, cumulative or delta: the hash-prefix containment that tells
them apart, the warning, and `--mooncake-rows` making the two files one workload. The
prompts are worked out by hand in 512-token blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.builders import write_jsonl
from tests.processes import run_cli
from tests.traces.formats import canonical_ids
from traces.io import read_trace
from traces.model import Trace


def _row(sid: str, ts: int, n_in: int, n_out: int, ids: list[int]) -> dict[str, Any]:
    return {"session_id": sid, "timestamp": ts, "input_length": n_in,
            "output_length": n_out, "hash_ids": ids}  # fmt: skip


# Session a, as a client that keeps the history sees it:
#   row 0: blocks 1 2                          1,024 tokens, answers 512
#   row 1: + answer 0 (512) + block 3          2,048 tokens, answers 100
#   row 2: + answer 1 (100) + blocks 4 5 (700) 2,848 tokens
# Session b: one 300-token row, then 200 new tokens after a 5-token answer.
DELTA = [
    _row("a", 0, 1024, 512, [1, 2]),
    _row("b", 10, 300, 5, [40]),
    _row("a", 1000, 512, 100, [3]),
    _row("a", 2000, 700, 10, [4, 5]),
    _row("b", 3000, 200, 1, [41]),
]
# The same turns with each row holding the whole history: answer 0 is block 7,
# block 3 is block 8; 2,048-2,560 holds answer 1 and the head of block 4 (9), the
# rest (288 tokens) is 10. Session b: 300 + 5 + 200 tokens, one block each way.
CUMULATIVE = [
    _row("a", 0, 1024, 512, [1, 2]),
    _row("b", 10, 300, 5, [40]),
    _row("a", 1000, 2048, 100, [1, 2, 7, 8]),
    _row("a", 2000, 2848, 10, [1, 2, 7, 8, 9, 10]),
    _row("b", 3000, 505, 1, [42]),
]


def _prompts(trace: Trace) -> list[tuple[str, list[int], list[list[int]]]]:
    return [
        (s.session_id, [r.input_tokens for r in s.requests], canonical_ids(s))
        for s in trace.sessions
    ]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_jsonl(tmp_path / "delta.jsonl", DELTA),
        write_jsonl(tmp_path / "cumulative.jsonl", CUMULATIVE),
    )


def test_each_file_is_detected_and_auto_reads_it_as_it_is(
    files: tuple[Path, Path],
) -> None:
    delta, cumulative = files
    notes: list[str] = []
    as_delta = read_trace(delta, notes=notes)
    assert notes == [
        f"{delta}: session rows look delta: 0 of 2 follow-up rows start with their "
        "previous row's blocks; read as delta (--mooncake-rows delta|cumulative "
        "to choose)"
    ]
    notes.clear()
    as_cumulative = read_trace(cumulative, notes=notes)
    assert notes == [
        f"{cumulative}: session rows look cumulative: 2 of 2 follow-up rows start "
        "with their previous row's blocks; read as cumulative (--mooncake-rows "
        "delta|cumulative to choose)"
    ]  # b's first row has no full block: nothing to compare
    assert _prompts(as_delta) == _prompts(as_cumulative)
    a = as_delta.sessions[0]
    assert [r.input_tokens for r in a.requests] == [1024, 2048, 2848]
    assert a.requests[2].hash_ids[:2].tolist() == [1, 2]  # the first row's ids kept
    assert [r.output_tokens for r in a.requests] == [512, 100, 10]


def test_the_chosen_reading_and_a_contradicted_choice(files: tuple[Path, Path]) -> None:
    delta, cumulative = files
    notes: list[str] = []
    chosen = read_trace(cumulative, mooncake_rows="cumulative", notes=notes)
    assert notes == []  # the choice agrees with the rows
    assert _prompts(chosen) == _prompts(read_trace(delta, mooncake_rows="delta"))
    twice = read_trace(cumulative, mooncake_rows="delta", notes=notes)
    assert notes == [
        f"{cumulative}: session rows look cumulative: 2 of 2 follow-up rows start "
        "with their previous row's blocks, but --mooncake-rows delta reads them "
        "otherwise: each prompt's history is counted twice"
    ]
    # History added again: 1,024 + 512 + 2,048 tokens for a's second row.
    assert twice.sessions[0].requests[1].input_tokens == 1024 + 512 + 2048
    notes.clear()
    short = read_trace(delta, mooncake_rows="cumulative", notes=notes)
    assert "each prompt's history is dropped" in notes[0]
    assert [r.input_tokens for r in short.sessions[0].requests] == [1024, 512, 700]


def test_rows_without_sessions_are_read_as_they_are(shared_data: Path) -> None:
    notes: list[str] = []
    trace = read_trace(
        shared_data / "mooncake" / "conversation_trace.jsonl",
        mooncake_rows="delta",
        notes=notes,
    )
    assert notes == []  # no session, no history to read either way
    with (shared_data / "mooncake" / "conversation_trace.jsonl").open() as f:
        first = json.loads(f.readline())
    assert trace.sessions[0].requests[0].hash_ids.tolist() == first["hash_ids"]


def test_cli_warns_and_a_run_sends_the_delta_reading(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    delta, cumulative = files
    out = run_cli("trace", "stats", str(cumulative), "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("warning: ")
    assert "look cumulative" in out.stderr
    assert (
        json.loads(out.stdout)["total_input_tokens"] == 1024 + 2048 + 2848 + 300 + 505
    )
    out = run_cli("trace", "stats", str(cumulative), "--mooncake-rows", "cumulative")
    assert out.returncode == 0
    assert out.stderr == ""
    run_dir = tmp_path / "run"
    out = run_cli(
        "run", str(delta), "--virtual", "sim", "--concurrency", "2", "--quiet",
        "--think-scale", "0", "--out", str(run_dir),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "session rows look delta" in out.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config"]["mooncake_rows"] == "auto"
    assert any("look delta" in w for w in meta["warnings"])
    rows = pq.read_table(run_dir / "requests").to_pylist()
    sent = sorted(r["trace_input_tokens"] for r in rows)
    assert sent == sorted([1024, 2048, 2848, 300, 505])
