"""Request part files: their names, how they are written (LZ4), which of them hold a
run's rows, and the end-of-run compaction that joins a worker's small parts into
large ones. See docs/run-directory.md#part-files."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from replayer.records.rows import RECORD_SCHEMA, RUN_METADATA_KEY

T = TypeVar("T")

# LZ4 (Parquet's LZ4_RAW): reads 2.3x faster than zstd at 20% more bytes on a
# run's columns (docs/benchmarks.md); every Parquet reader of note reads it.
PART_COMPRESSION = "lz4"

# The nanosecond columns (times, waits and chunk stamps) are written without a
# dictionary: nanosecond values seldom repeat, so a dictionary page fills early
# in a row group and the rest falls back to plain anyway; written plain they take
# fewer bytes and less time to write, and read faster (docs/benchmarks.md).
PLAIN_COLUMNS = frozenset(n for n in RECORD_SCHEMA.names if n.endswith("_ns"))


def part_write_options(names: Sequence[str]) -> dict[str, object]:
    """The Parquet writer options of a part file with columns ``names``. The
    columns named in ``use_dictionary`` get dictionaries, the others none; a list
    column would be named by its leaf's path (``x.list.element``), so leaving
    ``chunk_times_ns`` out stores it plain."""
    return {
        "compression": PART_COMPRESSION,
        "use_dictionary": [n for n in names if n not in PLAIN_COLUMNS],
    }


# Rows a compacted part holds at most, and a row group of it: a row group is what
# the analysis reads at a time, and what compaction holds in memory.
COMPACT_PART_ROWS = 1 << 20
COMPACT_GROUP_ROWS = 1 << 18

# part-<worker>-<seq>.parquet, or part-<worker>-<first>-<last>.parquet for a
# compacted part that holds the rows of parts <first> to <last>, in that order.
_NAME = re.compile(r"part-(\d+)-(\d+)(?:-(\d+))?\.parquet")


def part_name(worker_id: int, seq: int, last: int | None = None) -> str:
    """The file name of part ``seq`` of worker ``worker_id`` (of parts ``seq`` to
    ``last``, for a compacted one)."""
    tail = "" if last is None else f"-{last:05d}"
    return f"part-{worker_id:03d}-{seq:05d}{tail}.parquet"


def joinable_parts(parts: Sequence[Path]) -> int:
    """How many of ``parts`` are small (as a run writes them, not joined) beside
    another small part of their worker: what ``replayer compact`` would join."""
    per_worker: dict[int, int] = {}
    for path in parts:
        m = _NAME.fullmatch(path.name)
        if m is not None and m[3] is None:
            per_worker[int(m[1])] = per_worker.get(int(m[1]), 0) + 1
    return sum(n for n in per_worker.values() if n > 1)


def request_parts(run_dir: Path, worker_id: int | None = None) -> list[Path]:
    """The run's request part files (one worker's, with ``worker_id``), in row
    order: by worker, then by sequence number. A part whose rows a compacted part
    also holds (a run stopped between writing the compacted part and removing the
    ones it joined) is left out, so no row is read twice. Files named otherwise
    after ``part-*.parquet`` come last, by name."""
    folder = run_dir / "requests"
    if not folder.is_dir():
        return []
    named: list[tuple[int, int, int | None, Path]] = []  # worker, seq, last, path
    other: list[Path] = []
    for path in sorted(folder.glob("part-*.parquet")):
        m = _NAME.fullmatch(path.name)
        if m is None:
            if worker_id is None:
                other.append(path)
        elif worker_id is None or int(m[1]) == worker_id:
            last = None if m[3] is None else int(m[3])
            named.append((int(m[1]), int(m[2]), last, path))
    present = {(worker, seq) for worker, seq, last, _ in named if last is None}
    covered: set[tuple[int, int]] = set()
    unreadable: set[Path] = set()
    for worker, first, last, path in named:
        if last is None:
            continue
        held = {(worker, seq) for seq in range(first, last + 1)}
        # A joined part beside parts it holds: a run stopped between the two
        # steps, or one whose joined part did not reach the disk whole (a power
        # loss). Those parts are left out only when its footer reads.
        if held & present and not footer_reads(path):
            unreadable.add(path)
            continue
        covered |= held
    kept = [
        p
        for p in named
        if p[3] not in unreadable and (p[2] is not None or (p[0], p[1]) not in covered)
    ]
    kept.sort(key=lambda p: (p[0], p[1]))
    return [p[3] for p in kept] + other


def footer_reads(path: Path) -> bool:
    """Whether ``path``'s Parquet footer reads (a part a crash cut short does not)."""
    try:
        pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return False
    return True


def read_request_parts(
    run_dir: Path, read: Callable[[Path], T], worker_id: int | None = None
) -> list[T]:
    """``read(part)`` of each of :func:`request_parts`, in order. A part that is
    gone when it is read (another worker of the run joined its parts meanwhile:
    it removes them once their joined part is in place) has the parts listed and
    read again."""
    for _ in range(_RELISTS):
        with contextlib.suppress(FileNotFoundError):
            return [read(part) for part in request_parts(run_dir, worker_id)]
        time.sleep(_RELIST_PAUSE_S)
    return [read(part) for part in request_parts(run_dir, worker_id)]


# Times the parts are listed again when one is gone as it is read, and the pause
# before each: a worker joins a group of parts in a second or so.
_RELISTS = 20
_RELIST_PAUSE_S = 0.1


def write_part(table: pa.Table, path: Path) -> None:
    """``table`` to part file ``path`` through a temporary file: a reader never
    sees half a part.

    Raises:
        OSError: the disk refused it (nothing is left behind).
    """
    tmp = path.with_name("." + path.name + ".tmp")
    try:
        pq.write_table(table, tmp, **part_write_options(table.column_names))
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def compact_parts(
    folder: Path,
    worker_id: int,
    count: int,
    metadata: bytes | None,
    *,
    stop: threading.Event | None = None,
    part_rows: int = COMPACT_PART_ROWS,
    group_rows: int = COMPACT_GROUP_ROWS,
) -> int:
    """Join worker ``worker_id``'s parts 0 to ``count - 1`` in ``folder`` into parts
    of up to ``part_rows`` rows (row groups of ``group_rows``), each named for the
    parts it holds; each joined part is removed once its compacted part is in
    place. The rows, their order and their values do not change. ``metadata``:
    the run metadata each joined part carries (None: its last part's).

    Never loses a row: a group whose parts cannot be read, differ in schema, or
    cannot be written (a full disk) is left as it was, and so is every group
    after ``stop`` is set. Returns how many parts were joined.
    """
    paths = [folder / part_name(worker_id, seq) for seq in range(count)]
    groups: list[list[tuple[int, Path, int]]] = [[]]
    rows_in = 0
    for seq, path in enumerate(paths):
        try:
            rows = pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowException):
            groups.append([])  # unreadable: left alone, a group ends at it
            rows_in = 0
            continue
        if groups[-1] and rows_in + rows > part_rows:
            groups.append([])
            rows_in = 0
        groups[-1].append((seq, path, rows))
        rows_in += rows
    joined = 0
    for group in groups:
        if len(group) < 2:
            continue
        if stop is not None and stop.is_set():
            break
        if _join(folder, worker_id, group, metadata, group_rows):
            joined += len(group)
    return joined


def _join(
    folder: Path,
    worker_id: int,
    group: Sequence[tuple[int, Path, int]],
    metadata: bytes | None,
    group_rows: int,
) -> bool:
    """One compacted part from ``group``'s parts; False (nothing changed) when a
    part cannot be read or the disk refuses the write. The joined part is on the
    disk (fsync, file and folder) before a part it holds is removed; its temporary
    file is this process's own, so two joins of one group do not mix."""
    first, last = group[0][0], group[-1][0]
    path = folder / part_name(worker_id, first, last)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    schema: pa.Schema | None = None
    held: list[pa.Table] = []
    held_rows = 0
    try:
        writer: pq.ParquetWriter | None = None
        try:
            for _, part, _ in group:
                table = pq.read_table(part)
                plain = table.schema.remove_metadata()
                if schema is None:
                    if metadata is None:  # the newest the group has
                        newest = pq.read_schema(group[-1][1]).metadata or {}
                        metadata = newest.get(RUN_METADATA_KEY)
                    schema = plain.with_metadata(
                        {} if metadata is None else {RUN_METADATA_KEY: metadata}
                    )
                    writer = pq.ParquetWriter(
                        tmp, schema, **part_write_options(schema.names)
                    )
                elif not plain.equals(schema.remove_metadata()):
                    raise _Mixed
                held.append(table.replace_schema_metadata(schema.metadata))
                held_rows += table.num_rows
                while held_rows >= group_rows:
                    assert writer is not None
                    both = pa.concat_tables(held)
                    writer.write_table(
                        both.slice(0, group_rows), row_group_size=group_rows
                    )
                    rest = both.slice(group_rows)
                    held, held_rows = [rest], rest.num_rows
            if held_rows:
                assert writer is not None
                writer.write_table(pa.concat_tables(held), row_group_size=group_rows)
        finally:
            if writer is not None:
                writer.close()
        _sync(tmp)
        tmp.replace(path)
        _sync(folder)
    except (OSError, pa.ArrowException, _Mixed):
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    for _, part, _ in group:
        with contextlib.suppress(OSError):  # still covered: readers skip it
            part.unlink()
    return True


def _sync(path: Path) -> None:
    """fsync a file or a folder (the latter where the system allows it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def compact_run(run_dir: Path) -> tuple[int, int]:
    """Join the small request parts of a run that has ended (one that was killed,
    or written before runs joined their parts) as a finished run joins them: each
    worker's parts not yet joined, in sequence order. A part that a joined part
    (whose footer reads) already holds is removed first: its rows are there; so is
    a join's temporary file left by a run killed in it. (part files before,
    after)."""
    folder = run_dir / "requests"
    before = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    kept = set(request_parts(run_dir))
    workers: dict[int, int] = {}
    for path in before:
        m = _NAME.fullmatch(path.name)
        if m is None or m[3] is not None:  # not a part, or a joined one
            continue
        if path not in kept:  # held by a joined part whose footer reads
            path.unlink(missing_ok=True)
            continue
        worker, seq = int(m[1]), int(m[2])
        workers[worker] = max(workers.get(worker, 0), seq + 1)
    for stale in folder.glob(".part-*.tmp") if folder.is_dir() else []:
        stale.unlink(missing_ok=True)  # a join the run did not finish
    for worker, count in workers.items():
        compact_parts(folder, worker, count, None)
    return len(before), len(list(folder.glob("part-*.parquet")))


class _Mixed(Exception):
    """Parts of one group with different columns: left as they are."""
