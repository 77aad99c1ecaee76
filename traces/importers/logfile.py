"""Finding agent log files and reading their records, tolerating live logs (every skip
counted in :class:`ImportReport`). Owns no knowledge of any agent's record schema.
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

import glob
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from traces.errors import TraceError
from traces.source import read_file_bytes

LOG_SUFFIXES = (".jsonl", ".jsonl.gz", ".json")
_GLOB_CHARS = re.compile(r"[*?\[]")
_SEPARATOR = re.compile(rb"^===== record (\d+) =====[ \t]*\r?$", re.MULTILINE)

PARTIAL_LAST_LINE = "partial last line (the log is still being written)"
MALFORMED_LINE = "malformed JSON line"
NOT_AN_OBJECT = "record is not a JSON object"


@dataclass(slots=True)
class SkipCount:
    """How often one reason applied, and where first."""

    count: int
    first: str  # "path:line"


@dataclass(slots=True)
class ImportReport:
    """What an import read, produced and skipped. Paths appear here (for the user's
    terminal) and never in the trace."""

    source: str
    files: list[Path] = field(default_factory=list)
    records: int = 0
    calls: int = 0
    sessions: int = 0
    subagent_sessions: int = 0
    hash_rule: str = ""
    skipped: dict[str, SkipCount] = field(default_factory=dict)
    skipped_by_file: dict[Path, Counter[str]] = field(default_factory=dict)

    def skip(self, path: Path, line: int | None, reason: str) -> None:
        """Record one skipped record (or line) and why."""
        where = f"{path}:{line}" if line is not None else str(path)
        entry = self.skipped.get(reason)
        if entry is None:
            self.skipped[reason] = SkipCount(1, where)
        else:
            entry.count += 1
        self.skipped_by_file.setdefault(path, Counter())[reason] += 1

    def summary_lines(self) -> list[str]:
        """One line per skip reason, most frequent first."""
        items = sorted(self.skipped.items(), key=lambda kv: (-kv[1].count, kv[0]))
        return [
            f"skipped {s.count:,} x {reason} (first: {s.first})" for reason, s in items
        ]


def expand_paths(patterns: Sequence[str | Path]) -> list[Path]:
    """The log files named by ``patterns`` (files, folders, globs), in order, once."""
    out: dict[Path, None] = {}
    for pattern in patterns:
        p = Path(pattern).expanduser()
        matches: list[Path]
        if p.exists():
            matches = [p]
        elif _GLOB_CHARS.search(str(pattern)):
            # Path.glob takes no absolute pattern; a user's glob often is one.
            names = glob.glob(str(p), recursive=True)  # noqa: PTH207
            matches = [Path(m) for m in sorted(names)]
            if not matches:
                raise TraceError(f"{pattern}: the pattern matches no file or folder")
        else:
            raise TraceError(f"{pattern}: no such file or folder")
        for m in matches:
            if m.is_dir():
                found = sorted(
                    f
                    for f in m.rglob("*")
                    if f.is_file() and f.name.endswith(LOG_SUFFIXES)
                )
                if not found and len(matches) == 1:
                    raise TraceError(
                        f"{m}: folder holds no log files ({', '.join(LOG_SUFFIXES)})"
                    )
                out.update(dict.fromkeys(found))
            elif m.is_file():
                out[m] = None
    if not out:
        raise TraceError("no log files found in " + ", ".join(map(str, patterns)))
    return list(out)


def _is_record_view(data: bytes) -> bool:
    for line in data.splitlines():
        s = line.strip()
        if not s or s.startswith(b"#"):
            continue
        return s.startswith(b"===== record ")
    return False


def read_records(
    path: Path, report: ImportReport
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) for every usable record of ``path``; the rest is reported.

    A PATH is a file, a folder (searched recursively for ``.jsonl``, ``.jsonl.gz`` and
    ``.json`` files) or a glob (``**`` allowed). A log is JSONL, one record per line, or
    the "record view" TraceLab publishes (records pretty-printed between ``===== record
    NNNN =====`` separators, ``#`` header lines). A log may still be being written: a
    partial last line is skipped, and so is any other line or record that cannot be
    used; :class:`ImportReport` counts every skip by reason, with the first place it
    happened. Owns no knowledge of any agent's record schema.
    """
    data = read_file_bytes(path)
    if _is_record_view(data):
        yield from _record_view(path, data, report)
        return
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            last = i == len(lines) and not complete
            report.skip(path, i, PARTIAL_LAST_LINE if last else MALFORMED_LINE)
            continue
        report.records += 1
        if not isinstance(obj, dict):
            report.skip(path, i, NOT_AN_OBJECT)
            continue
        yield i, obj


def _record_view(
    path: Path, data: bytes, report: ImportReport
) -> Iterator[tuple[int, dict[str, Any]]]:
    marks = list(_SEPARATOR.finditer(data))
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(data)
        line = data.count(b"\n", 0, m.start()) + 2  # the record's first line
        try:
            obj = orjson.loads(data[m.end() : end])
        except orjson.JSONDecodeError:
            last = k == len(marks) - 1
            report.skip(path, line, PARTIAL_LAST_LINE if last else MALFORMED_LINE)
            continue
        report.records += 1
        if not isinstance(obj, dict):
            report.skip(path, line, NOT_AN_OBJECT)
            continue
        yield line, obj


def parse_time(value: object) -> float | None:
    """ISO-8601 time (``Z`` allowed) as epoch seconds, None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def count(value: object) -> int | None:
    """A token count: a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
