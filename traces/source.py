"""Reading the bytes of a trace or log file: gzip detected by its magic number, not
its name; a failure is a TraceError naming the file. Every reader of ``traces`` starts
here."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

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


def _open(path: Path) -> tuple[IO[bytes], bool]:
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise TraceError(f"{str(path)!r}: not a file name: {exc}") from exc
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        # Its file is closed by file_lines.
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")), True
    raw.seek(0)
    return raw, False


@contextlib.contextmanager
def file_lines(path: Path) -> Iterator[Iterator[tuple[int, bytes]]]:
    """The (decompressed) lines of ``path`` with their 1-based numbers, read as they
    are used, never the whole file at once: a JSONL trace of gigabytes costs one line
    of memory here, not two copies of the file. Failures are TraceErrors."""
    stream, gzipped = _open(path)
    raw = getattr(stream, "fileobj", None) or stream

    def lines() -> Iterator[tuple[int, bytes]]:
        try:
            yield from enumerate(stream, start=1)
        except (OSError, EOFError) as exc:
            what = "not a valid gzip file" if gzipped else "cannot read"
            raise TraceError(f"{path}: {what}: {exc}") from exc

    try:
        yield lines()
    finally:
        stream.close()
        raw.close()
