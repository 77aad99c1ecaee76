"""Alibaba's Qwen-Bailian usage traces (``qwen_traceA_blksz_16.jsonl`` and siblings) →
a Trace. See docs/traces.md#formats."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from traces.errors import Problem, TraceFormatError
from traces.model import MAX_TOKENS, HashIds, Request, Session, Trace
from traces.source import read_file_bytes

BAILIAN_BLOCK_SIZE = 16
_KNOWN = frozenset(
    {
        "chat_id",
        "parent_chat_id",
        "timestamp",
        "input_length",
        "output_length",
        "type",
        "turn",
        "hash_ids",
    }
)


def looks_like_bailian(obj: object) -> bool:
    """True when ``obj`` (one parsed line) is a Bailian request: it has ``chat_id``,
    ``parent_chat_id`` and ``turn`` besides the Mooncake-like length fields."""
    return (
        isinstance(obj, dict)
        and {
            "chat_id",
            "parent_chat_id",
            "turn",
            "input_length",
        }
        <= obj.keys()
    )


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(slots=True)
class _Row:
    chat_id: int | str
    parent: int | str | None
    ts: float
    input_tokens: int
    output_tokens: int
    hash_ids: HashIds
    kind: str | None
    extra: dict[str, Any]


@dataclass(slots=True)
class _Conversation:
    rows: list[_Row] = field(default_factory=list)


def _parse(path: Path, line: int, obj: Any, problems: list[Problem]) -> _Row | None:
    def bad(fld: str | None, reason: str) -> None:
        problems.append(Problem(path=path, line=line, field=fld, reason=reason))

    if not isinstance(obj, dict):
        bad(None, f"expected a JSON object, got {type(obj).__name__}")
        return None
    n = len(problems)
    chat = obj.get("chat_id")
    if not (_int(chat) is not None or (isinstance(chat, str) and chat)):
        bad("chat_id", f"expected an integer id, got {chat!r:.40}")
    parent = obj.get("parent_chat_id")
    if not (_int(parent) is not None or isinstance(parent, str) or parent is None):
        bad(
            "parent_chat_id",
            f"expected an integer id (-1 for none), got {parent!r:.40}",
        )
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not ts >= 0:
        bad("timestamp", f"expected seconds >= 0, got {ts!r:.40}")
    lengths: dict[str, int] = {}
    for key in ("input_length", "output_length"):
        v = _int(obj.get(key))
        if v is None or not 0 <= v <= MAX_TOKENS:
            bad(
                key,
                f"expected an integer in [0, {MAX_TOKENS:,}], got {obj.get(key)!r:.40}",
            )
            v = 0
        lengths[key] = v or 0
    turn = obj.get("turn")
    if turn is not None and (_int(turn) is None or turn < 0):
        bad("turn", f"expected a non-negative integer, got {turn!r:.40}")
    kind = obj.get("type")
    if kind is not None and not isinstance(kind, str):
        bad("type", f"expected a string, got {kind!r:.40}")
    raw = obj.get("hash_ids")
    ids = np.zeros(0, dtype=np.int64)
    if not isinstance(raw, list) or not all(
        _int(x) is not None and -(2**63) <= x < 2**63 for x in raw
    ):
        bad("hash_ids", "expected a list of integers")
    else:
        ids = np.asarray(raw, dtype=np.int64)
        n_in = lengths["input_length"]
        full, ceil = n_in // BAILIAN_BLOCK_SIZE, -(-n_in // BAILIAN_BLOCK_SIZE)
        if ids.size not in (full, ceil):
            bad(
                "hash_ids",
                f"{ids.size} blocks do not fit input_length={n_in} with "
                f"{BAILIAN_BLOCK_SIZE}-token blocks (expected {ceil})",
            )
    if len(problems) > n:
        return None
    assert isinstance(ts, int | float)
    assert isinstance(chat, int | str)
    extra = {k: v for k, v in obj.items() if k not in _KNOWN}
    if turn is not None:
        extra["turn"] = turn
    root = parent is None or parent == -1 or parent == "-1"
    return _Row(
        chat_id=chat,
        parent=None if root else parent,
        ts=float(ts),
        input_tokens=lengths["input_length"],
        output_tokens=lengths["output_length"],
        hash_ids=ids,
        kind=kind if isinstance(kind, str) and kind else None,
        extra=extra,
    )


def _sessions(rows: list[_Row]) -> list[Session]:
    convs: list[_Conversation] = []
    where: dict[int | str, _Conversation] = {}
    for row in rows:
        conv = where.get(row.parent) if row.parent is not None else None
        if conv is None or conv.rows[-1].chat_id != row.parent:
            conv = _Conversation()
            convs.append(conv)
        conv.rows.append(row)
        where[row.chat_id] = conv
    out = []
    for conv in convs:
        start = conv.rows[0].ts
        reqs = []
        prev = start
        for r in conv.rows:
            reqs.append(
                Request(
                    input_tokens=r.input_tokens,
                    output_tokens=r.output_tokens,
                    hash_ids=r.hash_ids,
                    t_s=r.ts - start,
                    think_time_s=max(0.0, r.ts - prev),
                    input_types=(r.kind,) if r.kind else (),
                    extra=r.extra,
                )
            )
            prev = r.ts
        out.append(
            Session(
                session_id=f"bailian-{conv.rows[0].chat_id}",
                requests=tuple(reqs),
                block_size=BAILIAN_BLOCK_SIZE,
                hash_id_scope="global",
                start_s=start,
            )
        )
    return out


def read_bailian(path: Path | str) -> Trace:
    """Load a Bailian trace file (JSONL, gzip allowed); raise TraceFormatError listing
    every problem (file, line, field).

    Alibaba's Qwen-Bailian usage traces (``qwen_traceA_blksz_16.jsonl`` and siblings,
    github.com/alibaba-edu/qwen-bailian-usagetraces-anon) → a Trace.

    Schema, as published: one request per JSONL line with ``chat_id`` (randomized
    integer), ``parent_chat_id`` (-1 for a conversation's first request), ``timestamp``
    (seconds from the start of the trace), ``input_length``, ``output_length``, ``type``
    (text, search, image or file), ``turn`` (the conversation turn) and ``hash_ids``
    (salted SipHash blocks of 16 tokens, remapped to integers, one id space for the
    file: hash ids are global, so prefixes shared across conversations stay visible).

    Sessions follow ``parent_chat_id``: a request continues its parent's session when it
    is the latest request there; a second child of one parent (a regenerated answer)
    starts a session of its own, as does a request whose parent is not in the file. The
    trace holds arrivals only, so a request's think time is the gap since the previous
    request of its session arrived (it includes that request's own response time). Every
    problem is reported with file, line and field; nothing is half-loaded.
    """
    path = Path(path)
    data = read_file_bytes(path)
    problems: list[Problem] = []
    rows: list[_Row] = []
    seen: dict[int | str, int] = {}
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(
                Problem(path=path, line=lineno, reason=f"malformed JSON: {exc}")
            )
            continue
        row = _parse(path, lineno, obj, problems)
        if row is None:
            continue
        if row.chat_id in seen:
            problems.append(
                Problem(
                    path=path,
                    line=lineno,
                    field="chat_id",
                    reason=f"duplicate chat_id {row.chat_id} (first on line "
                    f"{seen[row.chat_id]})",
                )
            )
            continue
        seen[row.chat_id] = lineno
        rows.append(row)
    if problems:
        raise TraceFormatError(problems)
    if not rows:
        raise TraceFormatError([Problem(path=path, reason="no requests in the file")])
    rows.sort(key=lambda r: r.ts)  # stable: file order among equal arrivals
    return Trace(sessions=tuple(_sessions(rows)), source_format="bailian")
