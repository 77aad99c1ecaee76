"""The Mooncake trace format: one request per JSON line, no sessions.
See docs/traces.md#formats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from traces.errors import Problem
from traces.model import MAX_TOKENS, Request, Session
from traces.table import RequestTable

MOONCAKE_BLOCK_SIZE = 512
_KNOWN = frozenset(
    {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "chat_id"}
)


def looks_like_mooncake(obj: object) -> bool:
    """True when ``obj`` (one parsed line) has Mooncake's request fields."""
    return isinstance(obj, dict) and "input_length" in obj and "timestamp" in obj


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
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_TOKENS:
            problems.append(
                _problem(
                    path,
                    line,
                    key,
                    f"expected an integer in [0, {MAX_TOKENS:,}], got {v!r:.40}",
                )
            )
            v = 0
        vals[key] = v
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        problems.append(
            _problem(path, line, "timestamp", f"expected a number >= 0, got {ts!r}")
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


def build_sessions(items: list[tuple[str | None, float, Request]]) -> list[Session]:
    """Sessions from parsed lines: one per line, or one per group id (at the place of
    its first line); all rows of one table."""
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
