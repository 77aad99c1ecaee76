"""Trace files written by hand from the published formats: one small agent tree as
Dynamo's agentic Mooncake rows and as OTLP GenAI spans, and one set of Mooncake
session rows both delta and cumulative; and the comparisons of session trees request
by request."""

from __future__ import annotations

from typing import Any

from traces.model import Session

# A root agent (3 calls), a subagent spawned after call 0 and joined by call 2, and a
# background subagent spawned after call 1 that outlives the root. Times in ms.
#   r1 1000-1200, tool 1300-2200, r2 2500-2950, r3 4000-4100
#   child: c1 1500-1900, c2 2000-2600;  bg: b1 3000-4500
AGENTIC_ROWS: list[dict[str, Any]] = [
    {"request_id": "r1", "session_id": "root", "input_length": 200,
     "output_length": 10, "hash_ids": [1, 2, 3, 4], "timestamp": 1000,
     "branches": ["c1"], "prefix_reset": True},
    {"request_id": "c1", "session_id": "child", "input_length": 130,
     "output_length": 5, "hash_ids": [20, 21, 22], "timestamp": 1500,
     "delay": 300, "wait_for": ["r1"], "prefix_reset": True},
    {"request_id": "c2", "session_id": "child", "input_length": 150,
     "output_length": 6, "hash_ids": [20, 21, 23], "timestamp": 2000,
     "delay": 100, "wait_for": ["c1"]},
    {"request_id": "r2", "session_id": "root", "input_length": 260,
     "output_length": 7, "hash_ids": [1, 2, 3, 4, 5], "timestamp": 2500,
     "delay": 400, "tool_wait_ms": 900, "wait_for": ["r1"]},
    {"request_id": "b1", "session_id": "bg", "input_length": 64,
     "output_length": 1, "hash_ids": [30], "timestamp": 3000, "delay": 50,
     "wait_for": ["r2"]},
    {"request_id": "r3", "session_id": "root", "input_length": 330,
     "output_length": 8, "hash_ids": [1, 2, 3, 4, 5, 6], "timestamp": 4000,
     "delay": 1050, "wait_for": ["r2", "c2"], "priority": 3},
]  # fmt: skip

_T0 = 1_700_000_000_000_000_000  # ns


def _attr(key: str, value: object) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def span(
    sid: str,
    parent: str | None,
    op: str,
    start_ms: int,
    end_ms: int,
    trace: str = "t1",
    **attrs: object,
) -> dict[str, Any]:
    """One OTLP span; ``attrs``: gen_ai.* attributes with '_' for '.' after gen_ai."""
    pairs = [_attr("gen_ai.operation.name", op)]
    pairs += [_attr("gen_ai." + k.replace("__", "."), v) for k, v in attrs.items()]
    return {
        "traceId": trace,
        "spanId": sid,
        "parentSpanId": parent or "",
        "name": op,
        "kind": 3 if op == "chat" else 1,
        "startTimeUnixNano": str(_T0 + start_ms * 1_000_000),
        "endTimeUnixNano": str(_T0 + end_ms * 1_000_000),
        "attributes": pairs,
        "status": {},
    }


def chat(sid: str, parent: str, start: int, end: int, n_in: int, n_out: int,
         trace: str = "t1") -> dict[str, Any]:  # fmt: skip
    return span(
        sid, parent, "chat", start, end, trace,
        usage__input_tokens=n_in, usage__output_tokens=n_out,
        request__model="m",
    )  # fmt: skip


OTLP_SPANS: list[dict[str, Any]] = [
    span("a0", None, "invoke_agent", 1000, 4100, agent__name="root",
         conversation__id="root"),
    chat("s1", "a0", 1000, 1200, 200, 10),
    span("x1", "a0", "execute_tool", 1300, 2200, tool__name="Task"),
    span("a1", "x1", "invoke_agent", 1500, 2600, agent__name="child"),
    chat("s2", "a1", 1500, 1900, 130, 5),
    chat("s3", "a1", 2000, 2600, 150, 6),
    chat("s4", "a0", 2500, 2950, 260, 7),
    span("a2", "a0", "invoke_agent", 3000, 4500, agent__name="bg"),
    chat("s5", "a2", 3000, 4500, 64, 1),
    chat("s6", "a0", 4000, 4100, 330, 8),
]  # fmt: skip


def otlp(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An OTLP JSON export (ExportTraceServiceRequest) holding ``spans``."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "agent")]},
                "scopeSpans": [{"scope": {"name": "genai"}, "spans": spans}],
            }
        ]
    }


def shape(s: Session) -> tuple[Any, ...]:
    """A session tree request by request (tokens, times rounded to the ms), and its
    subagents' anchors, joins, spawn times and trees; ids left out."""
    reqs = tuple(
        (r.input_tokens, r.output_tokens, round(r.t_s, 3), round(r.think_time_s, 3))
        for r in s.requests
    )
    subs = tuple(
        (x.anchor_index, x.join_index, round(x.t_s, 3), shape(x.session))
        for x in s.subagents
    )
    return reqs, subs


def canonical_ids(s: Session, full_blocks_only: bool = False) -> list[list[int]]:
    """Every request's hash ids in tree order, renamed by first appearance: equal
    when two trees share the same blocks the same way."""
    names: dict[int, int] = {}
    out = []
    for sess, _, r in s.ordered_requests():
        ids = r.hash_ids.tolist()
        if full_blocks_only:
            ids = ids[: r.input_tokens // sess.block_size]
        out.append([names.setdefault(h, len(names)) for h in ids])
    return out


def same_tree(a: Session, b: Session) -> None:
    """``b`` (read back from agentic Mooncake rows) is the tree ``a`` was."""
    assert b.session_id == a.session_id
    assert shape(b) == shape(a)
    names = [(s.session_id, len(s.requests)) for s, _ in a.walk()]
    assert [(s.session_id, len(s.requests)) for s, _ in b.walk()] == names
    # Written ids cover every started block (Dynamo needs them); the full blocks
    # share exactly as the original's do.
    assert canonical_ids(b, full_blocks_only=True) == canonical_ids(
        a, full_blocks_only=True
    )
    for s, _, r in b.ordered_requests():
        assert r.hash_ids.size * s.block_size >= r.input_tokens


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
