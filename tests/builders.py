"""Builders shared by the test packages: traces (requests, sessions, subagent trees),
request records and agent log records, with dull defaults that a test overrides where
it matters."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replayer.records import RequestRecord, tpot_ns
from traces.model import Request, Scope, Session, Subagent, Trace

# -- traces ------------------------------------------------------------------------


def request(
    ids: Sequence[int] | None = None,
    *,
    blocks: int | None = None,
    first: int = 1,
    input_tokens: int | None = None,
    block_size: int = 4,
    extra_tokens: int = 0,
    out: int = 1,
    think: float = 0.0,
    t: float = 0.0,
) -> Request:
    """A request over hash ids ``ids`` (or ``blocks`` consecutive ids from
    ``first``); input = its blocks' tokens + ``extra_tokens`` unless given."""
    if ids is None:
        ids = range(first, first + (blocks or 0))
    arr = np.asarray(list(ids), dtype=np.int64)
    return Request(
        input_tokens=arr.size * block_size + extra_tokens
        if input_tokens is None
        else input_tokens,
        output_tokens=out,
        hash_ids=arr,
        think_time_s=think,
        t_s=t,
    )


def session(
    session_id: str,
    requests: Sequence[Request],
    *,
    subagents: Sequence[Subagent] = (),
    block_size: int = 4,
    start: float | None = None,
    scope: Scope = "local",
    **fields: Any,
) -> Session:
    """A session of ``requests``."""
    return Session(
        session_id=session_id,
        requests=tuple(requests),
        subagents=tuple(subagents),
        block_size=block_size,
        start_s=start,
        hash_id_scope=scope,
        **fields,
    )


def growing_session(
    session_id: str,
    n: int,
    *,
    think: float = 0.0,
    out: int = 3,
    subagents: Sequence[Subagent] = (),
    start: float | None = None,
    block_size: int = 4,
    extra_tokens: int = 2,
) -> Session:
    """``n`` turns, turn ``i`` over blocks 1..2+i (each extends the last) of
    ``block_size`` tokens plus ``extra_tokens`` unhashed tokens, ``think`` seconds
    before every turn after the first."""
    reqs = [
        request(
            blocks=2 + i,
            block_size=block_size,
            extra_tokens=extra_tokens,
            out=out,
            think=think if i else 0.0,
        )
        for i in range(n)
    ]
    return session(
        session_id, reqs, subagents=subagents, block_size=block_size, start=start
    )


def subagent(
    child: Session, *, anchor: int, join: int | None, agent_id: str | None = None
) -> Subagent:
    """``child`` spawned after request ``anchor`` of its parent and joined before
    request ``join`` (None: it runs in the background)."""
    return Subagent(
        session=child,
        anchor_index=anchor,
        join_index=join,
        agent_id=agent_id or child.session_id.rsplit("/", 1)[-1],
    )


def agent_tree(sid: str) -> Session:
    """Three turns; two subagents spawned after turn 0 and joined before turn 1; one
    background subagent after turn 2. 10 requests."""
    return growing_session(
        sid,
        3,
        subagents=(
            subagent(growing_session(f"{sid}/a", 2), anchor=0, join=1),
            subagent(growing_session(f"{sid}/b", 3), anchor=0, join=1),
            subagent(growing_session(f"{sid}/bg", 2), anchor=2, join=None),
        ),
    )


def trace_of(*sessions: Session, source_format: str = "native") -> Trace:
    """A trace of ``sessions``."""
    return Trace(sessions=tuple(sessions), source_format=source_format)


# -- records -----------------------------------------------------------------------

_MS = 1_000_000


def make_record(**fields: Any) -> RequestRecord:
    """A RequestRecord with defaults: an ok 1000-token request sent at 0."""
    defaults: dict[str, Any] = {
        "run_id": "run-test",
        "session_id": "s0",
        "root_session_id": fields.get("session_id", "s0"),
        "request_index": 0,
        "scheduled_ns": 0,
        "start_ns": 0,
        "trace_input_tokens": 1000,
        "prompt_tokens": 1000,
        "trace_output_tokens": 10,
        "requested_output_tokens": 10,
        "ideal_cached_tokens": 0,
    }
    defaults.update(fields)
    return RequestRecord(**defaults)


def timed_record(
    *, start_ms: float, ttft_ms: float, e2e_ms: float, out: int, **fields: Any
) -> RequestRecord:
    """A record whose timing columns agree with each other (evenly spaced chunks);
    ``tpot_ns`` as the engine fills it (ok rows with 2+ output tokens)."""
    start = int(start_ms * _MS)
    ttft = int(ttft_ms * _MS)
    e2e = int(e2e_ms * _MS)
    step = (e2e - ttft) // (out - 1) if out > 1 else 0
    chunks = [ttft + k * step for k in range(out)]
    return make_record(
        start_ns=start,
        first_token_ns=start + ttft,
        end_ns=start + e2e,
        ttft_ns=ttft,
        e2e_ns=e2e,
        tpot_ns=(
            tpot_ns(e2e, ttft, out)
            if out > 1 and fields.get("status", "ok") == "ok"
            else None
        ),
        chunk_times_ns=chunks,
        output_tokens=out,
        **fields,
    )


# -- agent logs (Claude Code, Codex) ----------------------------------------------

_LOG_EPOCH = 1_780_000_000.0  # a fixed instant; logs give times as ISO-8601 strings


def iso(t: float) -> str:
    """ISO-8601 UTC time (millisecond precision, ``Z``) ``t`` seconds after a fixed
    epoch, as agent logs write times."""
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(_LOG_EPOCH + t, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_view(path: Path) -> list[dict[str, Any]]:
    """The records of a TraceLab "record view" file (JSON records between
    ``===== record NNNN =====`` separators), in order."""
    import re

    parts = re.split(r"^===== record \d+ =====\s*$", path.read_text(), flags=re.M)
    return [json.loads(p) for p in parts[1:]]


def write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """``records`` as a JSONL log at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def claude_user(
    t: float,
    content: str | list[dict[str, Any]],
    *,
    session: str = "sess-1",
    sidechain: bool = False,
    agent: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A Claude Code ``user`` record: a prompt (str) or content blocks."""
    rec: dict[str, Any] = {
        "type": "user",
        "isSidechain": sidechain,
        "sessionId": session,
        "timestamp": iso(t),
        "message": {"role": "user", "content": content},
    }
    if agent is not None:
        rec["agentId"] = agent
    rec.update(fields)
    return rec


def claude_assistant(
    t: float,
    msg_id: str,
    blocks: list[dict[str, Any]],
    usage: tuple[int, int, int, int],
    *,
    session: str = "sess-1",
    sidechain: bool = False,
    agent: str | None = None,
    model: str = "claude-sonnet-4-5-20250929",
    stop: str | None = "tool_use",
) -> dict[str, Any]:
    """A Claude Code ``assistant`` record of message ``msg_id``; ``usage`` is
    (input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
    output_tokens)."""
    uncached, write, read, out = usage
    rec: dict[str, Any] = {
        "type": "assistant",
        "isSidechain": sidechain,
        "sessionId": session,
        "timestamp": iso(t),
        "message": {
            "id": msg_id,
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "usage": {
                "input_tokens": uncached,
                "cache_creation_input_tokens": write,
                "cache_read_input_tokens": read,
                "output_tokens": out,
            },
        },
    }
    if agent is not None:
        rec["agentId"] = agent
    return rec


def codex_record(t: float, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A Codex rollout record (``session_meta``, ``response_item``, ``event_msg``)."""
    return {"timestamp": iso(t), "type": kind, "payload": payload}


def codex_token_count(
    t: float, last: tuple[int, int, int], total: tuple[int, int, int]
) -> dict[str, Any]:
    """A Codex ``token_count`` event; ``last``/``total`` are (input_tokens,
    cached_input_tokens, output_tokens)."""

    def usage(u: tuple[int, int, int]) -> dict[str, int]:
        return {
            "input_tokens": u[0],
            "cached_input_tokens": u[1],
            "output_tokens": u[2],
            "reasoning_output_tokens": 0,
            "total_tokens": u[0] + u[2],
        }

    info = {"total_token_usage": usage(total), "last_token_usage": usage(last)}
    return codex_record(t, "event_msg", {"type": "token_count", "info": info})


# -- capacity documents ------------------------------------------------------------


def capacity_cell(
    name: str, level: int, ttft: tuple[float, bool], tpot: tuple[float, bool], **kw: Any
) -> dict[str, Any]:
    """A ``capacity.json`` cell judged on TTFT and TPOT against 100 ms targets:
    (value, pass) of each."""
    checks = [
        {"slo": slo, "metric": metric, "target_ms": 100.0, "value_ms": v,
         "ci_ms": [v * 0.9, v * 1.1], "pass": ok, "borderline": False}
        for slo, metric, (v, ok) in (
            ("ttft_ms", "queued_ttft_ms", ttft), ("tpot_ms", "tpot_ms", tpot)
        )
    ]  # fmt: skip
    return {"name": name, "level": level, "duration_s": 1.0, "checks": checks,
            "pass": ttft[1] and tpot[1], "borderline": False, "reasons": [],
            "window": None, "ok": 30, "error_rate": 0.0, **kw}  # fmt: skip


# Twelve real Weka sessions, three with subagents: the calibration tests' load.
CALIBRATION_SESSIONS = (
    *("0003", "0254", "0274", "0369", "0131", "0150", "0208", "0481"),
    *("0017", "0579", "0597", "0651"),
)


def _cut_entries(entries: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` entries (subagents cut to 3 requests), outputs 6-25 tokens."""
    out = []
    for entry in entries[:n]:
        entry = dict(entry)
        if entry.get("type") == "subagent":
            entry["requests"] = _cut_entries(entry["requests"], 3)
        else:
            entry["out"] = min(entry["out"], 6 + entry["out"] % 20)
        out.append(entry)
    return out


def weka_cut(weka_dir: Path, folder: Path, entries: int) -> Path:
    """CALIBRATION_SESSIONS, each cut to its first ``entries`` entries, written to
    ``folder`` as Weka files (the reader's own format)."""
    for name in CALIBRATION_SESSIONS:
        session = json.loads((weka_dir / f"trace_{name}.json").read_text())
        session["requests"] = _cut_entries(session["requests"], entries)
        session.pop("totals", None)
        (folder / f"trace_{name}.json").write_text(json.dumps(session))
    return folder
