"""Dynamo's agentic Mooncake rows (``--trace-format agentic_mooncake``): one request a
JSON line with ``request_id``, a DAG of ``wait_for`` dependencies, ``branches`` and
tool waits, read into session trees and written back. See docs/traces.md#formats."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traces.errors import Problem, TraceError
from traces.model import HashIds, Request, Session, Subagent, Trace
from traces.mooncake import count_problem
from traces.table import table_of

# The fields of Dynamo's AgenticMooncakeRow (dynamo_data_gen::mooncake), with the
# aliases its reader accepts; anything else on a row is kept in Request.extra.
_ALIASES = {
    "input_tokens": "input_length",
    "output_tokens": "output_length",
    "created_time": "timestamp",
    "delay_ms": "delay",
}
_KNOWN = frozenset(
    {
        "request_id",
        "session_id",
        "input_length",
        "output_length",
        "hash_ids",
        "timestamp",
        "delay",
        "wait_for",
        "branches",
        "prefix_reset",
        "block_size",
        "tool_wait_ms",
        *_ALIASES,
    }
)
_NO_IDS: HashIds = np.zeros(0, dtype=np.int64)
# Block sizes tried when the rows do not pin one down (Dynamo takes it as a flag).
_BLOCK_SIZES = tuple(1 << k for k in range(4, 13))


def looks_like_agentic_mooncake(obj: object) -> bool:
    """True when ``obj`` (one parsed line) is an agentic Mooncake row: a Mooncake
    request (lengths, ``hash_ids``) named by a ``request_id``."""
    return (
        isinstance(obj, dict)
        and "request_id" in obj
        and "hash_ids" in obj
        and ("input_length" in obj or "input_tokens" in obj)
    )


@dataclass(slots=True, eq=False)
class _Row:
    line: int
    request_id: str
    session_id: str
    input_tokens: int | None  # None: the hash ids' capacity
    output_tokens: int
    hash_ids: HashIds
    timestamp_ms: float | None
    wait_ms: float  # delay + tool_wait_ms: the gap after the dependencies end
    tool_wait_ms: float | None  # its tool part (None: the row has no tool_wait_ms)
    wait_for: list[str]
    branches: list[str]
    extra: dict[str, Any]
    pos: int = 0  # index in its session


@dataclass(slots=True, eq=False)
class _Traj:
    """One ``session_id``: a session of the tree being built."""

    sid: str
    rows: list[_Row] = field(default_factory=list)
    parent: _Traj | None = None
    anchor: int = -1  # parent request it spawns after
    join: int | None = None  # parent request that waits for it
    children: list[_Traj] = field(default_factory=list)


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[Problem] = []
        self.rows: list[_Row] = []
        self.by_id: dict[str, _Row] = {}
        self.stated_block: int | None = None  # the rows' block_size, if they give it
        # (request_id, session_id) of the row being read, as far as known.
        self.current: tuple[str | None, str | None] = (None, None)

    def bad(self, row: _Row | int, fld: str | None, reason: str) -> None:
        if isinstance(row, _Row):
            self.problems.append(
                Problem(
                    path=self.path,
                    line=row.line,
                    session_id=row.session_id,
                    request_index=row.request_id,
                    field=fld,
                    reason=reason,
                )
            )
        else:
            rid, sid = self.current
            self.problems.append(
                Problem(
                    path=self.path,
                    line=row,
                    session_id=sid,
                    request_index=rid,
                    field=fld,
                    reason=reason,
                )
            )

    def add(self, line: int, obj: object) -> None:
        if not isinstance(obj, dict):
            self.bad(line, None, f"expected a JSON object, got {type(obj).__name__}")
            return
        n = len(self.problems)
        obj = {_ALIASES.get(k, k): v for k, v in obj.items()}
        self.current = (None, None)
        rid = obj.get("request_id")
        named = isinstance(rid, str) and bool(rid.strip())
        if not isinstance(rid, str) or not named:
            self.bad(
                line, "request_id", f"expected a non-empty string, got {rid!r:.40}"
            )
            rid = f"line {line}"
        sid = obj.get("session_id")
        if sid is None:
            sid = f"request_{line}"  # Dynamo's name for a row without one
        elif not isinstance(sid, str):
            self.bad(line, "session_id", f"expected a string, got {sid!r:.40}")
            sid = f"request_{line}"
        self.current = (rid if named else None, sid)
        ints: dict[str, int | None] = {}
        for key in ("input_length", "output_length"):
            v = obj.get(key)
            if v is None and key == "input_length":
                ints[key] = None
                continue
            why = count_problem(v)
            if why is not None:
                self.bad(line, key, why)
            ints[key] = v if why is None else 0
        ts = obj.get("timestamp")
        if ts is not None and not _nonneg(ts):
            self.bad(line, "timestamp", f"expected milliseconds >= 0, got {ts!r:.40}")
            ts = None
        wait = 0.0
        tool: float | None = None
        for key in ("delay", "tool_wait_ms"):
            v = obj.get(key)
            if v is None:
                continue
            if not _nonneg(v):
                self.bad(line, key, f"expected milliseconds >= 0, got {v!r:.40}")
                continue
            wait += float(v)
            if key == "tool_wait_ms":
                tool = float(v)
        ids = _hash_ids(obj.get("hash_ids"))
        if ids is None:
            self.bad(line, "hash_ids", "expected a list of non-negative integers")
            ids = _NO_IDS
        lists: dict[str, list[str]] = {}
        for key in ("wait_for", "branches"):
            v = obj.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                self.bad(line, key, "expected a list of request ids")
                v = []
            lists[key] = v
        reset = obj.get("prefix_reset")
        if reset is not None and not isinstance(reset, bool):
            self.bad(line, "prefix_reset", f"expected true or false, got {reset!r:.40}")
        block = obj.get("block_size")
        if block is not None:
            if count_problem(block) is not None or not block:
                self.bad(line, "block_size", f"expected tokens > 0, got {block!r:.40}")
            elif self.stated_block not in (None, block):
                self.bad(line, "block_size", f"{block} after {self.stated_block}")
            else:
                self.stated_block = block
        self.current = (None, None)
        if len(self.problems) > n:
            return
        row = _Row(
            line=line,
            request_id=rid,
            session_id=sid,
            input_tokens=ints["input_length"],
            output_tokens=ints["output_length"] or 0,
            hash_ids=ids,
            timestamp_ms=None if ts is None else float(ts),
            wait_ms=wait,
            tool_wait_ms=tool,
            wait_for=lists["wait_for"],
            branches=lists["branches"],
            extra={"request_id": rid}
            | {str(k): v for k, v in obj.items() if k not in _KNOWN},
        )
        if rid in self.by_id:
            first = self.by_id[rid]
            self.bad(
                row, "request_id", f"duplicate request id (first on line {first.line})"
            )
            return
        self.by_id[rid] = row
        self.rows.append(row)

    def trace(self) -> list[Session]:
        if self.problems or not self.rows:
            return []
        block = self.block_size()
        if block is None:
            return []
        trajs = self.trajectories()
        if trajs is None:
            return []
        self.check_acyclic()
        if self.problems:
            return []
        roots = [t for t in trajs.values() if t.parent is None]
        return [self.session(t, block) for t in roots]

    def block_size(self) -> int | None:
        """The block size the rows give (``block_size``, which this module writes),
        else the one they fit: every row's ``hash_ids`` cover its ``input_length``
        (Dynamo's only check), and, where one exists, the size at which each row has
        exactly one id per started block."""
        if self.stated_block is not None:
            for r in self.rows:
                need = r.input_tokens or 0
                if r.hash_ids.size * self.stated_block < need:
                    self.bad(
                        r,
                        "hash_ids",
                        f"{r.hash_ids.size} blocks of {self.stated_block} tokens "
                        f"do not cover input_length={need}",
                    )
            return None if self.problems else self.stated_block
        lo, hi = 1, math.inf
        for r in self.rows:
            k, n = r.hash_ids.size, r.input_tokens
            if n is None or n == 0:
                continue
            if k == 0:
                self.bad(r, "hash_ids", f"no blocks for input_length={n}")
                continue
            lo = max(lo, -(-n // k))
            if k > 1:
                hi = min(hi, -(-n // (k - 1)) - 1)
        if self.problems:
            return None
        exact = [b for b in _BLOCK_SIZES if lo <= b <= hi]
        if exact:
            return exact[0]
        return next((b for b in _BLOCK_SIZES if b >= lo), lo)

    def trajectories(self) -> dict[str, _Traj] | None:
        """Rows grouped by session, each session's parent, anchor and join read off
        the cross-session ``wait_for`` and ``branches`` edges."""
        trajs: dict[str, _Traj] = {}
        for r in self.rows:
            t = trajs.setdefault(r.session_id, _Traj(r.session_id))
            r.pos = len(t.rows)
            t.rows.append(r)
        for r in self.rows:
            for key in ("wait_for", "branches"):
                for dep in getattr(r, key):
                    if dep not in self.by_id:
                        self.bad(r, key, f"names request {dep!r}, which no row has")
                    elif dep == r.request_id:
                        self.bad(r, key, "names the row itself")
        if self.problems:
            return None
        # Spawns: a session's first row waits for one request of another session
        # (or a row of another session lists it in its branches).
        for t in trajs.values():
            first = t.rows[0]
            outside = [d for d in first.wait_for if self.by_id[d].session_id != t.sid]
            if len(outside) > 1:
                self.bad(
                    first,
                    "wait_for",
                    "a session's first request waits for at most one request of "
                    f"another session (its spawn point); waits for {len(outside)}",
                )
                continue
            if outside:
                anchor = self.by_id[outside[0]]
                t.parent, t.anchor = trajs[anchor.session_id], anchor.pos
        for r in self.rows:
            for b in r.branches:
                named = self.by_id[b]
                t = trajs[named.session_id]
                if named.pos != 0 or named.session_id == r.session_id:
                    self.bad(
                        r,
                        "branches",
                        f"{b!r} is not the first request of another session",
                    )
                elif t.parent is None:
                    t.parent, t.anchor = trajs[r.session_id], r.pos
                elif t.parent.sid != r.session_id or t.anchor != r.pos:
                    self.bad(
                        r,
                        "branches",
                        f"{b!r} waits for another request "
                        f"({t.parent.rows[t.anchor].request_id!r})",
                    )
        # Joins: a later row of a session waits for a request of another session,
        # which must be its subagent (one it spawned, or one joined only here).
        for t in trajs.values():
            for r in t.rows:
                deps = r.wait_for if r.pos > 0 else []
                for d in r.wait_for:
                    waited = self.by_id[d]
                    if waited.session_id == t.sid and waited.pos >= r.pos:
                        self.bad(
                            r,
                            "wait_for",
                            f"waits for {d!r}, a later request of its own session",
                        )
                for d in deps:
                    child = trajs[self.by_id[d].session_id]  # its session
                    if child is t:
                        continue
                    if (
                        child.parent is None
                        and child.rows[0].wait_for == []
                        and child not in _ancestors(t)
                    ):
                        child.parent, child.anchor = t, -1
                    if child.parent is not t:
                        self.bad(
                            r,
                            "wait_for",
                            f"waits for {d!r} of session {child.sid!r}, which "
                            f"is not a subagent of {t.sid!r}",
                        )
                    elif child.join is None or r.pos < child.join:
                        if r.pos <= child.anchor:
                            self.bad(
                                r,
                                "wait_for",
                                f"waits for subagent {child.sid!r}, spawned after it",
                            )
                        child.join = r.pos
        for t in trajs.values():
            p, hops = t.parent, 0
            while p is not None and p is not t and hops <= len(trajs):
                p, hops = p.parent, hops + 1
            if p is t:
                self.bad(
                    t.rows[0],
                    "wait_for",
                    f"session {t.sid!r} is its own ancestor (a cycle of spawns)",
                )
                break
        if self.problems:
            return None
        for t in trajs.values():
            if t.parent is not None:
                t.parent.children.append(t)
        return trajs

    def check_acyclic(self) -> None:
        """No request waits, through any chain of ``wait_for``, for itself."""
        state: dict[str, int] = {}  # 1: on the path, 2: done
        for start in self.rows:
            if start.request_id in state:
                continue
            stack: list[tuple[_Row, Iterator[str]]] = [(start, iter(start.wait_for))]
            state[start.request_id] = 1
            while stack:
                row, deps = stack[-1]
                dep = next(deps, None)
                if dep is None:
                    state[row.request_id] = 2
                    stack.pop()
                elif state.get(dep) == 1:
                    self.bad(
                        row,
                        "wait_for",
                        f"waits for {dep!r}, which waits for it (a cycle)",
                    )
                    return
                elif dep not in state:
                    state[dep] = 1
                    nxt = self.by_id[dep]
                    stack.append((nxt, iter(nxt.wait_for)))

    def session(self, t: _Traj, block: int) -> Session:
        first_ts = t.rows[0].timestamp_ms
        requests: list[Request] = []
        for r in t.rows:
            n = (
                r.input_tokens
                if r.input_tokens is not None
                else r.hash_ids.size * block
            )
            gapped = r.pos > 0 or t.parent is not None
            think = r.wait_ms / 1000.0 if gapped else 0.0
            tool = (
                r.tool_wait_ms / 1000.0
                if gapped and r.tool_wait_ms is not None
                else None
            )
            if r.timestamp_ms is not None and first_ts is not None:
                t_s = (r.timestamp_ms - first_ts) / 1000.0
            else:
                t_s = requests[-1].t_s + think if requests else 0.0
            requests.append(
                Request(
                    input_tokens=n,
                    output_tokens=r.output_tokens,
                    hash_ids=r.hash_ids,
                    t_s=t_s,
                    think_time_s=think,
                    tool_wait_s=tool,
                    api_time_s=None,
                    extra=r.extra,
                )
            )
        # A request's duration: from its start to its successor's dependency end,
        # where the successor waits for it alone.
        for i in range(len(requests) - 1):
            nxt = t.rows[i + 1]
            if nxt.timestamp_ms is None or t.rows[i].timestamp_ms is None:
                continue
            if nxt.wait_for != [t.rows[i].request_id]:
                continue
            api = requests[i + 1].t_s - requests[i + 1].think_time_s - requests[i].t_s
            if api >= 0:
                requests[i] = _with_api(requests[i], api)
        subagents = tuple(
            Subagent(
                session=self.session(c, block),
                anchor_index=c.anchor,
                join_index=c.join,
                agent_id=c.sid,
                t_s=_offset_s(c.rows[0].timestamp_ms, first_ts),
            )
            for c in sorted(t.children, key=lambda c: c.anchor)
        )
        return Session(
            session_id=t.sid,
            requests=table_of(requests),
            subagents=subagents,
            block_size=block,
            hash_id_scope="global",
            start_s=None
            if t.parent is not None or first_ts is None
            else first_ts / 1000.0,
        )


def _ancestors(t: _Traj) -> list[_Traj]:
    out: list[_Traj] = []
    p = t.parent
    while p is not None and p not in out:
        out.append(p)
        p = p.parent
    return out


def _with_api(r: Request, api_s: float) -> Request:
    from dataclasses import replace

    return replace(r, api_time_s=api_s)


def _offset_s(ts: float | None, origin: float | None) -> float:
    return 0.0 if ts is None or origin is None else (ts - origin) / 1000.0


def _hash_ids(raw: object) -> HashIds | None:
    """``raw`` as int64 hash ids (None: not a list of integers in [0, 2**63))."""
    if not isinstance(raw, list):
        return None
    if not raw:
        return _NO_IDS
    try:
        arr = np.array(raw)
    except (ValueError, TypeError, OverflowError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.min() < 0:
        return None
    if arr.dtype.kind == "u" and arr.max() >= 2**63:
        return None
    return arr.astype(np.int64, copy=False)


def _nonneg(v: object) -> bool:
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
    )


def read_agentic_rows(
    path: Path, rows: Iterable[tuple[int, object]]
) -> tuple[list[Session], list[Problem]]:
    """Session trees from agentic Mooncake rows (line number, parsed JSON value).

    Rows of one ``session_id`` are one session, in file order (a row without one is
    a session of its own, as Dynamo reads it). A session's first row waiting for a
    request of another session (or listed in that request's ``branches``) makes it
    a subagent spawned after that request; the first later row of the parent that
    waits for one of its requests is its join (none: it runs in the background). A
    gap is ``delay`` + ``tool_wait_ms`` after the dependencies end. Hash ids are one
    id space for the file; the block size is the rows' ``block_size`` (written by
    :func:`agentic_rows`), else the one every row's ids fit.
    """
    reader = _Reader(path)
    for line, obj in rows:
        reader.add(line, obj)
    sessions = reader.trace()
    if not reader.problems and not sessions:
        reader.bad(1, None, "no rows")
    return sessions, reader.problems


# -- writing -------------------------------------------------------------------


def _unique_ids(sessions: Iterable[Session]) -> HashIds:
    parts = [r.hash_ids for s in sessions for r in s.requests]
    return np.unique(np.concatenate(parts)) if parts else _NO_IDS


class _Ids:
    """Hash ids of every tree mapped into one id space from 0 (Dynamo reads the
    file's ids as one): the ids of one namespace (a tree, or all global-scope
    trees) keep their sharing, and nothing else shares."""

    def __init__(self, trace: Trace, block: int) -> None:
        self.block = block
        self.global_ids = _unique_ids(
            s for root in trace.sessions if root.hash_id_scope == "global"
            for s, _ in root.walk()
        )  # fmt: skip
        self.next_id = int(self.global_ids.size)

    def tree(self, root: Session) -> Callable[[Request], HashIds]:
        """The id map of ``root``'s tree (its namespace's ids, in value order)."""
        if root.hash_id_scope == "global":
            known, base = self.global_ids, 0
        else:
            known, base = _unique_ids(s for s, _ in root.walk()), self.next_id
            self.next_id += int(known.size)

        def ids(req: Request) -> HashIds:
            out = base + np.searchsorted(known, req.hash_ids)
            # Tokens the trace leaves unhashed (a partial last block): their own
            # content, as Dynamo needs an id for every started block.
            missing = -(-req.input_tokens // self.block) - int(out.size)
            if missing <= 0:
                return out
            tail = np.arange(self.next_id, self.next_id + missing, dtype=np.int64)
            self.next_id += missing
            return np.concatenate((out, tail))

        return ids


def agentic_rows(trace: Trace) -> tuple[int, Iterator[dict[str, Any]]]:
    """(block size, the rows) of ``trace`` as agentic Mooncake.

    Each session is a ``session_id``; request ``i`` waits for request ``i - 1``, a
    subagent's first request for its anchor (listed in the anchor's ``branches``),
    and a join request also for the subagent's last request. ``delay`` is the think
    gap; ``timestamp`` the request's time on the trace's timeline (trees without one
    start at 0); ``block_size``, a field Dynamo's reader ignores (it takes the size
    as a flag), lets this module's reader know it rather than infer it. Raises
    TraceError for sessions of different block sizes or a session id used twice.
    """
    sizes = {s.block_size for s, _ in trace.all_sessions()}
    if len(sizes) > 1:
        raise TraceError(
            f"sessions have block sizes {', '.join(map(str, sorted(sizes)))}; "
            "agentic Mooncake rows carry one"
        )
    block = sizes.pop() if sizes else 64
    names: set[str] = set()
    for s, _ in trace.all_sessions():
        if s.session_id in names:
            raise TraceError(
                f"session id {s.session_id!r} is used twice; agentic Mooncake "
                "sessions are named by it"
            )
        names.add(s.session_id)
    return block, _rows(trace, _Ids(trace, block))


def _rid(session: Session, i: int) -> str:
    return f"{session.session_id}:{i}"


def _rows(trace: Trace, ids: _Ids) -> Iterator[dict[str, Any]]:
    for root in trace.sessions:
        yield from _session_rows(root, ids.tree(root), root.start_s or 0.0, None)


def _session_rows(
    s: Session,
    ids: Callable[[Request], HashIds],
    start_s: float,
    spawn: tuple[Session, Subagent] | None,
) -> Iterator[dict[str, Any]]:
    joins: dict[int, list[str]] = {}
    for sub in s.subagents:
        last = len(sub.session.requests) - 1
        if sub.join_index is not None and last >= 0:
            joins.setdefault(sub.join_index, []).append(_rid(sub.session, last))
    for sub in s.subagents_at(-1):
        yield from _session_rows(sub.session, ids, start_s + sub.t_s, None)
    for i, req in enumerate(s.requests):
        wait_for: list[str] = []
        if i > 0:
            wait_for.append(_rid(s, i - 1))
        elif spawn is not None:
            wait_for.append(_rid(spawn[0], spawn[1].anchor_index))
        wait_for.extend(joins.get(i, ()))
        subs = s.subagents_at(i)
        row: dict[str, Any] = {
            "request_id": _rid(s, i),
            "session_id": s.session_id,
            "input_length": req.input_tokens,
            "output_length": req.output_tokens,
            "hash_ids": ids(req),
            "timestamp": (start_s + req.t_s) * 1000.0,
        }
        if wait_for:
            # Dynamo's split of the gap: the tool part (where known) apart.
            tool = req.tool_wait_s or 0.0
            row["delay"] = (req.think_time_s - tool) * 1000.0
            if req.tool_wait_s is not None:
                row["tool_wait_ms"] = tool * 1000.0
            row["wait_for"] = wait_for
        branches = [_rid(sub.session, 0) for sub in subs if sub.session.requests]
        if branches:
            row["branches"] = branches
        row["prefix_reset"] = i == 0
        row["block_size"] = s.block_size  # beyond Dynamo's fields: it ignores it
        yield row
        for sub in subs:
            yield from _session_rows(sub.session, ids, start_s + sub.t_s, (s, sub))
