"""BurstGPT traces (github.com/HPMLL/BurstGPT: Azure OpenAI GPT traffic) → a Trace.
See docs/traces.md#formats."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from traces.errors import Problem, TraceError, TraceFormatError
from traces.importers.prefix import CONTEXT_GROWTH, GrowthIds
from traces.importers.threads import Call
from traces.model import Request, Session, Trace
from traces.source import read_file_bytes

DEFAULT_BLOCK_SIZE = 64
_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")


def looks_like_burstgpt(header: str | bytes) -> bool:
    """True when ``header`` (a CSV file's first line) names BurstGPT's columns."""
    if isinstance(header, bytes):
        header = header.decode("utf-8", "replace")
    names = {c.strip() for c in header.lstrip("\ufeff").strip().split(",")}
    return set(_REQUIRED) <= names


@dataclass(slots=True)
class _Row:
    line: int
    session: str | None
    ts: float
    elapsed: float | None
    model: str | None
    log_type: str | None
    input_tokens: int
    output_tokens: int


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _count(text: str) -> int | None:
    v = _number(text)
    return int(v) if v is not None and v.is_integer() else None


def _rows(path: Path, text: str, problems: list[Problem]) -> list[_Row]:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header = next(reader, None)
    if header is None:
        problems.append(Problem(path=path, reason="empty file"))
        return []
    col = {name.strip(): i for i, name in enumerate(header)}
    missing = [c for c in _REQUIRED if c not in col]
    if missing:
        problems.append(
            Problem(
                path=path,
                line=1,
                field=missing[0],
                reason=f"missing column(s) {', '.join(missing)} (a BurstGPT CSV has "
                "Timestamp, Request tokens, Response tokens, ...)",
            )
        )
        return []
    rows: list[_Row] = []
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue

        def cell(name: str, cells: list[str] = cells) -> str | None:
            i = col.get(name)
            return cells[i].strip() if i is not None and i < len(cells) else None

        def bad(fld: str, reason: str, line: int = line) -> None:
            problems.append(Problem(path=path, line=line, field=fld, reason=reason))

        n = len(problems)
        ts = _number(cell("Timestamp") or "")
        if ts is None:
            bad("Timestamp", f"expected seconds >= 0, got {cell('Timestamp')!r}")
        tokens = {}
        for name in ("Request tokens", "Response tokens"):
            tokens[name] = _count(cell(name) or "")
            if tokens[name] is None:
                bad(name, f"expected a non-negative integer, got {cell(name)!r}")
        total = cell("Total tokens")
        if total and None not in tokens.values():
            want = (tokens["Request tokens"] or 0) + (tokens["Response tokens"] or 0)
            if _count(total) != want:
                bad(
                    "Total tokens",
                    f"{total} != Request tokens + Response tokens ({want})",
                )
        elapsed_text = cell("Elapsed time")
        elapsed = _number(elapsed_text) if elapsed_text else None
        if elapsed_text and elapsed is None:
            bad("Elapsed time", f"expected seconds >= 0, got {elapsed_text!r}")
        if len(problems) > n or ts is None:
            continue
        rows.append(
            _Row(
                line=line,
                session=cell("Session ID") or None,
                ts=ts,
                elapsed=elapsed,
                model=cell("Model") or None,
                log_type=cell("Log Type") or None,
                input_tokens=tokens["Request tokens"] or 0,
                output_tokens=tokens["Response tokens"] or 0,
            )
        )
    return rows


def _session(sid: str, rows: list[_Row], t0: float, block_size: int) -> Session:
    rows.sort(key=lambda r: r.ts)
    calls = [
        Call(
            input_tokens=r.input_tokens,
            output_tokens=r.output_tokens,
            start=r.ts,
            end=None,
        )
        for r in rows
    ]
    ids = GrowthIds(block_size).thread(calls)
    start = rows[0].ts
    reqs = []
    prev_end: float | None = None
    for r, hash_ids in zip(rows, ids, strict=True):
        reqs.append(
            Request(
                input_tokens=r.input_tokens,
                output_tokens=r.output_tokens,
                hash_ids=hash_ids,
                t_s=round(r.ts - start, 3),
                think_time_s=(
                    0.0 if prev_end is None else round(max(0.0, r.ts - prev_end), 3)
                ),
                api_time_s=r.elapsed,
                model=r.model,
                extra={"log_type": r.log_type} if r.log_type else {},
            )
        )
        prev_end = r.ts + (r.elapsed or 0.0)
    return Session(
        session_id=sid,
        requests=tuple(reqs),
        block_size=block_size,
        start_s=round(start - t0, 3),
        models=tuple(dict.fromkeys(r.model for r in rows if r.model)),
        extra={"hash_rule": CONTEXT_GROWTH},
    )


def read_burstgpt(path: Path | str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> Trace:
    """Load a BurstGPT CSV (gzip allowed); raise TraceFormatError listing every
    problem (file, line, field).

    Schema, as published: CSV with a header. Release v1.1 has ``Timestamp, Model,
    Request tokens, Response tokens, Total tokens, Log Type``; release v2.0 adds
    ``Session ID`` and ``Elapsed time`` after ``Timestamp``. Columns are found by name,
    so both read. ``Timestamp`` is seconds (not zero-based: the trace's first request
    becomes 0); ``Request tokens`` / ``Response tokens`` are input / output lengths
    (``Total tokens`` is their sum); ``Elapsed time`` is the request's response time in
    seconds; ``Model`` is ``ChatGPT`` or ``GPT-4``; ``Log Type`` is ``Conversation log``
    or ``API log`` (kept as ``log_type``). Rows with 0 response tokens are the release's
    failed requests; they are kept as they are.

    Sessions: rows sharing a ``Session ID`` form one session in time order; without that
    column (or with an empty value) each row is a session of its own. A request's think
    time is the gap from the end of the previous request of its session (its arrival
    plus ``Elapsed time``) to its own arrival. BurstGPT publishes no prefix structure:
    block ids follow the importers' ``context-growth`` rule
    (``traces.importers.prefix``), each request of a session extending the previous one,
    with ``block_size``-token blocks.
    """
    path = Path(path)
    if block_size < 1:
        raise TraceError(f"block size must be >= 1 (got {block_size})")
    data = read_file_bytes(path)
    problems: list[Problem] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
    rows = _rows(path, text, problems)
    if problems:
        raise TraceFormatError(problems)
    if not rows:
        raise TraceFormatError([Problem(path=path, reason="no requests in the file")])
    t0 = min(r.ts for r in rows)
    groups: dict[str, list[_Row]] = {}
    for r in rows:
        groups.setdefault(r.session or f"burstgpt-{r.line}", []).append(r)
    sessions = sorted(
        (_session(sid, g, t0, block_size) for sid, g in groups.items()),
        key=lambda s: s.start_s or 0.0,
    )
    return Trace(sessions=tuple(sessions), source_format="burstgpt")
