"""Dynamo's agentic Mooncake rows: read into session trees (figures worked out by hand
from the rows), written from Weka and Claude Code traces and read back, bad rows
named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.builders import write_jsonl
from tests.processes import run_cli
from tests.traces.formats import AGENTIC_ROWS, canonical_ids, same_tree
from traces.errors import TraceFormatError
from traces.io import check_trace, read_trace, write_trace
from traces.model import Session, Trace


def _read(tmp_path: Path, rows: list[dict[str, Any]]) -> Trace:
    return read_trace(write_jsonl(tmp_path / "agentic.jsonl", rows))


def test_agentic_rows_make_a_tree_with_a_joined_and_a_background_subagent(
    tmp_path: Path,
) -> None:
    trace = _read(tmp_path, AGENTIC_ROWS)
    assert trace.source_format == "agentic_mooncake"
    (root,) = trace.sessions
    assert root.session_id == "root"
    assert root.start_s == 1.0  # the first row's timestamp, ms → s
    assert root.block_size == 64  # the one size at which every row fits its ids
    assert root.hash_id_scope == "global"
    r1, r2, r3 = root.requests
    assert (r1.input_tokens, r1.output_tokens, r1.t_s, r1.think_time_s) == (
        200, 10, 0.0, 0.0,
    )  # fmt: skip
    # r2: 400 ms delay + 900 ms tool wait after r1; r1 then lasted 2.5-1.3-1.0 s.
    assert (r2.t_s, r2.think_time_s) == (1.5, 1.3)
    assert (r2.tool_wait_s, r2.human_wait_s, r3.tool_wait_s) == (0.9, None, None)
    assert r1.api_time_s == pytest.approx(0.2)
    # r3 waits for r2 and the child: 1,050 ms after the later of them (r2).
    assert (r3.t_s, r3.think_time_s) == (3.0, 1.05)
    assert r2.api_time_s is None  # its successor waits for more than it
    assert r3.extra == {"request_id": "r3", "priority": 3}
    assert r2.hash_ids.tolist() == [1, 2, 3, 4, 5]
    child, bg = root.subagents
    assert (child.agent_id, child.anchor_index, child.join_index) == ("child", 0, 2)
    assert child.t_s == 0.5
    c1, c2 = child.session.requests
    assert (c1.t_s, c1.think_time_s, c2.t_s, c2.think_time_s) == (0.0, 0.3, 0.5, 0.1)
    assert c1.api_time_s == pytest.approx(0.4)
    assert (bg.agent_id, bg.anchor_index, bg.join_index, bg.t_s) == ("bg", 1, None, 2.0)
    assert bg.session.requests[0].think_time_s == 0.05


def test_a_row_without_a_session_is_its_own_session(tmp_path: Path) -> None:
    rows = [
        {"request_id": "a", "input_length": 512, "output_length": 1,
         "hash_ids": [7], "timestamp": 0},
        {"request_id": "b", "input_tokens": 1024, "output_tokens": 2,
         "hash_ids": [7, 8], "created_time": 2000},
    ]  # fmt: skip
    trace = _read(tmp_path, rows)
    assert [s.session_id for s in trace.sessions] == ["request_1", "request_2"]
    assert [s.start_s for s in trace.sessions] == [0.0, 2.0]
    assert trace.sessions[1].requests[0].output_tokens == 2  # the aliases read
    assert trace.sessions[0].block_size == 512


def test_weka_sessions_round_trip_through_agentic_rows(
    tmp_path: Path, weka_dir: Path
) -> None:
    files = ["trace_0003.json", "trace_0010.json"]
    original = Trace(
        sessions=tuple(read_trace(weka_dir / f).sessions[0] for f in files)
    )
    assert any(s.subagents for s in original.sessions)
    out = write_trace(original, tmp_path / "w.jsonl", to="agentic-mooncake")
    back = read_trace(out)
    assert len(back) == len(original)
    for a, b in zip(original.sessions, back.sessions, strict=True):
        same_tree(a, b)
    # Local ids of two trees never meet in the one id space of the file.
    first = {
        h
        for s, _ in back.sessions[0].walk()
        for r in s.requests
        for h in r.hash_ids.tolist()
    }
    second = {
        h
        for s, _ in back.sessions[1].walk()
        for r in s.requests
        for h in r.hash_ids.tolist()
    }
    assert not first & second
    # What Dynamo's reader checks (AgenticTrace::from_agentic_mooncake).
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = {r["request_id"] for r in rows}
    assert len(ids) == len(rows)
    assert all(set(r.get("wait_for", [])) <= ids for r in rows)
    assert all(len(r["hash_ids"]) * 64 >= r["input_length"] for r in rows)


@pytest.mark.parametrize(
    ("change", "where", "reason"),
    [
        ({"wait_for": ["r1", "nope"]}, "request c2, field 'wait_for'",
         "names request 'nope', which no row has"),
        ({"request_id": "c1"}, "request c1, field 'request_id'",
         "duplicate request id"),
        ({"hash_ids": "x"}, "request c2, field 'hash_ids'", "expected a list"),
    ],
)  # fmt: skip
def test_bad_rows_are_named_by_line_and_request(
    tmp_path: Path, change: dict[str, Any], where: str, reason: str
) -> None:
    rows = [dict(r) for r in AGENTIC_ROWS]
    rows[2].update(change)
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    trace, problems = check_trace(path)
    assert trace is None
    (p,) = problems
    assert where in str(p)
    assert reason in str(p)
    assert str(p).startswith(f"{path}:3")
    out = run_cli("trace", "stats", str(path))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert reason in out.stderr


def test_a_wait_cycle_and_an_unmappable_dag_are_problems(tmp_path: Path) -> None:
    rows = [dict(r) for r in AGENTIC_ROWS]
    rows[0]["wait_for"] = ["c2"]  # r1 → c2 → c1 → r1
    del rows[0]["branches"]
    with pytest.raises(TraceFormatError, match="a cycle"):
        _read(tmp_path, rows)
    rows[0]["wait_for"] = ["r3"]  # a later request of its own session
    with pytest.raises(TraceFormatError, match="a later request of its own session"):
        _read(tmp_path, rows)
    rows = [dict(r) for r in AGENTIC_ROWS]
    rows[4]["wait_for"] = ["r2", "c1"]  # spawned from two sessions
    with pytest.raises(TraceFormatError, match="at most one request of another"):
        _read(tmp_path, rows)
    rows = [dict(r) for r in AGENTIC_ROWS]
    rows[2]["wait_for"] = ["c1", "r2"]  # the child waits for its parent's later call
    with pytest.raises(TraceFormatError, match="not a subagent of 'child'"):
        _read(tmp_path, rows)


def _carried(s: Session) -> Session:
    """``s`` as agentic rows can carry it: no subagent that nothing links to its
    parent (spawned before the first request) or that has no request to name."""
    subs = tuple(
        replace(x, session=_carried(x.session))
        for x in s.subagents
        if x.anchor_index >= 0 and len(x.session.requests)
    )
    return replace(s, subagents=subs)


def _timeline(s: Session) -> list[float]:
    """Times as the rows carry them, flat: each request's from its session's first
    (the first row is the session's start) and each gap after it, then per subagent
    its anchor, join (-1: none), spawn time likewise, first gap and timeline."""
    t0 = s.requests[0].t_s
    out = [r.t_s - t0 for r in s.requests] + [r.think_time_s for r in s.requests[1:]]
    for x in s.subagents:
        first = x.session.requests[0]
        join = -1 if x.join_index is None else x.join_index
        out += [x.anchor_index, join, x.t_s + first.t_s - t0, first.think_time_s]
        out += _timeline(x.session)
    return out


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_tree_round_trips_through_agentic_rows(
    tmp_path_factory: pytest.TempPathFactory,
    trace_strategy: st.SearchStrategy[Trace],
    data: st.DataObject,
) -> None:
    drawn = data.draw(trace_strategy)
    block = drawn.sessions[0].block_size
    roots = tuple(  # one block size a file
        _carried(s) for s in drawn.sessions if len(s.requests) and s.block_size == block
    )
    assume(roots)
    original = Trace(sessions=roots)
    out = tmp_path_factory.mktemp("rt") / "t.jsonl"
    back = read_trace(write_trace(original, out, to="agentic-mooncake"))
    assert len(back) == len(original)
    for a, b in zip(original.sessions, back.sessions, strict=True):
        assert [(s.session_id, len(s.requests)) for s, _ in b.walk()] == [
            (s.session_id, len(s.requests)) for s, _ in a.walk()
        ]
        assert b.block_size == block
        assert canonical_ids(b, full_blocks_only=True) == canonical_ids(
            a, full_blocks_only=True
        )
        tokens = [(r.input_tokens, r.output_tokens) for _, _, r in a.ordered_requests()]
        assert [
            (r.input_tokens, r.output_tokens) for _, _, r in b.ordered_requests()
        ] == tokens
        assert _timeline(b) == pytest.approx(_timeline(a), abs=1e-6)
        assert b.start_s == pytest.approx(
            (a.start_s or 0.0) + a.requests[0].t_s, abs=1e-6
        )


def test_tool_waits_round_trip_apart_from_the_delay(tmp_path: Path) -> None:
    trace = _read(tmp_path, AGENTIC_ROWS)
    out = tmp_path / "again.jsonl"
    write_trace(trace, out, to="agentic-mooncake")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    _, r2, r3 = (r for r in rows if r["session_id"] == "root")
    assert (r2["delay"], r2["tool_wait_ms"]) == pytest.approx((400.0, 900.0))
    assert "tool_wait_ms" not in r3  # a gap with no tool part known
    again = read_trace(out)
    assert [r.tool_wait_s for r in again.sessions[0].requests] == [
        None, pytest.approx(0.9), None,
    ]  # fmt: skip
