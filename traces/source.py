"""Reading the bytes of a trace or log file: gzip detected by its magic number, not
its name; a failure is a TraceError naming the file. Every reader of ``traces`` starts
here."""

from __future__ import annotations

import gzip
from pathlib import Path

from traces.errors import TraceError


def read_file_bytes(path: Path) -> bytes:
    """The (decompressed) bytes of ``path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a name no file can have ("embedded null byte")
        raise TraceError(f"{str(path)!r}: not a file name: {exc}") from exc
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: not a valid gzip file: {exc}") from exc
    return data
