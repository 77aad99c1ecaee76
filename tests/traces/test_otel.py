"""OpenTelemetry GenAI spans (OTLP JSON) read into session trees: the same tree as the
agentic Mooncake rows of one agent run, conversations across traces, broken span
trees named."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tests.builders import write_jsonl
from tests.processes import run_cli
from tests.traces.formats import AGENTIC_ROWS, OTLP_SPANS, chat, otlp, shape, span
from traces.io import check_trace, read_trace


def _write(path: Path, doc: object) -> Path:
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return path


def test_spans_and_agentic_rows_of_one_run_read_into_the_same_tree(
    tmp_path: Path,
) -> None:
    spans = read_trace(_write(tmp_path / "spans.json", otlp(OTLP_SPANS)))
    rows = read_trace(write_jsonl(tmp_path / "rows.jsonl", AGENTIC_ROWS))
    assert spans.source_format == "otlp"
    (a,), (b,) = spans.sessions, rows.sessions
    assert shape(a) == shape(b)
    assert a.session_id == "root"  # gen_ai.conversation.id
    assert [x.agent_id for x in a.subagents] == ["child", "bg"]  # gen_ai.agent.name
    assert a.start_s == 0.0
    r1 = a.requests[0]
    assert (r1.api_time_s, r1.model) == (pytest.approx(0.2), "m")
    # No prompt content in spans: each call's prompt extends its agent's previous
    # one (context growth), 64-token blocks; a subagent starts its own.
    ids = [r.hash_ids.size for r in a.requests]
    assert ids == [200 // 64, 260 // 64, 330 // 64]
    assert a.requests[2].hash_ids[:4].tolist() == a.requests[1].hash_ids.tolist()
    child = a.subagents[0].session
    assert not set(child.requests[0].hash_ids.tolist()) & set(
        a.requests[0].hash_ids.tolist()
    )


def test_traces_of_one_conversation_are_one_session_in_time_order(
    tmp_path: Path,
) -> None:
    turn2 = [
        span("b0", None, "invoke_agent", 9000, 9500, trace="t2",
             conversation__id="root"),
        chat("z1", "b0", 9000, 9500, 400, 3, trace="t2"),
    ]  # fmt: skip
    other = [chat("y1", None, 500, 600, 100, 2, trace="t3")]
    # The collector's file exporter: one export a line, later turns first.
    path = tmp_path / "spans.jsonl"
    path.write_text(
        "\n".join(json.dumps(otlp(s)) for s in (turn2, other, OTLP_SPANS)) + "\n"
    )
    trace = read_trace(path)
    by_id = {s.session_id: s for s in trace.sessions}
    assert set(by_id) == {"root", "t3"}
    root = by_id["root"]
    assert [r.input_tokens for r in root.requests] == [200, 260, 330, 400]
    # The user's turn comes 4.9 s after the last call of the first one ended.
    assert root.requests[3].t_s == pytest.approx(8.0)
    assert root.requests[3].think_time_s == pytest.approx(4.9)
    assert by_id["t3"].start_s == 0.0
    assert root.start_s == pytest.approx(0.5)


def test_a_broken_span_tree_is_named_by_its_span(tmp_path: Path) -> None:
    spans = [dict(s) for s in OTLP_SPANS]
    spans[4] = {**spans[4], "parentSpanId": "ffff"}
    path = _write(tmp_path / "broken.json", otlp(spans))
    trace, problems = check_trace(path)
    assert trace is None
    (p,) = problems
    assert str(p) == (
        f"{path}, session t1, field 'parentSpanId': span s2: parent span ffff is "
        "not in the export (a broken span tree)"
    )
    out = run_cli("trace", "validate", str(path))
    assert out.returncode == 1
    assert "span s2: parent span ffff" in out.stdout
    out = run_cli("trace", "stats", str(path))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "span s2" in out.stderr


def test_a_call_without_usage_is_named(tmp_path: Path) -> None:
    spans = [dict(s) for s in OTLP_SPANS]
    spans[1] = span("s1", "a0", "chat", 1000, 1200, usage__input_tokens=200)
    trace, problems = check_trace(_write(tmp_path / "x.json", otlp(spans)))
    assert trace is None
    (p,) = problems
    assert "field 'gen_ai.usage.output_tokens': span s1:" in str(p)
    assert "expected a token count, got None" in str(p)


def test_agents_side_by_side_are_sessions_and_other_traces_are_left_out(
    tmp_path: Path,
) -> None:
    spans = [
        # A workflow running two agents one after the other, with no call itself.
        span("w", None, "invoke_workflow", 0, 900, trace="t9"),
        span("p", "w", "invoke_agent", 0, 400, trace="t9", agent__name="plan"),
        chat("p1", "p", 0, 400, 100, 10, trace="t9"),
        span("c", "w", "invoke_agent", 500, 900, trace="t9", agent__name="code"),
        chat("c1", "c", 500, 700, 120, 20, trace="t9"),
        chat("c2", "c", 800, 900, 150, 5, trace="t9"),
        # An HTTP server's trace in the same export: no GenAI call.
        {**span("h", None, "GET", 0, 5, trace="t8"), "attributes": []},
    ]
    trace = read_trace(_write(tmp_path / "w.json", otlp(spans)))
    assert [(s.session_id, len(s.requests)) for s in trace.sessions] == [
        ("t9/p", 1),
        ("t9/c", 2),
    ]
    assert [s.start_s for s in trace.sessions] == [0.0, 0.5]
    assert trace.sessions[1].requests[1].think_time_s == pytest.approx(0.1)
    only_http = _write(tmp_path / "h.json", otlp([spans[-1]]))
    _, problems = check_trace(only_http)
    assert [p.reason for p in problems] == [
        "no LLM call spans (gen_ai.operation.name chat, text_completion or "
        "generate_content)"
    ]


def test_a_gaps_tool_part_is_the_union_of_its_agents_tool_spans(
    tmp_path: Path,
) -> None:
    # Two overlapping tools in the root's gap before s6 (2,950-4,000 ms): 3,100-3,500
    # and 3,300-3,700 cover 600 ms; a child's tool counts in the child's gap only;
    # the Task tool runs the child agent, so it is not tool time.
    extra = [
        span("x2", "a0", "execute_tool", 3100, 3500, tool__name="Bash"),
        span("x3", "a0", "execute_tool", 3300, 3700, tool__name="Read"),
        span("x4", "a1", "execute_tool", 1920, 1980, tool__name="Grep"),
    ]
    (root,) = read_trace(
        _write(tmp_path / "spans.json", otlp([*OTLP_SPANS, *extra]))
    ).sessions
    assert [r.tool_wait_s for r in root.requests] == [
        0.0, 0.0, pytest.approx(0.6),
    ]  # fmt: skip
    assert root.requests[2].think_time_s == pytest.approx(1.05)  # 600 ms of it tools
    child = root.subagents[0].session
    assert [r.tool_wait_s for r in child.requests] == [0.0, pytest.approx(0.06)]
    # An export without tool spans does not know the parts.
    (bare,) = read_trace(_write(tmp_path / "bare.json", otlp(OTLP_SPANS))).sessions
    assert bare.requests[2].tool_wait_s == 0.0  # the Task span: tools are known
    no_tools = [
        span("x1", "a0", "step", 1300, 2200) if s["spanId"] == "x1" else s
        for s in OTLP_SPANS
    ]
    (none,) = read_trace(_write(tmp_path / "none.json", otlp(no_tools))).sessions
    assert [r.tool_wait_s for r in none.requests] == [None, None, None]
