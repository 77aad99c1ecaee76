"""The Weka / AgentX session format (also the native format): dict <-> Session.
See docs/traces.md#formats."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traces.errors import Problem
from traces.gaps import parts_past_gap
from traces.model import MAX_SECONDS, MAX_TOKENS, Request, Session, Subagent
from traces.table import RequestRows, table_of

_SESSION_KEYS = frozenset(
    {
        "id",
        "models",
        "block_size",
        "hash_id_scope",
        "tool_tokens",
        "system_tokens",
        "requests",
        "totals",
        "start_t",
    }
)
_REQUEST_KEYS = frozenset(
    {
        "t",
        "type",
        "model",
        "in",
        "out",
        "hash_ids",
        "input_types",
        "output_types",
        "stop",
        "api_time",
        "think_time",
        "ttft",
        "tool_wait",
        "human_wait",
    }
)
_SUBAGENT_KEYS = frozenset(
    {
        "t",
        "type",
        "agent_id",
        "subagent_type",
        "duration_ms",
        "total_tokens",
        "tool_use_count",
        "status",
        "models",
        "requests",
        "tool_tokens",
        "system_tokens",
    }
)
_MAX_DEPTH = 8  # subagents of subagents are allowed, within reason
_I64 = -(2**63)  # smallest int64; hash ids must fit an int64
_TIME_SLACK_S = 1e-6  # timestamps are rounded to ms in the corpus


@dataclass(slots=True)
class _Ctx:
    path: Path
    line: int | None
    session_id: str | None
    problems: list[Problem] = field(default_factory=list)

    def add(self, index: str | None, fld: str | None, reason: str) -> None:
        self.problems.append(
            Problem(
                path=self.path,
                line=self.line,
                session_id=self.session_id,
                request_index=index,
                field=fld,
                reason=reason,
            )
        )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _count(
    ctx: _Ctx,
    obj: Mapping[str, Any],
    key: str,
    index: str | None,
    *,
    required: bool = True,
) -> int | None:
    """A count (tokens, tool uses) in [0, MAX_TOKENS]; a problem, and 0 (None when
    optional), if it is not one."""
    v = obj.get(key)
    bad = 0 if required else None
    if v is None:
        if required:
            ctx.add(index, key, "missing")
        return bad
    if not _is_int(v):
        ctx.add(index, key, f"expected an integer, got {type(v).__name__} {v!r:.40}")
        return bad
    if v < 0:
        ctx.add(index, key, f"must be >= 0 (got {v})")
        return bad
    if v > MAX_TOKENS:
        ctx.add(index, key, f"must be <= {MAX_TOKENS:,} (got {v})")
        return bad
    return int(v)


def _number(
    ctx: _Ctx,
    obj: Mapping[str, Any],
    key: str,
    index: str | None,
    *,
    required: bool = False,
    signed: bool = False,
    unit: float = 1.0,
) -> float | None:
    """A finite number of seconds (``unit`` 1e-3: ms) within MAX_SECONDS either way
    (>= 0 unless ``signed``); a problem, and None, if it is not one (a missing one
    is a problem only when ``required``)."""
    v = obj.get(key)
    if v is None:
        if required:
            ctx.add(index, key, "missing")
        return None
    if not _is_num(v):
        ctx.add(index, key, f"expected a number, got {type(v).__name__} {v!r:.40}")
        return None
    if v < 0 and not signed:
        ctx.add(index, key, f"must be >= 0 (got {v})")
        return None
    if abs(v) * unit > MAX_SECONDS:
        most = MAX_SECONDS / unit
        ctx.add(index, key, f"must be <= {most:,.0f} (~3 years; got {v:.6g})")
        return None
    return float(v)


def _opt_str(
    ctx: _Ctx, obj: Mapping[str, Any], key: str, index: str | None
) -> str | None:
    v = obj.get(key)
    if v is None or isinstance(v, str):
        return v
    ctx.add(index, key, f"expected a string, got {type(v).__name__}")
    return None


def _str_list(
    ctx: _Ctx, obj: Mapping[str, Any], key: str, index: str | None
) -> tuple[str, ...]:
    v = obj.get(key)
    if not v and (v is None or v == []):  # absent or empty: the usual case
        return ()
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(v)
    ctx.add(index, key, "expected a list of strings")
    return ()


def _hash_ids(
    ctx: _Ctx,
    obj: Mapping[str, Any],
    index: str,
    in_tokens: int | None,
    block_size: int,
) -> np.ndarray:
    raw = obj.get("hash_ids")
    if raw is None:
        ctx.add(index, "hash_ids", "missing")
        return np.zeros(0, dtype=np.int64)
    if not isinstance(raw, list):
        ctx.add(index, "hash_ids", f"expected a list, got {type(raw).__name__}")
        return np.zeros(0, dtype=np.int64)
    try:
        # array('q') converts in C and, unlike np.fromiter, refuses floats (even 1.0),
        # strings, None and ints beyond int64 instead of truncating or wrapping them.
        arr = np.frombuffer(array("q", raw), dtype=np.int64)
    except (TypeError, OverflowError):
        pos, bad = next(
            (i, x) for i, x in enumerate(raw) if not _is_int(x) or not _I64 <= x < -_I64
        )
        what = "an integer outside int64" if _is_int(bad) else type(bad).__name__
        ctx.add(
            index,
            "hash_ids",
            f"expected a list of integers, got {what} {bad!r:.40} at position {pos}",
        )
        return np.zeros(0, dtype=np.int64)
    n = arr.size
    if in_tokens is None:  # `in` itself is wrong: already reported, nothing to fit
        return arr
    full, ceil = in_tokens // block_size, -(-in_tokens // block_size)
    # Weka hashes full blocks only; Mooncake-style traces also hash the partial tail.
    if n not in (full, ceil):
        ctx.add(
            index,
            "hash_ids",
            f"{n} blocks do not fit in={in_tokens} with block_size={block_size} "
            f"(expected {full}" + (f" or {ceil})" if ceil != full else ")"),
        )
    return arr


def _parse_request(
    ctx: _Ctx, obj: Mapping[str, Any], index: str, block_size: int
) -> Request:
    n_problems = len(ctx.problems)
    in_tokens = _count(ctx, obj, "in", index) or 0
    in_ok = len(ctx.problems) == n_problems
    out_tokens = _count(ctx, obj, "out", index) or 0
    t = _number(ctx, obj, "t", index, required=True, signed=True) or 0.0
    kind = obj.get("type")
    extra = {k: v for k, v in obj.items() if k not in _REQUEST_KEYS}
    think = _number(ctx, obj, "think_time", index) or 0.0
    tool = _number(ctx, obj, "tool_wait", index)
    human = _number(ctx, obj, "human_wait", index)
    if tool is not None or human is not None:
        past = parts_past_gap(think, tool or 0.0, human or 0.0)
        if past is not None:
            ctx.add(index, "tool_wait", past)
    return Request(
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        hash_ids=_hash_ids(ctx, obj, index, in_tokens if in_ok else None, block_size),
        t_s=t,
        think_time_s=think,
        api_time_s=_number(ctx, obj, "api_time", index),
        ttft_s=_number(ctx, obj, "ttft", index),
        kind=str(kind),
        model=_opt_str(ctx, obj, "model", index),
        stop=_opt_str(ctx, obj, "stop", index),
        input_types=_str_list(ctx, obj, "input_types", index),
        output_types=_str_list(ctx, obj, "output_types", index),
        extra=extra,
        tool_wait_s=tool,
        human_wait_s=human,
    )


def _parse_entries(
    ctx: _Ctx,
    entries: object,
    session_id: str,
    prefix: str,
    block_size: int,
    depth: int,
) -> tuple[list[Request], list[Subagent]]:
    requests: list[Request] = []
    subagents: list[Subagent] = []
    if not isinstance(entries, list):
        ctx.add(None, prefix + "requests" if prefix else "requests", "expected a list")
        return requests, subagents
    last_t = -math.inf
    pending: list[tuple[int, Mapping[str, Any], str]] = []  # (anchor, entry, label)
    for pos, entry in enumerate(entries):
        label = f"{prefix}{pos}"
        if not isinstance(entry, dict):
            ctx.add(label, None, f"expected an object, got {type(entry).__name__}")
            continue
        kind = entry.get("type")
        t = entry.get("t")
        if isinstance(t, int | float) and _is_num(t):
            if t < last_t - _TIME_SLACK_S:
                ctx.add(label, "t", f"time goes backwards ({t} after {last_t})")
            last_t = max(last_t, float(t))
        if kind == "subagent":
            pending.append((len(requests) - 1, entry, label))
            continue
        if kind not in ("n", "s"):
            ctx.add(label, "type", f"expected 'n', 's' or 'subagent', got {kind!r}")
            continue
        requests.append(_parse_request(ctx, entry, label, block_size))
    for anchor, entry, label in pending:
        join = anchor + 1 if anchor + 1 < len(requests) else None
        sub = _parse_subagent(ctx, entry, session_id, label, block_size, depth + 1)
        if sub is not None:
            subagents.append(
                Subagent(
                    session=sub[0],
                    anchor_index=anchor,
                    join_index=join,
                    agent_id=sub[1],
                    t_s=_number(ctx, entry, "t", label, signed=True) or 0.0,
                    subagent_type=_opt_str(ctx, entry, "subagent_type", label),
                    duration_ms=_number(ctx, entry, "duration_ms", label, unit=1e-3),
                    total_tokens=_count(
                        ctx, entry, "total_tokens", label, required=False
                    ),
                    tool_use_count=_count(
                        ctx, entry, "tool_use_count", label, required=False
                    ),
                    status=_opt_str(ctx, entry, "status", label),
                    extra={k: v for k, v in entry.items() if k not in _SUBAGENT_KEYS},
                )
            )
    return requests, subagents


def _parse_subagent(
    ctx: _Ctx,
    entry: Mapping[str, Any],
    parent_id: str,
    label: str,
    block_size: int,
    depth: int,
) -> tuple[Session, str] | None:
    if depth > _MAX_DEPTH:
        ctx.add(label, "requests", f"subagents nested deeper than {_MAX_DEPTH}")
        return None
    agent_id = entry.get("agent_id")
    if not isinstance(agent_id, str) or not agent_id:
        ctx.add(label, "agent_id", "missing or not a string")
        agent_id = f"sub{label.rsplit('.', 1)[-1]}"
    sid = f"{parent_id}/{agent_id}"
    reqs, subs = _parse_entries(
        ctx, entry.get("requests"), sid, f"{label}.", block_size, depth
    )
    session = Session(
        session_id=sid,
        requests=_held(reqs),
        subagents=tuple(subs),
        block_size=block_size,
        hash_id_scope="local",
        models=_str_list(ctx, entry, "models", label),
        tool_tokens=_count(ctx, entry, "tool_tokens", label, required=False),
        system_tokens=_count(ctx, entry, "system_tokens", label, required=False),
    )
    return session, agent_id


def parse_session(
    obj: object, *, path: Path, line: int | None, fallback_id: str
) -> tuple[Session | None, list[Problem]]:
    """Build a Session from one Weka/native JSON object; returns it and its problems.

    The session is None only when the object is not a session at all.

    One JSON object per session. ``requests`` interleaves normal ("n") and streaming
    ("s") requests with "subagent" entries; a subagent entry has no parent link: its
    parent is the session it sits in, it spawns after the request before it and the
    request after it waits for it (none after it: it runs in the background). Parsing
    collects every problem it finds instead of stopping at the first. A parsed session's
    requests are rows of one table, each prompt that extends the previous one stored as
    its new blocks only.
    """
    ctx = _Ctx(path=path, line=line, session_id=None)
    if not isinstance(obj, dict):
        ctx.add(None, None, f"expected a JSON object, got {type(obj).__name__}")
        return None, ctx.problems
    sid = obj.get("id")
    if sid is None:
        sid = fallback_id
    elif not isinstance(sid, str | int):
        ctx.add(None, "id", "expected a string")
        sid = fallback_id
    sid = str(sid)
    ctx.session_id = sid
    raw_block = obj.get("block_size")
    if isinstance(raw_block, int) and _is_int(raw_block) and raw_block > 0:
        block_size = raw_block
    else:
        ctx.add(None, "block_size", f"expected a positive integer, got {raw_block!r}")
        block_size = 64
    scope = obj.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        ctx.add(None, "hash_id_scope", f"expected 'local' or 'global', got {scope!r}")
        scope = "local"
    if "requests" not in obj:
        ctx.add(None, "requests", "missing")
    reqs, subs = _parse_entries(ctx, obj.get("requests", []), sid, "", block_size, 0)
    start = obj.get("start_t")
    if start is not None and (not _is_num(start) or start < 0):
        ctx.add(None, "start_t", "expected a non-negative number")
        start = None
    extra = {k: v for k, v in obj.items() if k not in _SESSION_KEYS}
    session = Session(
        session_id=sid,
        requests=_held(reqs),
        subagents=tuple(subs),
        block_size=block_size,
        hash_id_scope=scope,
        start_s=None if start is None else float(start),
        models=_str_list(ctx, obj, "models", None),
        tool_tokens=_count(ctx, obj, "tool_tokens", None, required=False),
        system_tokens=_count(ctx, obj, "system_tokens", None, required=False),
        extra=extra,
    )
    totals = obj.get("totals")
    if totals is not None and totals != session_totals(session):
        # Inconsistent totals are kept verbatim so a round trip stays lossless.
        session = _with_extra(session, {**extra, "totals": totals})
    return session, ctx.problems


def _held(reqs: list[Request]) -> Sequence[Request]:
    """A parsed session's requests as it holds them: rows of a table of its own when
    it has several (a growing prompt stored once), else a tuple (one request shares
    nothing, and a table of its own costs more to build and hold than the request)."""
    return table_of(reqs) if len(reqs) > 1 else tuple(reqs)


def _with_extra(session: Session, extra: dict[str, Any]) -> Session:
    from dataclasses import replace

    return replace(session, extra=extra)


def _token_sums(requests: Sequence[Request]) -> tuple[int, int]:
    if isinstance(requests, RequestRows):
        t, a, b = requests.table, requests.start, requests.stop
        return int(t.input_tokens[a:b].sum()), int(t.output_tokens[a:b].sum())
    return sum(r.input_tokens for r in requests), sum(r.output_tokens for r in requests)


def session_totals(session: Session) -> dict[str, Any]:
    """Weka's ``totals`` block, computed from the requests."""
    pi, po = _token_sums(session.requests)
    si = so = 0
    for sub in session.subagents:
        for s, _ in sub.session.walk():
            i, o = _token_sums(s.requests)
            si += i
            so += o
    return {
        "parent_tokens": {"input": pi, "output": po},
        "subagent_tokens": {"input": si, "output": so},
        "combined_tokens": {"input": pi + si, "output": po + so},
        "subagent_count": len(session.subagents),
    }


def _request_dict(r: Request) -> dict[str, Any]:
    d: dict[str, Any] = {"t": r.t_s, "type": r.kind}
    if r.model is not None:
        d["model"] = r.model
    d["in"] = r.input_tokens
    d["out"] = r.output_tokens
    d["hash_ids"] = r.hash_ids  # orjson writes numpy arrays natively
    d["input_types"] = list(r.input_types)
    d["output_types"] = list(r.output_types)
    if r.stop is not None:
        d["stop"] = r.stop
    if r.api_time_s is not None:
        d["api_time"] = r.api_time_s
    if r.ttft_s is not None:
        d["ttft"] = r.ttft_s
    d["think_time"] = r.think_time_s
    if r.tool_wait_s is not None:
        d["tool_wait"] = r.tool_wait_s
    if r.human_wait_s is not None:
        d["human_wait"] = r.human_wait_s
    d.update(r.extra)
    return d


def _entries(session: Session) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [_subagent_dict(s) for s in session.subagents_at(-1)]
    for i, r in enumerate(session.requests):
        out.append(_request_dict(r))
        out.extend(_subagent_dict(s) for s in session.subagents_at(i))
    return out


def _subagent_dict(sub: Subagent) -> dict[str, Any]:
    d: dict[str, Any] = {"t": sub.t_s, "type": "subagent", "agent_id": sub.agent_id}
    for key, value in (
        ("subagent_type", sub.subagent_type),
        ("duration_ms", sub.duration_ms),
        ("total_tokens", sub.total_tokens),
        ("tool_use_count", sub.tool_use_count),
        ("status", sub.status),
    ):
        if value is None:
            continue
        integral = key == "duration_ms" and value == int(value)
        d[key] = int(value) if integral else value
    d["requests"] = _entries(sub.session)
    d["models"] = list(sub.session.models)
    if sub.session.tool_tokens is not None:
        d["tool_tokens"] = sub.session.tool_tokens
    if sub.session.system_tokens is not None:
        d["system_tokens"] = sub.session.system_tokens
    d.update(sub.extra)
    return d


def session_to_dict(session: Session) -> dict[str, Any]:
    """The Weka/native JSON object for ``session`` (inverse of parse_session)."""
    d: dict[str, Any] = {
        "id": session.session_id,
        "models": list(session.models),
        "block_size": session.block_size,
        "hash_id_scope": session.hash_id_scope,
    }
    if session.tool_tokens is not None:
        d["tool_tokens"] = session.tool_tokens
    if session.system_tokens is not None:
        d["system_tokens"] = session.system_tokens
    if session.start_s is not None:
        d["start_t"] = session.start_s
    d["requests"] = _entries(session)
    d["totals"] = session_totals(session)
    d.update(session.extra)
    return d
