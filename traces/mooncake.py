"""The Mooncake trace format: one request per JSON line, no sessions.
See docs/traces.md#formats."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from traces.errors import Problem
from traces.model import MAX_SECONDS, MAX_TOKENS, Request, Session
from traces.table import RequestTable

MOONCAKE_BLOCK_SIZE = 512
_KNOWN = frozenset(
    {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "chat_id"}
)


def looks_like_mooncake(obj: object) -> bool:
    """True when ``obj`` (one parsed line) has Mooncake's request fields."""
    return isinstance(obj, dict) and "input_length" in obj and "timestamp" in obj


def count_problem(v: object) -> str | None:
    """Why ``v`` is not a token count (None: it is one)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKENS:
        return None
    return f"expected an integer in [0, {MAX_TOKENS:,}], got {v!r:.40}"


def _problem(path: Path, line: int, fld: str | None, reason: str) -> Problem:
    return Problem(path=path, line=line, request_index="0", field=fld, reason=reason)


def parse_mooncake_line(
    obj: object, *, path: Path, line: int
) -> tuple[tuple[str | None, float, Request] | None, list[Problem]]:
    """One line → (group id or None, arrival seconds, request) and its problems.

    Fields: ``timestamp`` (ms from trace start), ``input_length``, ``output_length``,
    ``hash_ids`` (512-token blocks, the partial tail hashed too, one id space for the
    whole file). Each line becomes a one-request session arriving at its timestamp;
    lines that carry a ``session_id`` (or ``chat_id``) are grouped into one session per
    id instead. The sessions of a file hold rows of one request table.
    """
    problems: list[Problem] = []
    if not isinstance(obj, dict):
        return None, [_problem(path, line, None, "expected a JSON object")]
    vals: dict[str, int] = {}
    for key in ("input_length", "output_length"):
        v = obj.get(key)
        why = count_problem(v)
        if why is not None:
            problems.append(_problem(path, line, key, why))
        vals[key] = v if why is None and isinstance(v, int) else 0
    ts = obj.get("timestamp")
    if (
        not isinstance(ts, int | float)
        or isinstance(ts, bool)
        or not 0 <= ts <= MAX_SECONDS * 1e3  # ms; nan fails it too
    ):
        problems.append(
            _problem(
                path,
                line,
                "timestamp",
                f"expected a number in [0, {MAX_SECONDS * 1e3:,.0f}] ms, "
                f"got {ts!r:.40}",
            )
        )
        ts = 0
    raw = obj.get("hash_ids", [])
    ids = np.zeros(0, dtype=np.int64)
    if not isinstance(raw, list):
        problems.append(_problem(path, line, "hash_ids", "expected a list"))
    elif raw:
        try:
            arr = np.array(raw)
        except (ValueError, TypeError, OverflowError):
            arr = np.zeros(0, dtype=object)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            problems.append(
                _problem(path, line, "hash_ids", "expected a list of integers")
            )
        else:
            ids = arr.astype(np.int64, copy=False)
            n_in = vals["input_length"]
            full = n_in // MOONCAKE_BLOCK_SIZE
            ceil = -(-n_in // MOONCAKE_BLOCK_SIZE)
            if ids.size not in (full, ceil):
                problems.append(
                    _problem(
                        path,
                        line,
                        "hash_ids",
                        f"{ids.size} blocks do not fit input_length={n_in} with "
                        f"{MOONCAKE_BLOCK_SIZE}-token blocks (expected {ceil})",
                    )
                )
    group = obj.get("session_id", obj.get("chat_id"))
    extra: Mapping[str, Any] = {k: v for k, v in obj.items() if k not in _KNOWN}
    req = Request(
        input_tokens=vals["input_length"],
        output_tokens=vals["output_length"],
        hash_ids=ids,
        extra=extra,
    )
    return (None if group is None else str(group), float(ts) / 1000.0, req), problems


MooncakeRows = Literal["auto", "delta", "cumulative"]
MOONCAKE_ROWS: tuple[MooncakeRows, ...] = ("auto", "delta", "cumulative")


@dataclass(frozen=True, slots=True)
class RowHistory:
    """How a Mooncake file's session rows relate: ``contained`` of the ``followups``
    (rows after a first whose previous row has a full block) start with all of their
    previous row's full blocks, as cumulative rows do; delta rows hold only the new
    turn."""

    followups: int
    contained: int

    @property
    def cumulative(self) -> bool:
        """Whether the rows look cumulative (at least half hold their history)."""
        return 2 * self.contained >= self.followups

    def describe(self) -> str:
        kind = "cumulative" if self.cumulative else "delta"
        return (
            f"session rows look {kind}: {self.contained:,} of {self.followups:,} "
            "follow-up rows start with their previous row's blocks"
        )


def row_history(groups: Iterable[list[Request]]) -> RowHistory:
    """Hash-prefix containment across each session's consecutive rows."""
    followups = contained = 0
    for reqs in groups:
        for prev, cur in itertools.pairwise(reqs):
            full = prev.input_tokens // MOONCAKE_BLOCK_SIZE
            head = prev.hash_ids[:full]
            if head.size == 0:
                continue
            followups += 1
            if cur.hash_ids.size >= head.size and np.array_equal(
                cur.hash_ids[: head.size], head
            ):
                contained += 1
    return RowHistory(followups, contained)


class _Accumulator:
    """Delta rows made full prompts, as a client that keeps the history sends them:
    row k's prompt is row k-1's prompt, its output, then row k's blocks. Blocks the
    first row holds keep their ids; a block made of other content (a row's blocks
    shifted off their boundaries, an output) gets a new id, one per distinct
    (previous block, content), so equal histories stay equal and ids stay chained."""

    def __init__(self, first_new_id: int) -> None:
        self.ids: dict[tuple[object, ...], int] = {}
        self.next_id = first_new_id

    def session(self, sid: str, reqs: list[Request]) -> list[Request]:
        b = MOONCAKE_BLOCK_SIZE
        first = reqs[0]
        full = first.input_tokens // b
        blocks = first.hash_ids[:full].tolist()
        pending: list[tuple[object, int, int]] = []  # (source, offset, length)
        tokens = full * b
        out = [first]
        for k, req in enumerate(reqs):
            if k == 0:
                segments = self._row_segments(first, start_block=full)
            else:
                segments = [(("out", sid, k - 1), 0, reqs[k - 1].output_tokens)]
                segments += self._row_segments(req, start_block=0)
            for src, off, length in segments:
                while length > 0:
                    room = b - sum(n for _, _, n in pending)
                    take = min(room, length)
                    pending.append((src, off, take))
                    off, length, tokens = off + take, length - take, tokens + take
                    if take == room:
                        blocks.append(self._id(blocks, pending))
                        pending = []
            if k == 0:
                continue
            ids = blocks + ([self._id(blocks, pending)] if pending else [])
            out.append(
                replace(
                    req,
                    input_tokens=tokens,
                    hash_ids=np.asarray(ids, dtype=np.int64),
                )
            )
        return out

    @staticmethod
    def _row_segments(req: Request, start_block: int) -> list[tuple[object, int, int]]:
        b = MOONCAKE_BLOCK_SIZE
        n = req.input_tokens
        ids = req.hash_ids.tolist()
        out: list[tuple[object, int, int]] = []
        for j in range(start_block, len(ids)):
            length = min(b, n - j * b)
            if length > 0:
                out.append((("h", ids[j]), 0, length))
        return out

    def _id(self, blocks: list[int], pending: list[tuple[object, int, int]]) -> int:
        key = (blocks[-1] if blocks else None, *pending)
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = self.next_id
            self.next_id += 1
        return got


def build_sessions(
    items: list[tuple[str | None, float, Request]],
    *,
    rows: MooncakeRows = "auto",
    notes: list[str] | None = None,
    path: Path | None = None,
) -> list[Session]:
    """Sessions from parsed lines: one per line, or one per group id (at the place of
    its first line); all rows of one table.

    ``rows``: how a session's rows after the first are read: "cumulative", each a
    full prompt; "delta", each the new turn only, the prompt then built from the
    history (previous prompt, its output, the row); "auto", as the hash-prefix
    containment across the rows says (:func:`row_history`). What auto decided, or a
    choice the rows contradict, is said in ``notes``."""
    entries: list[tuple[str, float, list[Request]]] = []
    groups: dict[str, tuple[float, list[Request]]] = {}
    for i, (group, arrival_s, req) in enumerate(items):
        if group is None:
            entries.append((f"mooncake-{i}", arrival_s, [req]))
        elif group in groups:
            start, reqs = groups[group]
            reqs.append(replace(req, t_s=arrival_s - start))
        else:
            groups[group] = (arrival_s, [replace(req, t_s=0.0)])
            entries.append((group, arrival_s, groups[group][1]))
    multi = [reqs for _, _, reqs in entries if len(reqs) > 1]
    history = row_history(multi)
    if history.followups:
        where = f"{path}: " if path is not None else ""
        if rows == "auto":
            rows = "cumulative" if history.cumulative else "delta"
            if notes is not None:
                notes.append(
                    f"{where}{history.describe()}; read as {rows} (--mooncake-rows "
                    "delta|cumulative to choose)"
                )
        elif (rows == "cumulative") != history.cumulative and notes is not None:
            twice = "counted twice" if rows == "delta" else "dropped"
            notes.append(
                f"{where}{history.describe()}, but --mooncake-rows {rows} reads "
                f"them otherwise: each prompt's history is {twice}"
            )
    if rows == "delta" and multi:
        top = max(
            (
                int(r.hash_ids.max())
                for _, _, rs in entries
                for r in rs
                if r.hash_ids.size
            ),
            default=-1,
        )
        acc = _Accumulator(top + 1)
        entries = [
            (sid, t, acc.session(sid, reqs) if len(reqs) > 1 else reqs)
            for sid, t, reqs in entries
        ]
    breaks = np.cumsum([0, *(len(reqs) for _, _, reqs in entries)]).tolist()
    table = RequestTable.from_requests(
        (r for _, _, reqs in entries for r in reqs), chain_breaks=breaks[:-1]
    )
    return [
        Session(
            session_id=sid,
            requests=table.rows(breaks[k], breaks[k + 1]),
            block_size=MOONCAKE_BLOCK_SIZE,
            hash_id_scope="global",
            start_s=arrival_s,
        )
        for k, (sid, arrival_s, _) in enumerate(entries)
    ]
