"""Reading and writing trace files; the format is detected from the content.

Readers: Weka/AgentX (one session per ``.json``, a folder of them, a ``traces.jsonl``
with one session per line, gzip allowed), Mooncake JSONL, Alibaba's Bailian JSONL,
BurstGPT CSV, native JSONL (Weka-compatible) and the Parquet trace store.
``read_trace`` loads all or nothing: every problem is collected and raised together,
so nothing half-loaded is ever replayed.
"""

from __future__ import annotations

import gc
import gzip
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from traces.bailian import looks_like_bailian, read_bailian
from traces.burstgpt import looks_like_burstgpt, read_burstgpt
from traces.errors import Problem, TraceError, TraceFormatError
from traces.model import Request, Session, Trace
from traces.mooncake import build_sessions, looks_like_mooncake, parse_mooncake_line
from traces.source import read_file_bytes
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


def _parse_file(path: Path, problems: list[Problem]) -> tuple[list[Session], str]:
    if path.name.endswith(".parquet"):
        from traces.store import read_store

        return list(read_store(path).sessions), "parquet"
    data = read_file_bytes(path)
    stripped = data.lstrip()
    if not stripped:
        problems.append(Problem(path=path, reason="empty file"))
        return [], "weka"
    first_line = stripped.split(b"\n", 1)[0]
    # A JSON first line (a whole Weka session, ~1 MB) is no CSV header: not split.
    if first_line[:1] not in (b"{", b"[") and looks_like_burstgpt(first_line):
        return _parse_other(read_burstgpt, path, problems), "burstgpt"
    whole_error: orjson.JSONDecodeError | None = None
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        whole, whole_error = _NOT_ONE_DOCUMENT, exc
    if isinstance(whole, dict) and not looks_like_mooncake(whole):
        # One session per file (the Weka corpus layout), pretty-printed or not.
        session, probs = parse_session(
            whole, path=path, line=None, fallback_id=path.stem
        )
        problems.extend(probs)
        return ([session] if session else []), "weka"
    if isinstance(whole, list):
        return _parse_session_list(path, whole, problems), "weka"
    try:
        first = orjson.loads(first_line)
    except orjson.JSONDecodeError as line_error:
        # Not JSONL either: one (pretty-printed) document, whose own error has the
        # line that is really wrong.
        err = whole_error or line_error
        problems.append(_json_error(path, err.lineno, err))
        return [], "native"
    # Bailian rows carry Mooncake's timestamp and input_length too: asked first.
    if looks_like_bailian(first):
        return _parse_other(read_bailian, path, problems), "bailian"
    if looks_like_mooncake(first):
        return _parse_mooncake(path, data, problems), "mooncake"
    sessions: list[Session] = []
    for lineno, line in _lines(data):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(_json_error(path, lineno, exc))
            continue
        session, probs = parse_session(
            obj, path=path, line=lineno, fallback_id=f"{path.stem}-{lineno}"
        )
        problems.extend(probs)
        if session is not None:
            sessions.append(session)
    return sessions, "native"


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


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for i, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield i, line


def _parse_mooncake(path: Path, data: bytes, problems: list[Problem]) -> list[Session]:
    items: list[tuple[str | None, float, Request]] = []
    for lineno, line in _lines(data):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(_json_error(path, lineno, exc))
            continue
        item, probs = parse_mooncake_line(obj, path=path, line=lineno)
        problems.extend(probs)
        if item is not None:
            items.append(item)
    return build_sessions(items)


def check_trace(path: Path) -> tuple[Trace | None, list[Problem]]:
    """Read ``path`` and return (trace, every problem found); trace is None on problems.

    Raises TraceError only when the path itself cannot be read.
    """
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
                got, fmt = _parse_file(f, problems)
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
    fmt = formats.pop() if len(formats) == 1 else "mixed"
    return Trace(sessions=tuple(sessions), source_format=fmt), []


def read_trace(path: Path | str) -> Trace:
    """Load the trace at ``path``; raise TraceFormatError listing every problem."""
    trace, problems = check_trace(Path(path))
    if trace is None:
        raise TraceFormatError(problems)
    return trace


def write_trace(trace: Trace, out: Path | str) -> Path:
    """Write ``trace`` as native JSONL (``.jsonl``, ``.jsonl.gz``) or a Parquet store
    (``.parquet``)."""
    out = Path(out)
    name = out.name
    if name.endswith(".parquet"):
        from traces.store import write_store

        write_store(trace, out)
        return out
    if not name.endswith((".jsonl", ".jsonl.gz")):
        raise TraceError(
            f"{out}: unknown output format; use .jsonl, .jsonl.gz or .parquet"
        )
    # One session at a time: a full AgentX corpus holds ~350M hash ids.
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = tmp.open("wb")
        sink = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
            if name.endswith(".gz")
            else raw
        )
        with raw, sink:
            for s in trace.sessions:
                sink.write(orjson.dumps(session_to_dict(s), option=opts))
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TraceError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    return out
