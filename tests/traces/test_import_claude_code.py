"""Importing Claude Code session logs: calls, usage, gaps, prefixes, subagents, live
logs. The expected numbers are worked out by hand from the shared log's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import claude_assistant, claude_user, iso, record_view, write_jsonl
from traces.errors import TraceError
from traces.importers import import_logs
from traces.importers.claude_code import NO_USAGE, SYNTHETIC
from traces.importers.logfile import MALFORMED_LINE, PARTIAL_LAST_LINE
from traces.io import read_trace, write_trace
from traces.model import Session

SALT = b"test-salt"

# One row per assistant message.id: input is input_tokens + cache_creation_input_tokens
# + cache_read_input_tokens, then output_tokens, then the cached part (cache_read) and
# the cache write (cache_creation), as the records give them.
EXPECTED = [
    (2892 + 2163 + 27217, 931, 27217, 2163),  # records 0007-0010 (msg ...edee3)
    (2 + 6358 + 29380, 1016, 29380, 6358),  # records 0013-0015
    (2 + 2852 + 35738, 2475, 35738, 2852),  # records 0021-0023
    (2 + 2539 + 38590, 117, 38590, 2539),  # record 0026
    (2 + 458 + 41129, 1275, 41129, 458),  # records 0028-0029
    (2 + 1287 + 41587, 273, 41587, 1287),  # records 0038-0040
    (131 + 1896 + 42874, 232, 42874, 1896),  # records 0043-0045
    (2 + 507 + 44770, 2162, 44770, 507),  # records 0047-0049
    (2 + 2229 + 45277, 90, 45277, 2229),  # record 0055
    (2 + 797 + 47506, 852, 47506, 797),  # records 0057-0058
]


@pytest.fixture(scope="module")
def claude_log(shared_data: Path) -> Path:
    return shared_data / "tracelab" / "claude" / "trace.json"


def _one(path: Path | list[Path], **kw: Any) -> Session:
    res = import_logs("claude-code", path if isinstance(path, list) else [path], **kw)
    (session,) = res.trace.sessions
    return session


def test_import_claude_code_calls_equal_the_logs_usage(claude_log: Path) -> None:
    session = _one(claude_log, salt=SALT)
    got = [
        (
            r.input_tokens,
            r.output_tokens,
            r.extra["provider_cached_tokens"],
            r.extra["provider_cache_write_tokens"],
        )
        for r in session.requests
    ]
    assert got == EXPECTED
    messages = {
        rec["message"]["id"]
        for rec in record_view(claude_log)
        if rec["type"] == "assistant"
    }
    assert len(session.requests) == len(messages) == 10


def test_import_claude_code_gaps_come_from_timestamps(claude_log: Path) -> None:
    reqs = _one(claude_log, salt=SALT).requests
    # Call 0: user message 05:40:20.151 (0004) → last record 05:40:31.647 (0010).
    assert reqs[0].t_s == 0.0
    assert reqs[0].api_time_s == pytest.approx(31.647 - 20.151)
    # Call 1: tool gap until the last tool result 05:40:50.938 (0012), then the
    # call until 05:41:04.862 (0015).
    assert reqs[1].think_time_s == pytest.approx(50.938 - 31.647)
    assert reqs[1].api_time_s == pytest.approx(64.862 - 50.938)
    assert reqs[1].t_s == pytest.approx(50.938 - 20.151)
    # Call 5: the user's second message 05:42:43.333 (0033) after the end of call 4
    # at 05:42:23.420 (0029) is a think gap.
    assert reqs[5].think_time_s == pytest.approx(43.333 - 23.420)
    assert reqs[5].input_types == ("text",)
    assert reqs[1].input_types == ("tool_result",)
    assert reqs[0].output_types == ("text", "thinking", "tool_use")
    assert [r.stop for r in reqs[3:5]] == ["tool_use", "end_turn"]


def test_import_claude_code_each_call_extends_its_predecessor(claude_log: Path) -> None:
    session = _one(claude_log, salt=SALT)
    assert session.block_size == 64
    assert session.hash_id_scope == "local"
    assert session.extra["hash_rule"] == "context-growth"
    seen: set[int] = set()
    prev = None
    for r in session.requests:
        assert r.hash_ids.size == r.input_tokens // 64
        if prev is not None:
            assert np.array_equal(r.hash_ids[: prev.hash_ids.size], prev.hash_ids)
            new = r.hash_ids[prev.hash_ids.size :]
            assert not seen & set(new.tolist())
        seen |= set(r.hash_ids.tolist())
        prev = r


def test_import_claude_code_block_size_option(claude_log: Path) -> None:
    session = _one(claude_log, salt=SALT, block_size=16)
    assert session.block_size == 16
    assert [r.hash_ids.size for r in session.requests] == [
        i // 16 for i, *_ in EXPECTED
    ]


def test_import_claude_code_ids_are_keyed_by_a_secret_salt(claude_log: Path) -> None:
    a = _one(claude_log, salt=b"one").session_id
    assert a == _one(claude_log, salt=b"one").session_id
    assert a != _one(claude_log, salt=b"two").session_id
    assert a != _one(claude_log).session_id  # a random salt per import
    assert a.startswith("claude-code-")


def test_import_claude_code_live_log_skips_what_it_cannot_use(
    claude_log: Path, tmp_path: Path
) -> None:
    records = record_view(claude_log)
    lines = [json.dumps(r) for r in records[:58]]
    lines.insert(20, "{not json")
    # The log is still being written: record 0058 is cut in the middle.
    text = "\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2]
    log = tmp_path / "live.jsonl"
    log.write_text(text)
    res = import_logs("claude-code", [log], salt=SALT)
    (session,) = res.trace.sessions
    # Record 0057 still carries the last message's usage: ten calls.
    assert [r.input_tokens for r in session.requests] == [e[0] for e in EXPECTED]
    skipped = res.report.skipped
    assert skipped[PARTIAL_LAST_LINE].count == 1
    assert skipped[PARTIAL_LAST_LINE].first == f"{log}:{len(lines)}"
    assert skipped[MALFORMED_LINE].first == f"{log}:21"
    assert session.extra["skipped_records"] == {MALFORMED_LINE: 1, PARTIAL_LAST_LINE: 1}


def test_import_claude_code_skips_synthetic_and_usage_less_messages(
    tmp_path: Path,
) -> None:
    synthetic = claude_assistant(
        2.0, "x", [{"type": "text", "text": "err"}], (0, 0, 0, 0)
    )
    synthetic["message"]["model"] = "<synthetic>"
    no_usage = claude_assistant(4.0, "m2", [], (1, 0, 0, 1))
    del no_usage["message"]["usage"]
    log = write_jsonl(
        tmp_path / "s.jsonl",
        [
            claude_user(0.0, "hi"),
            claude_assistant(
                1.0, "m1", [{"type": "text", "text": "a"}], (100, 0, 0, 5)
            ),
            synthetic,
            claude_user(3.0, "again"),
            no_usage,
        ],
    )
    res = import_logs("claude-code", [log], salt=SALT)
    assert [r.input_tokens for r in res.trace.sessions[0].requests] == [100]
    assert res.report.skipped[SYNTHETIC].count == 1
    assert res.report.skipped[NO_USAGE].count == 1


def test_import_claude_code_split_message_counts_once_with_its_fullest_usage(
    tmp_path: Path,
) -> None:
    think = {"type": "thinking", "thinking": "", "signature": "s"}
    text = {"type": "text", "text": "hello"}
    # Streamed records of one message: an early usage snapshot, then the final one.
    log = write_jsonl(
        tmp_path / "s.jsonl",
        [
            claude_user(0.0, "hi"),
            claude_assistant(1.0, "m1", [think], (3, 500, 9000, 1), stop=None),
            claude_assistant(2.0, "m1", [text], (3, 500, 9000, 240), stop="end_turn"),
        ],
    )
    (r,) = _one(log, salt=SALT).requests
    assert (r.input_tokens, r.output_tokens, r.stop) == (9503, 240, "end_turn")
    assert r.output_types == ("text", "thinking")
    assert r.api_time_s == pytest.approx(2.0)


def _task(t: float, msg: str, use_id: str, prompt: str, **kw: Any) -> dict[str, Any]:
    block = {
        "type": "tool_use",
        "id": use_id,
        "name": "Task",
        "input": {"prompt": prompt, "subagent_type": "Explore", "description": "d"},
    }
    return claude_assistant(t, msg, [block], (10, 0, 6000, 50), **kw)


def _child(t0: float, **kw: Any) -> list[dict[str, Any]]:
    read = {
        "type": "tool_use",
        "id": "tc1",
        "name": "Read",
        "input": {"file_path": "x"},
    }
    done = {"type": "tool_result", "tool_use_id": "tc1", "content": "..."}
    text = {"type": "text", "text": "found it"}
    return [
        claude_user(t0, "explore the repo", sidechain=True, **kw),
        claude_assistant(
            t0 + 0.5, "c1", [read], (5, 0, 3000, 20), sidechain=True, **kw
        ),
        claude_user(t0 + 2.5, [done], sidechain=True, **kw),
        claude_assistant(
            t0 + 3.5, "c2", [text], (5, 0, 3300, 30), sidechain=True, **kw
        ),
    ]


def _result(t: float, *, agent: str | None) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "status": "completed",
        "totalDurationMs": 3500,
        "totalTokens": 6400,
        "totalToolUseCount": 1,
    }
    if agent is not None:
        stats["agentId"] = agent
    block = {"type": "tool_result", "tool_use_id": "tu1", "content": "done"}
    return claude_user(t, [block], toolUseResult=stats)


def _main(*, agent: str | None, last_call: bool = True) -> list[dict[str, Any]]:
    recs = [
        claude_user(0.0, "build it"),
        claude_assistant(
            1.0, "m1", [{"type": "text", "text": "ok"}], (10, 0, 6000, 50)
        ),
        _task(2.0, "m1", "tu1", "explore the repo"),
        _result(7.0, agent=agent),
    ]
    if last_call:
        text = [{"type": "text", "text": "done"}]
        recs.append(
            claude_assistant(8.0, "m2", text, (10, 0, 6100, 40), stop="end_turn")
        )
    return recs


def _check_spawn(session: Session, *, join: int | None) -> None:
    (sub,) = session.subagents
    assert (sub.anchor_index, sub.join_index) == (0, join)
    assert sub.agent_id == "agent_001"
    assert sub.session.session_id == f"{session.session_id}/agent_001"
    assert sub.t_s == pytest.approx(2.5)
    assert sub.subagent_type == "Explore"
    child = sub.session
    assert [r.input_tokens for r in child.requests] == [3005, 3305]
    assert child.requests[0].api_time_s == pytest.approx(0.5)
    assert child.requests[1].think_time_s == pytest.approx(2.0)
    assert child.requests[1].api_time_s == pytest.approx(1.0)
    # A subagent's own context: its first call is all new blocks.
    parent_ids = {int(i) for r in session.requests for i in r.hash_ids}
    assert not parent_ids & set(child.requests[0].hash_ids.tolist())


def test_import_claude_code_subagent_file_becomes_a_spawn(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "sess-1.jsonl", _main(agent="a1"))
    write_jsonl(
        tmp_path / "sess-1" / "subagents" / "agent-a1.jsonl", _child(2.5, agent="a1")
    )
    res = import_logs("claude-code", [tmp_path], salt=SALT)
    (session,) = res.trace.sessions
    assert [r.input_tokens for r in session.requests] == [6010, 6110]
    assert session.requests[1].think_time_s == pytest.approx(5.0)
    _check_spawn(session, join=1)
    sub = session.subagents[0]
    assert (sub.status, sub.duration_ms, sub.total_tokens, sub.tool_use_count) == (
        "completed",
        3500,
        6400,
        1,
    )
    assert res.report.subagent_sessions == 1
    assert res.report.calls == 4


def test_import_claude_code_inline_sidechain_links_by_prompt(tmp_path: Path) -> None:
    # Older Claude Code: the sidechain sits in the session file, without agentId,
    # as one parentUuid chain.
    child = _child(2.5)
    prev = None
    for i, rec in enumerate(child):
        rec["uuid"], rec["parentUuid"] = f"side-{i}", prev
        prev = rec["uuid"]
    main = _main(agent=None)
    log = write_jsonl(tmp_path / "s.jsonl", [*main[:3], *child, *main[3:]])
    (session,) = import_logs("claude-code", [log], salt=SALT).trace.sessions
    _check_spawn(session, join=1)


def test_import_claude_code_subagent_of_the_last_call_runs_in_background(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "s.jsonl", _main(agent="a1", last_call=False))
    write_jsonl(tmp_path / "agent-a1.jsonl", _child(2.5, agent="a1"))
    (session,) = import_logs("claude-code", [tmp_path], salt=SALT).trace.sessions
    _check_spawn(session, join=None)


def test_import_claude_code_subagent_without_its_parent_is_a_root(
    tmp_path: Path,
) -> None:
    log = write_jsonl(tmp_path / "agent-a1.jsonl", _child(2.5, agent="a1"))
    res = import_logs("claude-code", [log], salt=SALT)
    assert len(res.trace.sessions) == 1
    assert not res.trace.sessions[0].subagents


def test_import_claude_code_compaction_starts_a_new_prefix(tmp_path: Path) -> None:
    text = [{"type": "text", "text": "t"}]
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "sessionId": "sess-1",
        "timestamp": iso(4.0),
    }
    log = write_jsonl(
        tmp_path / "s.jsonl",
        [
            claude_user(0.0, "go"),
            claude_assistant(1.0, "m1", text, (100, 0, 9900, 10)),  # 10,000 in
            claude_user(2.0, "more"),
            claude_assistant(3.0, "m2", text, (100, 0, 11900, 10)),  # 12,000 in
            boundary,
            claude_user(5.0, "summary", isCompactSummary=True),
            claude_assistant(6.0, "m3", text, (2000, 10000, 3000, 10)),  # 15,000 in
            claude_user(7.0, "next"),
            claude_assistant(8.0, "m4", text, (1720, 2000, 1280, 10)),  # 5,000 in
        ],
    )
    r = import_logs("claude-code", [log], salt=SALT).trace.sessions[0].requests
    # Growth: call 1 keeps call 0's 156 blocks (10,000 // 64).
    assert np.array_equal(r[1].hash_ids[:156], r[0].hash_ids)
    # After the compaction marker the context grew, yet only the 3,000 cached tokens
    # (46 blocks) stay shared; the rest are new.
    assert np.array_equal(r[2].hash_ids[:46], r[1].hash_ids[:46])
    assert not set(r[2].hash_ids[46:].tolist()) & set(r[1].hash_ids.tolist())
    # No marker, but the context fell below 80%: a reset keeping 1,280 cached
    # tokens (20 blocks).
    assert np.array_equal(r[3].hash_ids[:20], r[2].hash_ids[:20])
    assert not set(r[3].hash_ids[20:].tolist()) & set(r[2].hash_ids.tolist())


def test_import_claude_code_round_trips_through_both_formats(
    claude_log: Path, tmp_path: Path
) -> None:
    write_jsonl(tmp_path / "logs" / "s.jsonl", _main(agent="a1"))
    write_jsonl(tmp_path / "logs" / "agent-a1.jsonl", _child(2.5, agent="a1"))
    trace = import_logs("claude-code", [claude_log, tmp_path / "logs"], salt=SALT).trace
    assert len(trace.sessions) == 2
    for name in ("t.jsonl", "t.parquet"):
        back = read_trace(write_trace(trace, tmp_path / name))
        assert back.sessions == trace.sessions
    # The imports' own clock: the first session starts at 0, none before it.
    assert min(s.start_s or 0.0 for s in trace.sessions) == 0.0


def test_import_claude_code_tokenizer_shares_blocks_of_equal_text(
    shared_data: Path, tmp_path: Path
) -> None:
    tok_path = shared_data.parent / "models" / "tiny-random-llama" / "tokenizer.json"
    if not tok_path.is_file():
        pytest.skip(f"no tokenizer at {tok_path}")
    from tokenizers import Tokenizer

    prompt = " ".join(f"step {i} of the shared system prompt;" for i in range(60))
    other = " ".join(f"a different opening, line {i};" for i in range(60))
    for t0, name, first in ((0, "a", prompt), (10, "b", prompt), (20, "c", other)):
        write_jsonl(
            tmp_path / f"{name}.jsonl",
            [
                claude_user(t0, first, session=name),
                claude_assistant(
                    t0 + 1, f"{name}1", [], (4000, 0, 0, 10), session=name
                ),
                claude_user(t0 + 2, "and then", session=name),
                claude_assistant(
                    t0 + 3, f"{name}2", [], (4100, 0, 0, 10), session=name
                ),
            ],
        )
    res = import_logs("claude-code", [tmp_path], salt=SALT, tokenizer=tok_path)
    by_first = {s.requests[0].hash_ids[0]: s for s in res.trace.sessions}
    assert len(by_first) == 2  # a and b start alike, c does not
    a, b, c = res.trace.sessions
    n = len(Tokenizer.from_file(str(tok_path)).encode(prompt, add_special_tokens=False))
    shared = n // 64
    assert shared >= 3
    ra, rb, rc = a.requests[0].hash_ids, b.requests[0].hash_ids, c.requests[0].hash_ids
    assert np.array_equal(ra[:shared], rb[:shared])
    # Past the visible text comes each session's own hidden content.
    assert ra[shared] != rb[shared]
    assert not set(rc.tolist()) & set(ra.tolist())
    for s in (a, b, c):
        assert s.hash_id_scope == "global"
        assert s.extra["hash_rule"] == res.report.hash_rule
        assert s.extra["hash_rule"].startswith("token-ids:")
        # Each call still extends its predecessor.
        r0, r1 = s.requests
        assert np.array_equal(r1.hash_ids[: r0.hash_ids.size], r0.hash_ids)
    back = read_trace(write_trace(res.trace, tmp_path / "t.parquet"))
    assert back.sessions == res.trace.sessions


def test_import_claude_code_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file or folder"):
        import_logs("claude-code", [tmp_path / "missing"])
    with pytest.raises(TraceError, match="matches no file"):
        import_logs("claude-code", [str(tmp_path / "*.jsonl")])
    empty = write_jsonl(tmp_path / "e.jsonl", [claude_user(0.0, "hi")])
    with pytest.raises(TraceError, match="no claude-code LLM calls found"):
        import_logs("claude-code", [empty])
    with pytest.raises(TraceError, match="unknown log source"):
        import_logs("cursor", [empty])
