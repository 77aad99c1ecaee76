"""Importers of coding agents' own logs (Claude Code, Codex, TraceLab) → an anonymized
trace in the native model; each rule is documented in the module that applies it.
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TraceError
from traces.importers.anonymize import Anonymizer
from traces.importers.assemble import assemble
from traces.importers.claude_code import read_claude_code
from traces.importers.codex import read_codex
from traces.importers.logfile import ImportReport, expand_paths
from traces.importers.prefix import CONTEXT_GROWTH, TRACELAB_SPLIT, TokenIds
from traces.importers.threads import Thread
from traces.importers.tracelab import read_tracelab
from traces.model import Trace

_Reader = Callable[..., list[Thread]]
_READERS: dict[str, _Reader] = {
    "claude-code": read_claude_code,
    "codex": read_codex,
    "tracelab": read_tracelab,
}
SOURCES = tuple(_READERS)
DEFAULT_BLOCK_SIZE = 64  # tokens per hash block, as the Weka corpus uses


@dataclass(frozen=True, slots=True)
class ImportResult:
    """The imported trace and what the import read, made and skipped."""

    trace: Trace
    report: ImportReport


def import_logs(
    source: str,
    paths: Sequence[str | Path],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    tokenizer: Path | None = None,
    salt: bytes | None = None,
) -> ImportResult:
    """Import the ``source`` logs at ``paths`` (files, folders, globs).

    Args:
        source: ``claude-code``, ``codex`` or ``tracelab``.
        block_size: tokens per hash block.
        tokenizer: a local tokenizer.json; block ids then come from real token ids
            (Claude Code and Codex logs only: TraceLab rows hold no text).
        salt: the secret ids are hashed with; a fresh random one when None (tests
            pin it to compare two imports).

    Raises:
        TraceError: a path that does not exist, a log that cannot be read, a
            TraceLab row that breaks the schema, nothing to import.
    """
    reader = _READERS.get(source)
    if reader is None:
        raise TraceError(
            f"unknown log source {source!r}; use one of {', '.join(SOURCES)}"
        )
    if block_size < 1:
        raise TraceError(f"block size must be >= 1 (got {block_size})")
    if tokenizer is not None and source == "tracelab":
        raise TraceError("--tokenizer needs logs with text; TraceLab rows hold none")
    anon = Anonymizer(salt)
    token_ids = (
        TokenIds(tokenizer, anon.key, block_size) if tokenizer is not None else None
    )
    files = expand_paths(paths)
    report = ImportReport(source=source, files=files)
    threads = reader(files, report, want_text=token_ids is not None)
    if not any(t.calls for t in threads):
        raise TraceError(
            f"no {source} LLM calls found in {len(files)} file(s) "
            f"({', '.join(map(str, files[:3]))}{', ...' if len(files) > 3 else ''})"
        )
    if token_ids is not None:
        rule = token_ids.rule
    else:
        rule = TRACELAB_SPLIT if source == "tracelab" else CONTEXT_GROWTH
    trace = assemble(
        threads,
        source=source,
        anon=anon,
        block_size=block_size,
        token_ids=token_ids,
        hash_rule=rule,
        report=report,
    )
    return ImportResult(trace=trace, report=report)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "SOURCES",
    "ImportReport",
    "ImportResult",
    "import_logs",
]
