"""Mooncake session rows, cumulative or delta: the hash-prefix containment that tells
them apart, the warning, and `--mooncake-rows` making the two files one workload. The
prompts are worked out by hand in 512-token blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builders import write_jsonl
from tests.traces.formats import CUMULATIVE, DELTA, canonical_ids
from traces.io import read_trace
from traces.model import Trace


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
