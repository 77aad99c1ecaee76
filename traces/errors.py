"""Errors raised while reading, validating or writing traces, rooted at
:class:`TraceError`. See docs/traces.md#inspecting-a-trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class TraceError(Exception):
    """Root of trace errors; the command line prints it as one line.

    * TraceError
      x TraceFormatError   one or more problems in a trace file; each names file,
                           line or session, request index and field
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a trace, located as precisely as the format allows."""

    path: Path
    line: int | None = None  # 1-based line in a JSONL file; None for one-object files
    session_id: str | None = None
    request_index: str | None = None  # "12" or "12.sub3.4" (subagent 3's request 4)
    field: str | None = None
    reason: str

    def __str__(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f":{self.line}"
        parts = [where]
        if self.session_id is not None:
            parts.append(f"session {self.session_id}")
        if self.request_index is not None:
            parts.append(f"request {self.request_index}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ": ".join([", ".join(parts), self.reason])


class TraceFormatError(TraceError):
    """A trace that cannot be loaded. ``problems`` lists every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        first = str(problems[0]) if problems else "invalid trace"
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        super().__init__(first + more)
