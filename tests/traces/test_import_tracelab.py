"""Importing TraceLab round rows: one request per row, the prefix/append split as block
ids, times from timing_events, schema errors naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import iso
from traces.errors import TraceError, TraceFormatError
from traces.importers import import_logs
from traces.importers.logfile import PARTIAL_LAST_LINE

SALT = b"test-salt"


@pytest.fixture(scope="module")
def rounds(shared_data: Path) -> Path:
    return shared_data / "tracelab" / "sanitized" / "round_trace.jsonl"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_import_tracelab_one_request_per_row(rounds: Path) -> None:
    rows = _rows(rounds)
    res = import_logs("tracelab", [rounds], salt=SALT)
    assert res.report.calls == len(rows) == 19
    by_model = {s.models[0]: s for s in res.trace.sessions}
    assert set(by_model) == {"claude-opus-4-8", "gpt-5.4"}
    for session in res.trace.sessions:
        mine = sorted(
            (r for r in rows if r["model"] == session.models[0]),
            key=lambda r: r["round_index"],
        )
        assert [r.input_tokens for r in session.requests] == [
            row["input_tokens_total"] for row in mine
        ]
        assert [r.output_tokens for r in session.requests] == [
            row["output_tokens"] for row in mine
        ]
        assert [r.extra["provider_cached_tokens"] for r in session.requests] == [
            row["prefix_tokens"] for row in mine
        ]
    # The same Claude log as the raw importer sees: 32,272 = 27,217 + 5,055.
    claude = by_model["claude-opus-4-8"].requests
    assert claude[0].input_tokens == 27217 + 5055
    # Times from timing_events: round 1 starts at its last tool result
    # (05:40:50.938) and ends at its last output (05:41:04.862).
    assert claude[1].think_time_s == pytest.approx(50.938 - 31.647)
    assert claude[1].api_time_s == pytest.approx(64.862 - 50.938)
    assert by_model["gpt-5.4"].requests[0].extra["reasoning_output_tokens"] == 199


def test_import_tracelab_split_becomes_shared_and_new_blocks(rounds: Path) -> None:
    trace = import_logs("tracelab", [rounds], salt=SALT).trace
    for session in trace.sessions:
        assert session.extra["hash_rule"] == "tracelab-prefix-split"
        seen: set[int] = set()
        prev = None
        for r in session.requests:
            prefix = r.extra["provider_cached_tokens"]
            keep = 0 if prev is None else min(prefix, prev.input_tokens) // 64
            if prev is not None:
                assert np.array_equal(r.hash_ids[:keep], prev.hash_ids[:keep])
            assert not seen & set(r.hash_ids[keep:].tolist())
            seen |= set(r.hash_ids.tolist())
            prev = r
    # Codex round 3 hit only 3,456 cached tokens: 54 blocks carry over, not 157.
    codex = next(s for s in trace.sessions if s.models == ("gpt-5.4",)).requests
    assert np.array_equal(codex[3].hash_ids[:54], codex[2].hash_ids[:54])
    assert codex[3].hash_ids[54] not in set(codex[2].hash_ids.tolist())


def _row(rnd: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": "s",
        "round_index": rnd,
        "model": "gpt-5.4",
        "input_tokens_total": 1000 + rnd,
        "prefix_tokens": 900,
        "newly_append_tokens": 100 + rnd,
        "output_tokens": 10,
        "timing_events": [
            {"event_type": "user_message", "timestamp": iso(10.0 * rnd)},
            {"event_type": "text", "timestamp": iso(10.0 * rnd + 2)},
        ],
    }
    row.update(fields)
    return row


def test_import_tracelab_schema_errors_name_file_line_and_field(tmp_path: Path) -> None:
    log = tmp_path / "rows.jsonl"
    rows = [_row(0), _row(1, output_tokens="many"), _row(2, input_tokens_total=5)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceFormatError) as info:
        import_logs("tracelab", [log])
    problems = [str(p) for p in info.value.problems]
    assert problems[0].startswith(f"{log}:2, field 'output_tokens': expected")
    assert problems[1].startswith(f"{log}:3, field 'input_tokens_total': 5 != ")
    assert len(problems) == 2


def test_import_tracelab_partial_last_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "rows.jsonl"
    text = json.dumps(_row(0)) + "\n" + json.dumps(_row(1)) + "\n" + json.dumps(_row(2))
    log.write_text(text[:-10])
    res = import_logs("tracelab", [log], salt=SALT)
    (session,) = res.trace.sessions
    assert [r.input_tokens for r in session.requests] == [1000, 1001]
    assert session.requests[1].think_time_s == pytest.approx(8.0)
    assert res.report.skipped[PARTIAL_LAST_LINE].first == f"{log}:3"


def test_import_tracelab_has_no_text_for_a_tokenizer(rounds: Path) -> None:
    with pytest.raises(TraceError, match="TraceLab rows hold none"):
        import_logs("tracelab", [rounds], tokenizer=rounds)
