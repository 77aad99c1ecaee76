"""Importing Codex rollout logs: one call per token_count round, usage, gaps, prefixes,
subagents, live logs. Expected numbers are read by hand off the shared log's
``token_count`` records (``last_token_usage``)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import codex_record, codex_token_count, record_view, write_jsonl
from traces.importers import import_logs
from traces.importers.codex import NO_INFO, REPEATED, UNFINISHED
from traces.io import read_trace, write_trace
from traces.model import Session

SALT = b"test-salt"

# (input_tokens, output_tokens, cached_input_tokens, reasoning_output_tokens) of
# each token_count record's last_token_usage.
EXPECTED = [
    (9324, 444, 6912, 199),  # record 0015
    (9917, 94, 9600, 11),  # record 0023
    (10058, 59, 9856, 15),  # record 0027
    (10152, 233, 3456, 26),  # record 0034
    (10472, 294, 10240, 96),  # record 0040
    (10436, 262, 9216, 69),  # record 0051
    (11636, 198, 10624, 41),  # record 0057
    (11727, 279, 10368, 124),  # record 0067
    (12097, 49, 9216, 0),  # record 0071
]


@pytest.fixture(scope="module")
def codex_log(shared_data: Path) -> Path:
    return shared_data / "tracelab" / "codex" / "trace.json"


def _one(paths: list[Path], **kw: Any) -> Session:
    (session,) = import_logs("codex", paths, salt=SALT, **kw).trace.sessions
    return session


def test_import_codex_calls_equal_the_logs_usage(codex_log: Path) -> None:
    session = _one([codex_log])
    got = [
        (
            r.input_tokens,
            r.output_tokens,
            r.extra["provider_cached_tokens"],
            r.extra["reasoning_output_tokens"],
        )
        for r in session.requests
    ]
    assert got == EXPECTED
    rounds = [
        rec
        for rec in record_view(codex_log)
        if rec["type"] == "event_msg" and rec["payload"]["type"] == "token_count"
    ]
    assert len(session.requests) == len(rounds) == 9
    assert session.models == ("gpt-5.4",)


def test_import_codex_gaps_come_from_timestamps(codex_log: Path) -> None:
    reqs = _one([codex_log]).requests
    # Call 0: the user message at 10:05:59.328 (0007/0008) → token_count 10:06:05.542.
    assert reqs[0].api_time_s == pytest.approx(65.542 - 59.328)
    # Call 1: tool gap until the last tool output 10:06:06.704 (0018), then the round
    # until its token_count 10:06:08.390 (0023).
    assert reqs[1].think_time_s == pytest.approx(66.704 - 65.542)
    assert reqs[1].api_time_s == pytest.approx(68.390 - 66.704)
    # Call 5: the second user message 10:06:29.707 (0045) after 10:06:23.374 (0040).
    assert reqs[5].think_time_s == pytest.approx(89.707 - 83.374)
    assert reqs[5].t_s == pytest.approx(89.707 - 59.328)
    assert reqs[5].input_types == ("text",)
    assert reqs[1].input_types == ("tool_result",)
    assert reqs[2].output_types == ("thinking", "tool_use")


def test_import_codex_each_call_extends_its_predecessor(codex_log: Path) -> None:
    reqs = _one([codex_log]).requests
    for prev, r in itertools.pairwise(reqs):
        n = min(prev.input_tokens, r.input_tokens) // 64
        assert np.array_equal(r.hash_ids[:n], prev.hash_ids[:n])
        assert not set(r.hash_ids[n:].tolist()) & set(prev.hash_ids.tolist())
    # Call 5 (10,436 tokens) is a little shorter than call 4 (10,472): the reasoning
    # of the earlier turn was dropped; it is all call 4's leading blocks.
    assert np.array_equal(reqs[5].hash_ids, reqs[4].hash_ids[:163])


def test_import_codex_skips_repeats_empty_counts_and_running_rounds(
    codex_log: Path, tmp_path: Path
) -> None:
    records = record_view(codex_log)
    empty = codex_record(0, "event_msg", {"type": "token_count", "info": None})
    empty["timestamp"] = records[3]["timestamp"]
    running = copy.deepcopy(records[62])  # a reasoning item: a round has begun
    log = write_jsonl(
        tmp_path / "rollout.jsonl",
        [*records[:4], empty, *records[4:15], records[14], *records[15:], running],
    )
    res = import_logs("codex", [log], salt=SALT)
    reqs = res.trace.sessions[0].requests
    assert [r.input_tokens for r in reqs] == [e[0] for e in EXPECTED]
    skipped = res.report.skipped
    assert skipped[NO_INFO].count == 1
    assert skipped[REPEATED].count == 1
    assert skipped[REPEATED].first == f"{log}:17"
    assert skipped[UNFINISHED].count == 1


def _rollout(tid: str, source: object, t0: float) -> list[dict[str, Any]]:
    meta = {"id": tid, "source": source, "cwd": "/x", "originator": "codex_cli_rs"}
    return [
        codex_record(t0, "session_meta", meta),
        codex_record(t0, "turn_context", {"model": "gpt-5.1-codex-max"}),
    ]


def _user(t: float, text: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return codex_record(
        t, "response_item", {"type": "message", "role": "user", "content": content}
    )


def _call(t: float, name: str, call_id: str) -> dict[str, Any]:
    payload = {
        "type": "function_call",
        "name": name,
        "arguments": "{}",
        "call_id": call_id,
    }
    return codex_record(t, "response_item", payload)


def _output(t: float, call_id: str, text: str) -> dict[str, Any]:
    payload = {"type": "function_call_output", "call_id": call_id, "output": text}
    return codex_record(t, "response_item", payload)


def _say(t: float) -> dict[str, Any]:
    content = [{"type": "output_text", "text": "done"}]
    payload = {"type": "message", "role": "assistant", "content": content}
    return codex_record(t, "response_item", payload)


def test_import_codex_thread_spawn_becomes_a_subagent(tmp_path: Path) -> None:
    child_source = {
        "subagent": {
            "thread_spawn": {
                "parent_thread_id": "parent-1",
                "depth": 1,
                "agent_role": "explorer",
            }
        }
    }
    parent = [
        *_rollout("parent-1", "cli", 0.0),
        _user(0.0, "look around"),
        _call(1.0, "spawn_agent", "c1"),
        codex_token_count(1.1, (5000, 0, 40), (5000, 0, 40)),
        _output(1.2, "c1", '{"agent_id": "child-1", "nickname": "Ada"}'),
        _call(1.5, "wait", "c2"),
        codex_token_count(1.6, (5100, 4992, 20), (10100, 4992, 60)),
        _output(4.0, "c2", '{"status": "completed"}'),
        _say(4.5),
        codex_token_count(4.6, (5300, 5056, 30), (15400, 10048, 90)),
    ]
    child = [
        *_rollout("child-1", child_source, 1.2),
        _user(1.25, "explore"),
        _say(2.0),
        codex_token_count(2.1, (3000, 0, 10), (3000, 0, 10)),
        _user(2.5, "more"),
        _say(3.0),
        codex_token_count(3.1, (3050, 2944, 12), (6050, 2944, 22)),
    ]
    write_jsonl(tmp_path / "2026" / "rollout-parent.jsonl", parent)
    write_jsonl(tmp_path / "2026" / "rollout-child.jsonl", child)
    res = import_logs("codex", [tmp_path / "**" / "*.jsonl"], salt=SALT)
    (session,) = res.trace.sessions
    assert [r.input_tokens for r in session.requests] == [5000, 5100, 5300]
    (sub,) = session.subagents
    assert (sub.anchor_index, sub.join_index) == (0, 1)
    assert sub.subagent_type == "explorer"
    # The child's first input came at 1.25 s, after the join call had started (1.2 s):
    # the Weka format puts a spawn between its anchor and its join.
    assert sub.t_s == pytest.approx(1.2)
    assert [r.input_tokens for r in sub.session.requests] == [3000, 3050]
    assert sub.session.requests[1].think_time_s == pytest.approx(0.4)
    assert sub.session.models == ("gpt-5.1-codex-max",)
    assert sub.duration_ms == pytest.approx(1850)
    back = read_trace(write_trace(res.trace, tmp_path / "t.jsonl"))
    assert back.sessions == res.trace.sessions


def test_import_codex_compaction_starts_a_new_prefix(tmp_path: Path) -> None:
    log = write_jsonl(
        tmp_path / "r.jsonl",
        [
            *_rollout("t-1", "cli", 0.0),
            _user(0.0, "a"),
            _say(1.0),
            codex_token_count(1.1, (20000, 0, 10), (20000, 0, 10)),
            _user(2.0, "b"),
            _say(3.0),
            codex_token_count(3.1, (21000, 19968, 10), (41000, 19968, 20)),
            codex_record(
                4.0, "compacted", {"message": "summary", "replacement_history": []}
            ),
            _user(5.0, "c"),
            _say(6.0),
            codex_token_count(6.1, (30000, 6400, 10), (71000, 26368, 30)),
        ],
    )
    r = _one([log]).requests
    assert np.array_equal(r[1].hash_ids[:312], r[0].hash_ids)  # 20,000 // 64
    # The marker: only the provider's 6,400 cached tokens (100 blocks) stay shared.
    assert np.array_equal(r[2].hash_ids[:100], r[1].hash_ids[:100])
    assert not set(r[2].hash_ids[100:].tolist()) & set(r[1].hash_ids.tolist())
