"""Reading run directories and sweep folders into :class:`Run` values: the only module
of ``analysis`` that does I/O. See docs/run-directory.md."""

from __future__ import annotations

import json
import shlex
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.errors import AnalysisError
from analysis.heap import page_array
from replayer.records import (
    RECORD_SCHEMA,
    RUN_METADATA_KEY,
    SERVER_METRICS_RAW_DIR,
    SERVER_METRICS_SCHEMA,
    RunMeta,
    server_metrics_table,
)
from replayer.records.capacity import CapacityDoc
from replayer.records.parts import joinable_parts, request_parts
from traces.model import Trace

# Repeated strings are read dictionary-encoded (pandas categoricals): a 10M-row run's
# ids would otherwise be 10M Python-visible strings per column.
CATEGORY_COLUMNS: tuple[str, ...] = (
    "run_id",
    "session_id",
    "root_session_id",
    "parent_session_id",
    "status",
    "error_type",
)


# More small part files that `replayer compact` would join than this, and loading
# a run says so: a killed 10M-row run's 2,000 parts take 18.7 s to analyze, joined
# 4.8-6.4 s (medians, bench/RESULTS.md).
SMALL_PARTS_HINT = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One run directory loaded: request rows, run metadata and scraped metrics."""

    path: Path
    requests: pd.DataFrame  # one row per request, RECORD_SCHEMA columns
    meta: RunMeta  # run.json (or the part files' copy of it); RunMeta() if neither
    server_metrics: pd.DataFrame  # long format: scrape_ns, metric, labels, value
    problems: tuple[str, ...] = ()  # what was skipped while loading (crashed runs)
    # The part files the rows were read from, in row order (:func:`part_batches`
    # reads columns left out of ``requests`` from them, a batch at a time).
    parts: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        """The directory name (a sweep level's name)."""
        return self.path.name


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """A sweep folder: one run per level, in the order of ``sweep.json``."""

    path: Path
    levels: tuple[str, ...]
    runs: tuple[Run, ...] = field(default_factory=tuple)


def _pandas_type(t: pa.DataType) -> Any:
    if pa.types.is_integer(t):
        return pd.Int32Dtype() if t.bit_width == 32 else pd.Int64Dtype()
    if pa.types.is_boolean(t):
        return pd.BooleanDtype()
    if pa.types.is_list(t):
        return pd.ArrowDtype(t)
    return None


def records_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table of request rows → the DataFrame analysis works on.

    Integers become nullable ``Int64``/``Int32`` (a null stays null, never 0),
    ``warmup`` nullable boolean, ``chunk_times_ns`` an Arrow list column, and the id
    and status columns categoricals.
    """
    cols = []
    for name in table.column_names:
        col = table.column(name)
        if name in CATEGORY_COLUMNS and not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()
        cols.append(col)
    table = pa.table(cols, names=table.column_names).unify_dictionaries()
    df: pd.DataFrame = table.to_pandas(types_mapper=_pandas_type)
    return df


def _conform(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Select and cast ``columns``; a column an older writer lacked becomes null."""
    out = []
    for name in columns:
        target = RECORD_SCHEMA.field(name).type
        if name in table.column_names:
            col = table.column(name)
            if pa.types.is_dictionary(col.type):
                col = col.cast(pa.dictionary(pa.int32(), target))
            else:
                col = col.cast(target)
        else:
            col = pa.nulls(table.num_rows, target)
        out.append(col)
    return pa.table(out, names=list(columns))


def _json_object(raw: str | bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_text()
    except OSError:
        return None
    return _json_object(raw)


def _is_run_meta(obj: dict[str, Any]) -> bool:
    """Whether a JSON object is a run's metadata: every run.json names its run."""
    run_id = obj.get("run_id")
    return isinstance(run_id, str) and bool(run_id)


def load_run(
    path: str | Path, *, columns: Sequence[str] | None = None, compact: bool = False
) -> Run:
    """Load the run directory at ``path``.

    A crashed run loads too: an unreadable part file is skipped and named in
    ``Run.problems``; without ``run.json`` the metadata comes from the part files.
    ``columns`` limits the request columns read (default: all of RECORD_SCHEMA).
    ``compact``: the frame of :func:`compact_column` (the same values in less
    memory, read a column at a time: what ``analyze`` loads) instead of
    :func:`records_frame`'s. ``Run.meta`` is ``RunMeta()`` when there is no metadata
    at all.

    Raises:
        AnalysisError: not a directory, or neither run.json nor any readable part.
    """
    path = Path(path)
    if not path.is_dir():
        raise AnalysisError(f"{path}: no such run directory")
    wanted = list(columns) if columns is not None else list(RECORD_SCHEMA.names)
    unknown = [c for c in wanted if c not in RECORD_SCHEMA.names]
    if unknown:
        raise AnalysisError(f"unknown request column(s): {', '.join(unknown)}")
    problems: list[str] = []
    meta = _read_json(path / "run.json")
    why = "no run.json"
    if meta is None and (path / "run.json").exists():
        why = "run.json is not a JSON object"
    elif meta is not None and not _is_run_meta(meta):
        why, meta = "run.json names no run_id", None
    if why != "no run.json":
        problems.append(f"{why}; using the part files' copy")
    parts = request_parts(path)
    read = _read_compact if compact else _read_whole
    requests, kept, part_meta = read(parts, wanted, problems)
    meta = meta if meta is not None else part_meta
    if meta is None and not kept:
        raise AnalysisError(
            f"{path}: not a run directory ({why} and no readable "
            "requests/part-*.parquet)"
        )
    if meta is None:
        problems.append("no run.json: metadata unavailable")
    small = joinable_parts(kept)
    if small > SMALL_PARTS_HINT:
        problems.append(
            f"{small:,} small part files: `replayer compact {shlex.quote(str(path))}` "
            "joins them, and they then read several times faster"
        )
    run_meta = RunMeta.from_dict(meta) if meta is not None else RunMeta()
    server_metrics = _load_server_metrics(path, run_meta, problems)
    return Run(
        path=path,
        requests=requests,
        meta=run_meta,
        server_metrics=server_metrics,
        problems=tuple(problems),
        parts=tuple(kept),
    )


_Read = tuple[pd.DataFrame, list[Path], dict[str, Any] | None]


def _part_meta(schema: pa.Schema) -> dict[str, Any] | None:
    """The copy of run.json a part file (of this Arrow schema) carries, if any."""
    raw = (schema.metadata or {}).get(RUN_METADATA_KEY)
    return _json_object(raw) if raw is not None else None


def _read_whole(parts: list[Path], wanted: list[str], problems: list[str]) -> _Read:
    """:func:`records_frame` of the readable parts, a part at a time."""
    tables: list[pa.Table] = []
    kept: list[Path] = []
    meta = None
    for part in parts:
        try:
            pf = pq.ParquetFile(part)
            present = [c for c in wanted if c in pf.schema_arrow.names]
            read_dict = [c for c in present if c in CATEGORY_COLUMNS]
            table = pq.read_table(part, columns=present, read_dictionary=read_dict)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{part.name}: unreadable, skipped ({exc})")
            continue
        if meta is None:
            meta = _part_meta(pf.schema_arrow)
        tables.append(_conform(table, wanted))
        kept.append(part)
    if not tables:
        tables.append(_conform(RECORD_SCHEMA.empty_table(), wanted))
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return records_frame(table), kept, meta


def _read_compact(parts: list[Path], wanted: list[str], problems: list[str]) -> _Read:
    """:func:`compact_column` of each wanted column, read from every readable part.

    Two reads at a time on threads: a small part is read whole (its wanted
    columns in one call: the recorder's thousands of 5,000-row parts cost one
    open each, not one a column), a large one (``_BIG_PART`` rows or more) a
    column at a time (two columns' Arrow copies held, not two parts'). An
    integer column goes straight into its compact array, the dtype planned from
    the parts' Parquet statistics and each chunk checked against them (where
    they are missing or wrong, the column is joined from its chunks instead);
    the other columns are joined from their chunks. A part that fails on any
    column is skipped whole."""
    opened: list[_Part] = []
    meta = None
    for part in parts:
        try:
            md = pq.read_metadata(part)
            schema = md.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{part.name}: unreadable, skipped ({exc})")
            continue
        if meta is None:
            meta = _part_meta(schema)
        opened.append(_Part(part, md, schema))
    try:
        try:
            frame = _read_parts(opened, wanted, plan=True)
        except _StatsWrong:
            frame = _read_parts(opened, wanted, plan=False)
    except _BadPart as bad:
        problems.append(f"{bad.part.name}: unreadable, skipped ({bad.exc})")
        rest = [p.path for p in opened if p.path != bad.part]
        retried = _read_compact(rest, wanted, problems)
        return retried[0], retried[1], meta or retried[2]
    _release_arrow_memory()
    return pd.DataFrame(frame, copy=False), [p.path for p in opened], meta


@dataclass(frozen=True, slots=True)
class _Part:
    path: Path
    md: pq.FileMetaData
    schema: pa.Schema


# Rows from which a part is read a column at a time.
_BIG_PART = 100_000


class _StatsWrong(Exception):
    """A chunk's values are not what its part's statistics said."""


def _read_parts(
    opened: list[_Part], wanted: list[str], *, plan: bool
) -> dict[str, Any]:
    """The compact columns of ``opened``'s rows (see :func:`_read_compact`)."""
    offsets = np.cumsum([0] + [p.md.num_rows for p in opened]).tolist()
    rows = offsets[-1]
    planned: dict[str, tuple[Any, int, int]] = {}  # name: (array, lo, hi)
    if plan and rows:
        for name in wanted:
            got = _int_plan(opened, name)
            if got is None:
                continue
            dtype, lo, hi = got
            if dtype is None:  # nulls only (no memory; see compact_column)
                planned[name] = (np.broadcast_to(np.float32(np.nan), rows), 0, 0)
            else:
                planned[name] = (page_array(rows, dtype), lo, hi)
    joined = [n for n in wanted if n not in planned]
    chunks: list[dict[str, list[pa.Array]]] = [{} for _ in opened]

    def one(task: tuple[int, list[str]]) -> None:
        k, columns = task
        part = opened[k]
        names = part.schema.names
        present = [n for n in columns if n in names]
        dict_ = [n for n in present if n in CATEGORY_COLUMNS]
        try:
            # ParquetFile, not read_table: no dataset machinery per read.
            pf = pq.ParquetFile(part.path, metadata=part.md, read_dictionary=dict_)
            try:
                table = pf.read(columns=present, use_threads=False)
            finally:
                pf.close()
        except (OSError, pa.ArrowException) as exc:
            raise _BadPart(part.path, exc) from None
        at, n = offsets[k], part.md.num_rows
        for name in columns:
            if name in planned:
                out, lo, hi = planned[name]
                if not out.flags.writeable:
                    continue  # nulls only
                if name not in names:
                    out[at : at + n] = np.nan
                    continue
                col = table.column(name)
                if col.null_count and out.dtype.kind == "i":
                    raise _StatsWrong
                if col.null_count < n:
                    got = pc.min_max(col)
                    if got["min"].as_py() < lo or got["max"].as_py() > hi:
                        raise _StatsWrong
                _fill(out[at : at + n], col)
                continue
            col = _conform(table.select([name] if name in names else []), [name])[0]
            if name in CATEGORY_COLUMNS and not pa.types.is_dictionary(col.type):
                col = col.dictionary_encode()
            chunks[k][name] = col.chunks

    def join(name: str) -> Any:
        target = RECORD_SCHEMA.field(name).type
        if name in CATEGORY_COLUMNS:
            target = pa.dictionary(pa.int32(), target)
        pieces = [c for per in chunks for c in per.pop(name)]
        return compact_column(pa.chunked_array(pieces, type=target))

    # A small part is one read of all its columns; a large one a read a column
    # (two columns' Arrow copies held at a time, not two parts').
    tasks: list[tuple[int, list[str]]] = []
    for k, part in enumerate(opened):
        if part.md.num_rows >= _BIG_PART:
            tasks += [(k, [name]) for name in wanted]
        else:
            tasks.append((k, wanted))
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, tasks))
        joined_columns = dict(zip(joined, pool.map(join, joined), strict=True))
    return {
        name: planned[name][0] if name in planned else joined_columns[name]
        for name in wanted
    }


def _fill(out: np.ndarray, col: pa.ChunkedArray) -> None:
    """``col``'s values (NaN for null) cast into ``out`` a chunk at a time."""
    at = 0
    for c in col.chunks:
        out[at : at + len(c)] = c.to_numpy(zero_copy_only=False)
        at += len(c)


def _int_plan(opened: list[_Part], name: str) -> tuple[Any, int, int] | None:
    """(dtype, lo, hi) of integer column ``name`` from the parts' Parquet
    statistics, the dtype :func:`compact_column` picks from the values (None:
    nulls only); None when a part has no statistics for it or does not store it
    as integers."""
    if not pa.types.is_integer(RECORD_SCHEMA.field(name).type):
        return None
    lo: int | None = None
    hi: int | None = None
    nulls = rows = 0
    for part in opened:
        md = part.md
        rows += md.num_rows
        if name not in part.schema.names:  # an older writer: null in these rows
            nulls += md.num_rows
            continue
        if not pa.types.is_integer(part.schema.field(name).type):
            return None
        at = _column_index(md, name)
        if at is None:
            return None
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            stats = group.column(at).statistics
            if stats is None or not stats.has_null_count:
                return None
            nulls += stats.null_count
            if stats.null_count == group.num_rows:
                continue
            if not stats.has_min_max:
                return None
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
    if lo is None or hi is None:
        return None, 0, 0
    return _compact_int_dtype(lo, hi, nulls), lo, hi


def _column_index(md: pq.FileMetaData, name: str) -> int | None:
    """The Parquet column of flat column ``name``; None if it is not one."""
    schema = md.schema
    for i in range(len(schema)):
        if schema.column(i).path == name:
            return i
    return None


def _release_arrow_memory() -> None:
    """Hand the Arrow buffers freed after a read back to the system: Arrow's
    allocator keeps them for reuse (0.2 GiB after reading a 10M-row run), which
    numpy never gets to use."""
    pa.default_memory_pool().release_unused()


class _BadPart(Exception):
    def __init__(self, part: Path, exc: Exception) -> None:
        self.part, self.exc = part, exc


# Integers up to this size are exact in float32 (a 24-bit significand).
_FLOAT32_EXACT = 2**24
_SMALL_INTS = (np.int8, np.int16, np.int32)


def compact_column(col: pa.ChunkedArray) -> Any:
    """One request column in the smallest dtype that holds its values exactly, as
    analysis reads them (``metrics.column``: float64, NaN for null).

    Integers without nulls: the narrowest numpy integer type of their range.
    Integers with nulls: float32 (NaN) when every value is within 2**24 (exact),
    else float64 (NaN), the value ``metrics.numeric_view`` would give; nulls
    only: a read-only float32 NaN repeated without memory. ``warmup``
    without nulls: numpy bool. Dictionary columns: categoricals, categories in
    first-seen order across the chunks (as :func:`records_frame`). Lists and
    strings: Arrow-backed, no copy.
    """
    t = col.type
    if pa.types.is_dictionary(t):
        return _categorical(col)
    if pa.types.is_boolean(t):
        if col.null_count:
            return col.to_pandas(types_mapper=_pandas_type).array
        return col.to_numpy()
    if not pa.types.is_integer(t):
        if pa.types.is_string(t) and col.null_count == len(col):
            # No error messages: 1 byte a row (categorical codes), not 4 (offsets).
            return pd.Categorical.from_codes(
                np.full(len(col), -1, dtype=np.int8), dtype=_NO_STRINGS
            )  # = pd.Categorical of NaNs, without looking at them
        return pd.arrays.ArrowExtensionArray(col)
    if col.null_count == len(col):
        # One NaN seen at every row (read-only, no memory: 40 MB a column at 10M
        # rows, and runs leave several of these columns empty).
        return np.broadcast_to(np.float32(np.nan), len(col))
    lo, hi = (x.as_py() for x in pc.min_max(col).values())
    return _cast_into(col, _compact_int_dtype(lo, hi, col.null_count))


_NO_STRINGS = pd.CategoricalDtype(pd.Index([], dtype="float64"))


def _compact_int_dtype(lo: int, hi: int, nulls: int) -> Any:
    """The dtype :func:`compact_column` gives integers from ``lo`` to ``hi``."""
    if nulls == 0:
        for small in _SMALL_INTS:
            info = np.iinfo(small)
            if info.min <= lo and hi <= info.max:
                return small
        return np.int64
    if max(-lo, hi) <= _FLOAT32_EXACT:
        return np.float32
    return np.float64


def _cast_into(col: pa.ChunkedArray, dtype: Any) -> Any:
    """The chunks' values (float64 with NaN for null, when there are nulls) cast
    to ``dtype`` in one array, each chunk cast as it is copied in: no cast copy
    of each chunk on the way (fresh pages cost the kernel's time)."""
    if col.num_chunks == 1:  # Arrow's own buffer when it has the type
        one = col.chunk(0).to_numpy(zero_copy_only=False)
        return one if one.dtype == dtype else one.astype(dtype)
    out = np.empty(len(col), dtype=dtype)
    _fill(out, col)
    return out


def _concat(pieces: list[Any]) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int8)


def _categorical(col: pa.ChunkedArray) -> pd.Categorical:
    """A dictionary column as a categorical, without unifying the dictionaries
    string by string when the chunks share one (parts of one writer often do)."""
    chunks = [c for c in col.chunks if len(c)] or [
        pa.DictionaryArray.from_arrays(
            pa.array([], pa.int32()), pa.array([], pa.string())
        )
    ]
    first = chunks[0].dictionary
    if all(c.dictionary.equals(first) for c in chunks[1:]):
        values = first
        maps = None
    else:
        # One hash pass over every chunk's dictionary (not a lookup table built
        # per chunk: a run's thousands of parts each have their own).
        every = pc.dictionary_encode(
            pa.concat_arrays([c.dictionary for c in chunks]), null_encoding="encode"
        )
        values = every.dictionary
        where = every.indices.to_numpy().astype(np.int32, copy=False)
        ends = np.cumsum([len(c.dictionary) for c in chunks]).tolist()
        maps = [
            np.append(where[end - len(c.dictionary) : end], -1).astype(np.int32)
            for c, end in zip(chunks, ends, strict=True)
        ]
    codes = []
    for i, c in enumerate(chunks):
        idx = pc.fill_null(c.indices, -1).to_numpy().astype(np.int32, copy=False)
        codes.append(maps[i][idx] if maps is not None else idx)
    return pd.Categorical.from_codes(
        _concat(codes), categories=pd.Index(values.to_pandas(), copy=False)
    )


def stored_values(run: Run, column: str) -> int:
    """How many values ``column`` stores in ``run``'s part files, nulls and list
    items counted (from the Parquet footers: nothing is read): an upper bound on
    what it yields, to size a buffer before reading.

    Raises:
        AnalysisError: a part file that loaded before cannot be read now.
    """
    total = 0
    for part in run.parts:
        try:
            meta = pq.ParquetFile(part).metadata
        except (OSError, pa.ArrowException) as exc:
            raise AnalysisError(f"{part}: cannot read it again ({exc})") from None
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            for j in range(group.num_columns):
                leaf = group.column(j)
                if leaf.path_in_schema.split(".", 1)[0] == column:
                    total += leaf.num_values
    return total


def part_batches(
    run: Run, columns: Sequence[str], *, rows: int = 1 << 18
) -> Iterator[pa.Table]:
    """``columns`` of ``run``'s rows, read again from its part files a batch of at
    most ``rows`` rows at a time (row groups in order, small parts' joined: the
    batches, one after the other, are ``run.requests``' rows), each an Arrow
    table of RECORD_SCHEMA's types (ids dictionary-encoded; :func:`records_frame`
    makes a frame of one).

    Raises:
        AnalysisError: a part file that loaded before cannot be read now.
    """
    held: list[pa.Table] = []  # small parts' rows, joined up to ``rows``
    held_rows = 0
    for part, tables in _parts_ahead(run.parts, columns, rows):
        try:
            for table in tables:
                table = _conform(table, columns)
                if held and held_rows + len(table) > rows:
                    yield pa.concat_tables(held)
                    held, held_rows = [], 0
                held.append(table)
                held_rows += len(table)
        except (OSError, pa.ArrowException) as exc:
            raise AnalysisError(f"{part}: cannot read it again ({exc})") from None
    if held:
        yield pa.concat_tables(held)
    _release_arrow_memory()


# Small parts read ahead of the caller, side by side on two threads (a part's
# open costs ~2 ms of footer and schema, a run's thousands of parts seconds).
_PARTS_AHEAD = 4


def _parts_ahead(
    parts: Sequence[Path], columns: Sequence[str], rows: int
) -> Iterator[tuple[Path, Iterable[pa.Table]]]:
    """Each part and its tables, in order: a part of at most ``rows`` rows read
    whole on a thread, ahead; a larger one read a batch at a time as the caller
    takes them."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        coming: deque[tuple[Path, Future[Iterable[pa.Table]]]] = deque()
        queue = iter(parts)

        def more() -> None:
            while len(coming) < _PARTS_AHEAD and (part := next(queue, None)):
                coming.append((part, pool.submit(_part_tables, part, columns, rows)))

        more()
        while coming:
            part, future = coming.popleft()
            more()
            try:
                tables = future.result()
            except (OSError, pa.ArrowException) as exc:
                raise AnalysisError(f"{part}: cannot read it again ({exc})") from None
            yield part, tables


def _part_tables(part: Path, columns: Sequence[str], rows: int) -> Iterable[pa.Table]:
    pf = pq.ParquetFile(part)
    present = [c for c in columns if c in pf.schema_arrow.names]
    read_dict = [c for c in present if c in CATEGORY_COLUMNS]
    if read_dict:  # the footer parsed once
        pf = pq.ParquetFile(part, metadata=pf.metadata, read_dictionary=read_dict)
    if pf.metadata.num_rows <= rows:
        return [pf.read(columns=present, use_threads=False)]
    return (
        pa.Table.from_batches([batch])
        for batch in pf.iter_batches(batch_size=rows, columns=present)
    )


def _load_server_metrics(
    run_dir: Path, meta: RunMeta, problems: list[str]
) -> pd.DataFrame:
    """``server_metrics.parquet``; for a run that did not finish, the raw scrapes it
    had flushed; and a note in ``problems`` whenever there are none to read."""
    empty: pd.DataFrame = SERVER_METRICS_SCHEMA.empty_table().to_pandas()
    path = run_dir / "server_metrics.parquet"
    raw_parts = sorted((run_dir / SERVER_METRICS_RAW_DIR).glob("raw-*.parquet"))
    try:
        if path.exists():
            table = pq.read_table(path)
            table = table.select(SERVER_METRICS_SCHEMA.names).cast(
                SERVER_METRICS_SCHEMA
            )
        elif raw_parts:
            tables = []
            for part in raw_parts:
                parsed, _bad = server_metrics_table(pq.read_table(part))
                tables.append(parsed)
            table = pa.concat_tables(tables)
            problems.append(
                f"server metrics read from {len(raw_parts)} raw scrape file(s): "
                "the run did not finish (the last flush interval may be missing)"
            )
        else:
            problems.append(_no_metrics_reason(meta))
            return empty
    except (OSError, KeyError, pa.ArrowException) as exc:
        problems.append(f"{path.name}: unreadable, skipped ({exc})")
        return empty
    metrics: pd.DataFrame = table.to_pandas()
    return metrics


def _no_metrics_reason(meta: RunMeta) -> str:
    """Why a run has no server metrics, as far as its run.json tells."""
    account = meta.server_metrics
    if account is None:
        replay = meta.config.replay
        if replay is not None and replay.scrape_interval_s == 0:
            return "no server metrics: scraping was off"
        if not meta.complete:
            return "no server metrics: none flushed before the run stopped"
        return "no server metrics recorded"
    if account.available is False:
        return f"no server metrics: {account.url} serves no Prometheus text"
    if not account.scrapes:
        return "no server metrics: no scrape succeeded"
    return (
        f"no server metrics: {account.scrapes} scrapes were taken, but "
        "server_metrics.parquet is missing"
    )


def is_sweep(path: str | Path) -> bool:
    """Whether ``path`` is a sweep folder (it holds ``sweep.json``)."""
    return (Path(path) / "sweep.json").is_file()


def sweep_levels(path: str | Path) -> list[Path]:
    """A sweep folder's run directories, in the order of ``sweep.json``
    {"levels": [...]} (levels without a directory left out).

    Raises:
        AnalysisError: sweep.json is not such an object, or no level is there.
    """
    path = Path(path)
    spec = _read_json(path / "sweep.json")
    levels = spec.get("levels") if spec is not None else None
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise AnalysisError(f'{path / "sweep.json"}: expected {{"levels": [names]}}')
    found = [path / level for level in levels if (path / level).is_dir()]
    if not found:
        raise AnalysisError(f"{path}: sweep has no level directories")
    return found


def load_sweep(path: str | Path, *, columns: Sequence[str] | None = None) -> Sweep:
    """Load a sweep folder: ``sweep.json`` {"levels": [...]} and one run per level."""
    runs = tuple(load_run(p, columns=columns) for p in sweep_levels(path))
    return Sweep(path=Path(path), levels=tuple(r.name for r in runs), runs=runs)


def load_capacity(path: str | Path) -> CapacityDoc | None:
    """A capacity folder's ``capacity.json`` (``replayer.studies.capacity``), or None
    when ``path`` is not one."""
    doc = _read_json(Path(path) / "capacity.json")
    if doc is None:
        return None
    if not isinstance(doc.get("cells"), list) or not isinstance(
        doc.get("result"), dict
    ):
        raise AnalysisError(f"{Path(path) / 'capacity.json'}: not a capacity search")
    if "source" not in doc["result"]:
        # Written before capacity.json said so: a cell's run.json tells.
        engine = _cells_engine(Path(path), doc["cells"])
        doc["result"]["source"] = "live" if engine is None else "virtual"
        doc["search"] = {**doc.get("search", {}), "virtual": engine}
    try:
        return CapacityDoc.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AnalysisError(
            f"{Path(path) / 'capacity.json'}: not a capacity search this version "
            f"reads ({type(exc).__name__}: {exc})"
        ) from None


def _cells_engine(path: Path, cells: list[Any]) -> str | None:
    """The engine model the first cell ran on in virtual time (None: live)."""
    for cell in cells:
        name = cell.get("name") if isinstance(cell, dict) else None
        meta = _read_json(path / str(name) / "run.json") if name else None
        if isinstance(meta, dict):
            virtual = meta.get("virtual")
            return str(virtual.get("source")) if isinstance(virtual, dict) else None
    return None


def load_trace_for(run: Run, trace_path: str | Path | None = None) -> Trace:
    """The trace a run replayed: ``trace_path``, else run.json's ``trace.path``.

    Raises:
        AnalysisError: no path known, or the file is gone / unreadable.
    """
    from traces.errors import TraceError
    from traces.io import read_trace

    if trace_path is None:
        trace_path = run.meta.trace.path
    if not trace_path:
        raise AnalysisError(
            f"{run.path}: run.json names no trace path; pass the trace explicitly"
        )
    try:
        replay = run.meta.config.replay
        rows = "auto" if replay is None else replay.mooncake_rows
        return read_trace(Path(trace_path), mooncake_rows=rows)
    except TraceError as exc:
        raise AnalysisError(f"{run.path}: cannot reload its trace: {exc}") from exc


def block_tokens_of(run: Run, trace: Trace | None = None) -> int:
    """Tokens per materialized block: run.json ``block_tokens``, else the trace's."""
    value = run.meta.block_tokens or run.meta.trace.block_size
    if not value and trace is not None and trace.sessions:
        value = trace.sessions[0].block_size
    return int(value or 64)
