"""The think gap's parts (tool, human, other) as the importers fill them from agent
logs, the one gap rule the engine and the send-order model share, and the parts
kept by the native formats and `trace stats`."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import (
    claude_assistant,
    claude_user,
    request,
    session,
    trace_of,
    write_jsonl,
)
from tests.processes import run_cli
from traces.errors import TraceFormatError
from traces.gaps import GapRule
from traces.importers import import_logs
from traces.io import read_trace, write_trace
from traces.model import Request, Trace
from traces.sendorder import send_order

_USAGE = (10, 0, 100, 20)


def _tool_use(tid: str, name: str = "Bash") -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": {}}


def _result(t: float, tid: str, **fields: Any) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tid, "content": "ok"}
    return claude_user(t, [block], **fields)


def _parts(trace: Trace) -> list[tuple[float, float | None, float | None]]:
    return [
        (r.think_time_s, r.tool_wait_s, r.human_wait_s)
        for s in trace.sessions
        for r in s.requests
    ]


def test_tool_wait_is_the_union_of_overlapping_tool_spans(tmp_path: Path) -> None:
    log = write_jsonl(
        tmp_path / "s.jsonl",
        [
            claude_user(0.0, "write the script"),  # typed by the user
            claude_assistant(2.0, "m1", [_tool_use("A")], _USAGE),
            claude_assistant(2.5, "m1", [_tool_use("B")], _USAGE),
            _result(4.0, "A"),  # A: 2.0 → 4.0
            _result(6.0, "B"),  # B: 2.5 → 6.0, overlapping A
            claude_user(6.5, "hook output", isMeta=True),  # not typed: other time
            claude_assistant(8.0, "m2", [_tool_use("C")], _USAGE),
            claude_assistant(8.2, "m2", [_tool_use("D")], _USAGE),
            _result(8.6, "D"),  # D: 8.2 → 8.6, inside C
            _result(9.0, "C"),  # C: 8.0 → 9.0
            claude_assistant(10.0, "m3", [{"type": "text", "text": "done"}], _USAGE),
            claude_user(25.0, "now add a test"),  # the user answers after 15 s
            claude_assistant(26.0, "m4", [_tool_use("T", "Task")], _USAGE),
            _result(30.0, "T"),  # a subagent's run: replayed as one, not a tool
            claude_assistant(31.0, "m5", [{"type": "text", "text": "ok"}], _USAGE),
        ],
    )
    trace = import_logs("claude-code", [log], salt=b"k").trace
    # Gaps, by hand: call k starts at its last input, call k - 1 ended at its last
    # record. Tool time: the gap's overlap with the union of the tool spans.
    assert _parts(trace) == [
        (0.0, 0.0, 0.0),
        # [2.5, 6.5]: the union of A and B, [2.0, 6.0], covers 3.5 s (A and B
        # clipped and summed would give 1.5 + 3.5 = 5 s, more than the gap); the
        # meta record's 0.5 s is other time.
        (4.0, 3.5, 0.0),
        # [8.2, 9.0]: the union of C and D, [8.0, 9.0], covers all of it.
        (0.8, 0.8, 0.0),
        # [10.0, 25.0]: waiting for the user.
        (15.0, 0.0, 15.0),
        # [26.0, 30.0]: the Task tool (a subagent) is not tool time.
        (4.0, 0.0, 0.0),
    ]
    reqs = list(trace.sessions[0].requests)
    assert [r.other_wait_s for r in reqs] == [0.0, 0.5, 0.0, 0.0, 4.0]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _gap(a: str, b: str) -> float:
    """``b - a`` for two of a log's timestamps, rounded to the millisecond."""
    return round(_epoch(b) - _epoch(a), 3)


# The shared Claude Code log (tracelab/claude/trace.json), by hand. Call 1 ends at
# its WebSearch tool_use (record 0010, 05:40:31.647); its Bash (0009, 05:40:30.836 →
# 0011, 05:40:31.696) and WebSearch (0010 → 0012, 05:40:50.938) spans overlap and
# cover the whole gap to call 2's start (0012). Call 5 ends at 05:42:23.420 (0029);
# the user types at 05:42:43.333 (0033), which starts call 6.
_D = "2026-06-01T05:"
CLAUDE_TOOL_1 = _gap(_D + "40:31.647+00:00", _D + "40:50.938+00:00")
CLAUDE_HUMAN_5 = _gap(_D + "42:23.420+00:00", _D + "42:43.333+00:00")
# The shared Codex rollout: call 0's token_count (0015, 10:06:05.542) to the last
# of its three exec_command outputs (0018, 10:06:06.704), the calls made at
# 10:06:05.480-.528; call 4's token_count (0040, 10:06:23.374) to the user's next
# message (0045, 10:06:29.707), and call 6's (0057, 10:06:36.854) to 0062
# (10:06:55.216).
_C = "2026-03-21T10:06:"
CODEX_TOOL_1 = _gap(_C + "05.542+00:00", _C + "06.704+00:00")
CODEX_HUMAN_5 = _gap(_C + "23.374+00:00", _C + "29.707+00:00")
CODEX_HUMAN_7 = _gap(_C + "36.854+00:00", _C + "55.216+00:00")


def _check_sums(trace: Trace) -> None:
    """Every gap is tool, human and other time, whole: the parts add up to the
    single gap the importer gave before it had parts (still its think time)."""
    for one in trace.sessions:
        for r in one.requests:
            assert r.tool_wait_s is not None
            assert r.human_wait_s is not None
            assert r.other_wait_s is not None
            total = r.tool_wait_s + r.human_wait_s + r.other_wait_s
            assert total == pytest.approx(r.think_time_s, abs=1e-9)


def test_shared_claude_code_log_tool_and_human_apart(shared_data: Path) -> None:
    log = shared_data / "tracelab" / "claude" / "trace.json"
    trace = import_logs("claude-code", [log], salt=b"k").trace
    parts = _parts(trace)
    assert (CLAUDE_TOOL_1, CLAUDE_HUMAN_5) == (19.291, 19.913)
    assert parts[1] == (CLAUDE_TOOL_1, CLAUDE_TOOL_1, 0.0)
    assert parts[5] == (CLAUDE_HUMAN_5, 0.0, CLAUDE_HUMAN_5)
    _check_sums(trace)
    # Only one human gap in this log: the rest of every gap is tool time.
    humans = [k for k, (_, _, h) in enumerate(parts) if h]
    assert humans == [5]


def test_shared_codex_log_tool_and_human_apart(shared_data: Path) -> None:
    log = shared_data / "tracelab" / "codex" / "trace.json"
    trace = import_logs("codex", [log], salt=b"k").trace
    parts = _parts(trace)
    assert (CODEX_TOOL_1, CODEX_HUMAN_5, CODEX_HUMAN_7) == (1.162, 6.333, 18.362)
    assert parts[1] == (CODEX_TOOL_1, CODEX_TOOL_1, 0.0)
    assert parts[5] == (CODEX_HUMAN_5, 0.0, CODEX_HUMAN_5)
    assert parts[7] == (CODEX_HUMAN_7, 0.0, CODEX_HUMAN_7)
    _check_sums(trace)


def test_tracelab_rows_give_the_logs_parts(shared_data: Path) -> None:
    """The sanitized rows derive from the two logs: the same parts, from their
    ``tools[]`` and ``timing_events``."""
    data = shared_data / "tracelab"
    rows = import_logs("tracelab", [data / "sanitized"], salt=b"k").trace
    by_len = {len(s.requests): s for s in rows.sessions}
    for source, log in (("claude-code", "claude"), ("codex", "codex")):
        own = import_logs(source, [data / log / "trace.json"], salt=b"k").trace
        n = len(own.sessions[0].requests)
        assert _parts(trace_of(by_len[n])) == _parts(own)


def _parted(think: float, tool: float | None, human: float | None = None) -> Request:
    return Request(
        input_tokens=4,
        output_tokens=1,
        hash_ids=np.array([1], dtype=np.int64),
        think_time_s=think,
        api_time_s=1.0,
        tool_wait_s=tool,
        human_wait_s=human,
    )


_REQS = [
    _parted(0.0, 0.0, 0.0),
    _parted(4.0, 3.5, 0.0),
    _parted(0.8, 0.8, 0.0),
    _parted(15.0, 0.0, 15.0),
    _parted(4.0, 0.0, 0.0),
]


def test_gap_rule_scales_tool_time_apart() -> None:
    gaps = GapRule(think_scale=0.0).gaps_s(_REQS)
    assert gaps.tolist() == [0.0, 3.5, 0.8, 0.0, 0.0]  # tool time kept
    gaps = GapRule(think_scale=1.0, tool_scale=0.0).gaps_s(_REQS)
    assert gaps.tolist() == pytest.approx([0.0, 0.5, 0.0, 15.0, 4.0])
    # The cap bounds the non-tool part only.
    gaps = GapRule(think_scale=2.0, think_cap_s=1.0, tool_scale=2.0).gaps_s(_REQS)
    assert gaps.tolist() == pytest.approx([0.0, 8.0, 1.6, 1.0, 1.0])
    # Parts not known: the whole gap is think time, as before the parts existed.
    plain = [_parted(r.think_time_s, None) for r in _REQS]
    gaps = GapRule(think_scale=0.5, think_cap_s=3.0, tool_scale=0.0).gaps_s(plain)
    assert gaps.tolist() == pytest.approx([0.0, 2.0, 0.4, 3.0, 2.0])
    with pytest.raises(ValueError, match="tool scale must be >= 0"):
        GapRule(tool_scale=-1.0)


def test_send_order_keeps_tool_time_at_think_scale_zero() -> None:
    trace = trace_of(session("s", _REQS))
    sent = send_order(trace, concurrency=1, think_scale=0.0)
    # Each request lasts its api_time (1 s); the gaps are the tool parts alone.
    assert [s.send_s for s in sent] == pytest.approx(
        [0.0, 1.0 + 3.5, 5.5 + 0.8, 7.3, 8.3]
    )
    sent = send_order(trace, concurrency=1, think_scale=0.0, tool_scale=0.0)
    assert [s.send_s for s in sent] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".jsonl.gz"])
def test_parts_survive_native_write_and_read(tmp_path: Path, suffix: str) -> None:
    trace = trace_of(session("s", _REQS), session("w", [request(blocks=1)]))
    back = read_trace(write_trace(trace, tmp_path / f"t{suffix}"))
    assert _parts(back) == _parts(trace)
    assert back.sessions[1].requests[0].tool_wait_s is None
    assert back.sessions == trace.sessions


def test_trace_without_parts_writes_none(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    trace = trace_of(session("w", [request(blocks=1, think=2.0)]))
    text = write_trace(trace, tmp_path / "t.jsonl").read_text()
    assert "tool_wait" not in text
    assert "human_wait" not in text
    columns = pq.read_schema(write_trace(trace, tmp_path / "t.parquet")).names
    assert "tool_wait_s" not in columns
    parted = trace_of(session("s", _REQS))
    columns = pq.read_schema(write_trace(parted, tmp_path / "p.parquet")).names
    assert {"tool_wait_s", "human_wait_s"} <= set(columns)


def test_parts_past_the_gap_are_a_named_problem(tmp_path: Path) -> None:
    row = {"t": 0, "type": "n", "in": 0, "out": 1, "hash_ids": []}
    doc = {
        "id": "s",
        "block_size": 4,
        "requests": [
            {**row, "think_time": 1.0, "tool_wait": 0.8, "human_wait": 0.5},
            {**row, "think_time": 1.0, "tool_wait": -1},
        ],
    }
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(doc) + "\n" + json.dumps({**doc, "id": "u"}) + "\n")
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    text = "\n".join(map(str, err.value.problems))
    assert "request 0, field 'tool_wait'" in text
    assert "tool_wait + human_wait (0.8 + 0.5) exceed think_time (1)" in text
    assert "request 1, field 'tool_wait': must be >= 0 (got -1)" in text
    # A trace store's rows get the same check.
    store = write_trace(
        trace_of(session("s", [_parted(1.0, 0.8, 0.5)])), tmp_path / "bad.parquet"
    )
    with pytest.raises(TraceFormatError) as err:
        read_trace(store)
    (problem,) = err.value.problems
    assert problem.field == "tool_wait"
    assert problem.reason == "tool_wait + human_wait (0.8 + 0.5) exceed think_time (1)"


def test_cli_trace_stats_and_convert_keep_the_parts(
    shared_data: Path, tmp_path: Path
) -> None:
    log = shared_data / "tracelab" / "claude" / "trace.json"
    imported = tmp_path / "c.jsonl"
    done = run_cli("trace", "import", "claude-code", str(log), "-o", str(imported))
    assert done.returncode == 0, done.stderr
    store = tmp_path / "c.parquet"
    done = run_cli("trace", "convert", str(imported), "-o", str(store))
    assert done.returncode == 0, done.stderr
    assert _parts(read_trace(store)) == _parts(read_trace(imported))
    stats = run_cli("trace", "stats", str(store), "--json")
    assert stats.returncode == 0, stats.stderr
    d = json.loads(stats.stdout)
    parts = _parts(read_trace(store))[1:]  # the gaps: after each session's first
    tools = [tool or 0.0 for _, tool, _ in parts]
    humans = [human or 0.0 for _, _, human in parts]
    assert d["gaps_with_parts"] == 9
    assert d["tool_wait_s"]["max"] == 21.467
    assert d["human_wait_s"]["max"] == CLAUDE_HUMAN_5
    assert d["non_tool_wait_s"]["max"] == CLAUDE_HUMAN_5
    assert d["other_wait_s"]["max"] == 0.0
    assert d["tool_time_share"] == pytest.approx(
        sum(tools) / sum(think for think, _, _ in parts)
    )
    assert d["tool_wait_s"]["mean"] == pytest.approx(sum(tools) / 9)
    assert d["human_wait_s"]["mean"] == pytest.approx(sum(humans) / 9)
    curve = run_cli(
        "trace", "cache-curve", str(store), "--think-scale", "0", "--tool-scale",
        "0.5", "--json",
    )  # fmt: skip
    assert curve.returncode == 0, curve.stderr
    assert json.loads(curve.stdout)["tool_scale"] == 0.5
    table = run_cli("trace", "stats", str(store))
    assert "known for 9 gaps: tool time" in table.stdout
    assert "  tool wait (s)" in table.stdout
    weka = run_cli("trace", "stats", str(shared_data / "weka" / "trace_0003.json"))
    assert "gap parts        not known (one think gap a request)" in weka.stdout
    d = json.loads(
        run_cli(
            "trace", "stats", str(shared_data / "weka" / "trace_0003.json"), "--json"
        ).stdout
    )
    assert d["gaps_with_parts"] == 0
    assert d["tool_time_share"] is None


@pytest.mark.parametrize(
    "rule",
    [GapRule(), GapRule(0.1), GapRule(0.3, 2.0, 0.5), GapRule(0.0, None, 3.0)],
    ids=str,
)
def test_one_gap_is_the_columns_arithmetic_on_one_value(rule: GapRule) -> None:
    """``gap_s`` (short sessions, value by value) gives the very floats of
    ``gaps_s`` (the columns)."""
    rng = np.random.default_rng(0)
    reqs = []
    for think in [0.0, 1e-4, 0.5, 3.0, *rng.uniform(0, 10, 40).tolist()]:
        for tool in (None, 0.0, think / 3, think):
            reqs.append(replace(request([1]), think_time_s=think, tool_wait_s=tool))
    want = rule.gaps_s(tuple(reqs)).tolist()
    assert [rule.gap_s(r.think_time_s, r.tool_wait_s) for r in reqs] == want
