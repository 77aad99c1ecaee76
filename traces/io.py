"""Reading and writing trace files, the format detected from the content. ``read_trace``
loads all or nothing: every problem is collected and raised together, so nothing
half-loaded is replayed. See docs/traces.md#formats."""

from __future__ import annotations

import gc
import gzip
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from traces.agentic_mooncake import (
    agentic_rows,
    looks_like_agentic_mooncake,
    read_agentic_rows,
)
from traces.bailian import looks_like_bailian, read_bailian
from traces.burstgpt import looks_like_burstgpt, read_burstgpt
from traces.errors import Problem, TraceError, TraceFormatError
from traces.model import Request, Session, Trace
from traces.mooncake import (
    MooncakeRows,
    build_sessions,
    looks_like_mooncake,
    parse_mooncake_line,
)
from traces.otel import looks_like_otlp, read_otlp
from traces.source import file_lines, read_file_bytes
from traces.weka import parse_session, session_to_dict

_NOT_ONE_DOCUMENT = object()
_TRACE_SUFFIXES = (
    ".json",
    ".jsonl",
    ".json.gz",
    ".jsonl.gz",
    ".csv",
    ".csv.gz",
    ".parquet",
)


def trace_files(path: Path) -> list[Path]:
    """The files that make up the trace at ``path`` (a file or a folder)."""
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    files = sorted(
        p for p in path.iterdir() if p.is_file() and p.name.endswith(_TRACE_SUFFIXES)
    )
    if not files:
        raise TraceError(
            f"{path}: folder holds no trace files ({', '.join(_TRACE_SUFFIXES)})"
        )
    return files


def _json_error(path: Path, line: int | None, exc: orjson.JSONDecodeError) -> Problem:
    return Problem(path=path, line=line, reason=f"malformed JSON: {exc}")


@dataclass(frozen=True, slots=True)
class _Reading:
    """How a trace is read, and where what the reading noticed is said."""

    mooncake_rows: MooncakeRows = "auto"
    notes: list[str] | None = None


def _parse_file(
    path: Path, problems: list[Problem], how: _Reading
) -> tuple[list[Session], str]:
    if path.name.endswith(".parquet"):
        from traces.store import read_store

        return list(read_store(path).sessions), "parquet"
    with file_lines(path) as lines:
        head = next(((n, line) for n, line in lines if line.strip()), None)
        if head is None:
            problems.append(Problem(path=path, reason="empty file"))
            return [], "weka"
        first_line = head[1].strip()
        # A JSON first line (a whole Weka session, ~1 MB) is no CSV header: not split.
        if first_line[:1] not in (b"{", b"[") and looks_like_burstgpt(first_line):
            return _parse_other(read_burstgpt, path, problems), "burstgpt"
        try:
            first = orjson.loads(first_line)
        except orjson.JSONDecodeError:
            first = _NOT_ONE_DOCUMENT
        if first is not _NOT_ONE_DOCUMENT:
            second = next(((n, line) for n, line in lines if line.strip()), None)
            if second is not None:
                # One JSON value a line: read line by line, as the file streams.
                rest = itertools.chain([second], lines)
                return _parse_jsonl(path, (head[0], first), rest, problems, how)
    # One document (pretty-printed, or alone on its line), or not JSON at all.
    data = read_file_bytes(path)
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problems.append(_json_error(path, exc.lineno, exc))
        return [], "native"
    if looks_like_otlp(whole):
        return _parse_otlp(path, [(None, whole)], problems), "otlp"
    if (
        isinstance(whole, dict)
        and not looks_like_mooncake(whole)
        and not looks_like_agentic_mooncake(whole)
    ):
        # One session per file (the Weka corpus layout), pretty-printed or not.
        session, probs = parse_session(
            whole, path=path, line=None, fallback_id=path.stem
        )
        problems.extend(probs)
        return ([session] if session else []), "weka"
    if isinstance(whole, list):
        return _parse_session_list(path, whole, problems), "weka"
    return _parse_jsonl(path, (head[0], whole), iter(()), problems, how)


def _parse_jsonl(
    path: Path,
    first: tuple[int, object],
    rest: Iterator[tuple[int, bytes]],
    problems: list[Problem],
    how: _Reading,
) -> tuple[list[Session], str]:
    """JSON Lines, the first line's value already read: Bailian, agentic Mooncake,
    Mooncake, OTLP spans or native sessions, by that first value."""
    # Bailian rows carry Mooncake's timestamp and input_length too: asked first;
    # agentic Mooncake rows are Mooncake rows with a request_id: asked before.
    if looks_like_bailian(first[1]):
        return _parse_other(read_bailian, path, problems), "bailian"
    values = itertools.chain([first], _json_lines(path, rest, problems))
    if looks_like_agentic_mooncake(first[1]):
        rows, probs = read_agentic_rows(path, values)
        problems.extend(probs)
        return rows, "agentic_mooncake"
    if looks_like_otlp(first[1]):
        return _parse_otlp(path, values, problems), "otlp"
    if looks_like_mooncake(first[1]):
        items: list[tuple[str | None, float, Request]] = []
        for lineno, obj in values:
            item, probs = parse_mooncake_line(obj, path=path, line=lineno)
            problems.extend(probs)
            if item is not None:
                items.append(item)
        built = build_sessions(
            items, rows=how.mooncake_rows, notes=how.notes, path=path
        )
        return built, "mooncake"
    sessions: list[Session] = []
    for lineno, obj in values:
        session, probs = parse_session(
            obj, path=path, line=lineno, fallback_id=f"{path.stem}-{lineno}"
        )
        problems.extend(probs)
        if session is not None:
            sessions.append(session)
    return sessions, "native"


def _parse_otlp(
    path: Path, values: Iterable[tuple[int | None, object]], problems: list[Problem]
) -> list[Session]:
    sessions, probs = read_otlp(path, values)
    problems.extend(probs)
    return sessions


def _parse_other(
    reader: Callable[[Path], Trace], path: Path, problems: list[Problem]
) -> list[Session]:
    """A reader of its own format (Bailian, BurstGPT), its problems collected."""
    try:
        return list(reader(path).sessions)
    except TraceFormatError as exc:
        problems.extend(exc.problems)
        return []


def _parse_session_list(
    path: Path, objs: list[object], problems: list[Problem]
) -> list[Session]:
    sessions: list[Session] = []
    for i, obj in enumerate(objs):
        session, probs = parse_session(
            obj, path=path, line=None, fallback_id=f"{path.stem}-{i}"
        )
        problems.extend(probs)
        if session is not None:
            sessions.append(session)
    return sessions


def _json_lines(
    path: Path, lines: Iterator[tuple[int, bytes]], problems: list[Problem]
) -> Iterator[tuple[int, object]]:
    """Each non-blank line's JSON value with its line number; a line that is not
    JSON is a problem, and the next one is read."""
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(_json_error(path, lineno, exc))
            continue
        yield lineno, obj


def check_trace(
    path: Path,
    *,
    mooncake_rows: MooncakeRows = "auto",
    notes: list[str] | None = None,
) -> tuple[Trace | None, list[Problem]]:
    """Read ``path`` and return (trace, every problem found); trace is None on problems.

    ``mooncake_rows``: how Mooncake session rows are read (see
    :func:`traces.mooncake.build_sessions`); ``notes`` collects what the reading
    noticed and the reader should hear (how auto read the rows).
    Raises TraceError only when the path itself cannot be read.
    """
    how = _Reading(mooncake_rows=mooncake_rows, notes=notes)
    problems: list[Problem] = []
    sessions: list[Session] = []
    formats: set[str] = set()
    files = trace_files(path)
    # Parsing allocates millions of objects that all survive: cyclic GC passes over
    # them would cost more than the parse itself.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    seen: dict[str, Path] = {}
    try:
        for f in files:
            try:
                got, fmt = _parse_file(f, problems, how)
            except TraceFormatError as exc:  # a trace store's rows
                problems.extend(exc.problems)
                continue
            except TraceError as exc:  # unreadable, bad gzip, not a trace store
                problems.append(Problem(path=f, reason=str(exc).removeprefix(f"{f}: ")))
                continue
            sessions.extend(got)
            formats.add(fmt)
            for s in got:
                if s.session_id in seen:
                    first = seen[s.session_id]
                    problems.append(
                        Problem(
                            path=f,
                            session_id=s.session_id,
                            field="id",
                            reason="duplicate session id"
                            + ("" if first == f else f" (first in {first})"),
                        )
                    )
                else:
                    seen[s.session_id] = f
    finally:
        if gc_was_enabled:
            gc.enable()
    if problems:
        return None, problems
    if not sessions:
        return None, [Problem(path=path, reason="trace holds no sessions")]
    trace = Trace(sessions=tuple(sessions), source_format="")
    if trace.request_count() == 0:
        # Nothing to replay: a run of it would record an empty folder as a result.
        return None, [Problem(path=path, reason="trace holds no requests")]
    fmt = formats.pop() if len(formats) == 1 else "mixed"
    return Trace(sessions=trace.sessions, source_format=fmt), []


def read_trace(
    path: Path | str,
    *,
    mooncake_rows: MooncakeRows = "auto",
    notes: list[str] | None = None,
) -> Trace:
    """Load the trace at ``path``; raise TraceFormatError listing every problem.
    ``mooncake_rows`` and ``notes``: as :func:`check_trace`."""
    trace, problems = check_trace(Path(path), mooncake_rows=mooncake_rows, notes=notes)
    if trace is None:
        raise TraceFormatError(problems)
    return trace


OutFormat = Literal["native", "agentic-mooncake"]
OUT_FORMATS: tuple[OutFormat, ...] = ("native", "agentic-mooncake")


def write_trace(trace: Trace, out: Path | str, *, to: OutFormat = "native") -> Path:
    """Write ``trace`` as native JSONL (``.jsonl``, ``.jsonl.gz``) or a Parquet store
    (``.parquet``); ``to="agentic-mooncake"``: as Dynamo's agentic Mooncake rows
    (``.jsonl``, ``.jsonl.gz``; see :func:`traces.agentic_mooncake.agentic_rows`)."""
    out = Path(out)
    name = out.name
    if to == "native" and name.endswith(".parquet"):
        from traces.store import write_store

        write_store(trace, out)
        return out
    if not name.endswith((".jsonl", ".jsonl.gz")):
        raise TraceError(
            f"{out}: unknown output format; use .jsonl, .jsonl.gz"
            + (" or .parquet" if to == "native" else f" for {to}")
        )
    if to == "agentic-mooncake":
        _, objs = agentic_rows(trace)
        _write_jsonl(out, objs)
    else:
        # One session at a time: a full AgentX corpus holds ~350M hash ids.
        _write_jsonl(out, (session_to_dict(s) for s in trace.sessions))
    return out


def _write_jsonl(out: Path, objs: Iterable[object]) -> None:
    """``objs`` one a line into ``out`` (gzip for ``.gz``), whole or not at all."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = tmp.open("wb")
        sink = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
            if out.name.endswith(".gz")
            else raw
        )
        with raw, sink:
            for obj in objs:
                sink.write(orjson.dumps(obj, option=opts))
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TraceError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
