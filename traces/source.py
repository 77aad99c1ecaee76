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
    with _opened(path) as (stream, gzipped):
        try:
            return stream.read()
        except (OSError, EOFError) as exc:
            raise _read_error(path, gzipped, exc) from exc


@contextlib.contextmanager
def file_lines(path: Path) -> Iterator[Iterator[tuple[int, bytes]]]:
    """The (decompressed) lines of ``path`` with their 1-based numbers, read as they
    are used, never the whole file at once: a JSONL trace of gigabytes costs one line
    of memory here, not two copies of the file. Failures are TraceErrors."""
    with _opened(path) as (stream, gzipped):

        def lines() -> Iterator[tuple[int, bytes]]:
            try:
                yield from enumerate(stream, start=1)
            except (OSError, EOFError) as exc:
                raise _read_error(path, gzipped, exc) from exc

        yield lines()


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[IO[bytes], bool]]:
    """``path`` open for reading, through gzip when its first bytes are gzip's magic
    number (and whether they were); closed after."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a name no file can have ("embedded null byte")
        raise TraceError(f"{str(path)!r}: not a file name: {exc}") from exc
    with raw:
        try:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
        except OSError as exc:
            raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if not gzipped:
            yield raw, False
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield cast(IO[bytes], unzipped), True


def _read_error(path: Path, gzipped: bool, exc: BaseException) -> TraceError:
    if gzipped:
        return TraceError(f"{path}: not a valid gzip file: {exc}")
    return TraceError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
