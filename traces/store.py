"""The Parquet trace store: one row per request, the block buffer run-length encoded,
the session tree as JSON in the file's metadata. Lossless, and loads many times faster
than JSON. See docs/traces.md#formats."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import Problem, TraceError, TraceFormatError
from traces.gaps import parts_past_gap
from traces.model import MAX_SECONDS, MAX_TOKENS, HashIds, Session, Subagent, Trace
from traces.table import (
    GAP_PARTS,
    ChainBuilder,
    IntArray,
    Labels,
    RequestRows,
    RequestTable,
    Rows,
    frozen,
    part_column,
    request_extras,
    session_rows,
)

STORE_FORMAT = "replayer-trace-store/2"
_FORMAT_1 = "replayer-trace-store/1"  # every row's whole prompt; still read
_META_KEY = b"replayer.trace"
_SEP = "\x1f"  # joins input/output type lists; never appears in type names
_LABEL_COLUMNS = ("kind", "model", "stop", "input_types", "output_types")
_STRINGS = pa.dictionary(pa.int32(), pa.string())
T = TypeVar("T", bound=object)

_SCHEMA = pa.schema(
    [
        ("session", pa.int32()),  # index into the flattened session list
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("t_s", pa.float64()),
        ("think_time_s", pa.float64()),
        ("api_time_s", pa.float64()),
        ("ttft_s", pa.float64()),
        ("kind", _STRINGS),
        ("model", _STRINGS),
        ("stop", _STRINGS),
        ("input_types", _STRINGS),
        ("output_types", _STRINGS),
        ("extra", pa.string()),
        ("ids_offset", pa.int64()),  # the prompt: blocks[ids_offset : + n_blocks]
        ("n_blocks", pa.int64()),
        ("block_runs", pa.list_(pa.int64())),  # blocks this row adds: run start ids
        ("block_run_lengths", pa.list_(pa.int64())),
    ]
)


def _flatten(trace: Trace) -> list[tuple[Session, int, Subagent | None]]:
    flat: list[tuple[Session, int, Subagent | None]] = []

    def visit(session: Session, parent: int, spawn: Subagent | None) -> None:
        me = len(flat)
        flat.append((session, parent, spawn))
        for sub in session.subagents:
            visit(sub.session, me, sub)

    for s in trace.sessions:
        visit(s, -1, None)
    return flat


def _session_meta(
    session: Session, parent: int, spawn: Subagent | None
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": session.session_id,
        "parent": parent,
        "n": len(session.requests),
        "block_size": session.block_size,
        "scope": session.hash_id_scope,
        "start_s": session.start_s,
        "models": list(session.models),
        "tool_tokens": session.tool_tokens,
        "system_tokens": session.system_tokens,
        "extra": dict(session.extra),
    }
    if spawn is not None:
        d["spawn"] = {
            "anchor_index": spawn.anchor_index,
            "join_index": spawn.join_index,
            "agent_id": spawn.agent_id,
            "t_s": spawn.t_s,
            "subagent_type": spawn.subagent_type,
            "duration_ms": spawn.duration_ms,
            "total_tokens": spawn.total_tokens,
            "tool_use_count": spawn.tool_use_count,
            "status": spawn.status,
            "extra": dict(spawn.extra),
        }
    return d


# --------------------------------------------------------------------------- writing


def _column(parts: Sequence[Rows], name: str, dtype: type[np.generic]) -> Any:
    arrays = [getattr(t, name)[a:b] for t, a, b in parts]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def _dictionary(labels: Labels[T], text: Callable[[T], str | None]) -> pa.Array:
    """A dictionary array from label codes; values that ``text`` maps to None are
    nulls."""
    values = [text(v) for v in labels.values]
    null_codes = [k for k, v in enumerate(values) if v is None]
    mask = np.isin(labels.codes, null_codes) if null_codes else None
    return pa.DictionaryArray.from_arrays(
        pa.array(labels.codes, type=pa.int32(), mask=mask),
        pa.array(["" if v is None else v for v in values], type=pa.string()),
    )


def _types_text(types: tuple[str, ...]) -> str | None:
    return _SEP.join(types) if types else None


def _pack_blocks(
    parts: Sequence[Rows], n_rows: int
) -> tuple[IntArray, IntArray, HashIds, IntArray]:
    """(ids_offset, n_blocks, buffer, blocks added per row) for the file: the union of
    the block ranges the rows use in their own buffers, each range placed in the
    file's buffer when the first row that uses it comes."""
    index: dict[int, int] = {}
    buffers: list[HashIds] = []
    which: list[int] = []
    for t, _, _ in parts:
        k = index.setdefault(id(t.blocks), len(buffers))
        if k == len(buffers):
            buffers.append(t.blocks)
        which.append(k)
    offs = _column(parts, "ids_offset", np.int64)
    ns = _column(parts, "n_blocks", np.int64)
    buf = np.repeat(np.asarray(which, dtype=np.int64), [b - a for _, a, b in parts])
    span = max((x.size for x in buffers), default=0) + 1
    # One coordinate for all buffers: ranges of different buffers never touch.
    used = np.flatnonzero(ns > 0)
    lo = buf[used] * span + offs[used]
    order = used[np.argsort(lo, kind="stable")]
    lo_sorted = buf[order] * span + offs[order]
    hi_sorted = lo_sorted + ns[order]
    reach = np.maximum.accumulate(hi_sorted) if order.size else hi_sorted
    new_region = np.ones(order.size, dtype=bool)
    new_region[1:] = lo_sorted[1:] >= reach[:-1]  # touching ranges stay apart
    starts = np.flatnonzero(new_region)
    region = np.cumsum(new_region) - 1
    region_lo = lo_sorted[starts]
    region_hi = np.maximum.reduceat(hi_sorted, starts) if starts.size else region_lo
    first_row = np.minimum.reduceat(order, starts) if starts.size else region_lo
    placement = np.argsort(first_row, kind="stable")  # file order of the regions
    sizes = (region_hi - region_lo)[placement]
    file_start = np.zeros(starts.size, dtype=np.int64)
    file_start[placement] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ids_offset = np.zeros(n_rows, dtype=np.int64)
    ids_offset[order] = file_start[region] + lo_sorted - region_lo[region]
    added = np.zeros(n_rows, dtype=np.int64)
    added[first_row] = region_hi - region_lo
    pieces = []
    for r in placement.tolist():
        src = buffers[int(region_lo[r] // span)]
        at = int(region_lo[r] % span)
        pieces.append(src[at : at + int(region_hi[r] - region_lo[r])])
    values = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return ids_offset, ns, values, added


def write_store(trace: Trace, out: Path) -> None:
    """Write ``trace`` to a Parquet trace store at ``out``.

    The Parquet trace store: one row per request (the columns of
    ``traces.table.RequestTable``), the trace's block buffer run-length encoded across
    the rows, and the session tree (ids, spawn/join points, per-session fields) as JSON
    in the file's key-value metadata. Lossless, and loads many times faster than JSON.

    Format 2 stores each prompt chain once: a row holds where its prompt lies in the
    block buffer (``ids_offset``, ``n_blocks``) and the runs of blocks it adds to the
    buffer (runs of consecutive ids, the common case: the 6M-block buffer behind a
    347M-block AgentX corpus is ~3.4K runs). Reading builds no per-request objects: the
    sessions hold rows of one table. Format 1 (every row's whole prompt as runs) is
    still read.
    """
    flat = _flatten(trace)
    parts = session_rows(s for s, _, _ in flat)
    counts = [b - a for _, a, b in parts]
    n = sum(counts)
    floats = {
        name: _column(parts, name, np.float64)
        for name in ("t_s", "think_time_s", "api_time_s", "ttft_s")
    }
    labels: dict[str, Labels[Any]] = {
        name: Labels.concat([(getattr(t, name), a, b) for t, a, b in parts])
        for name in _LABEL_COLUMNS
    }
    extra: list[str | None] = [None] * n
    row = 0
    for t, a, b in parts:
        for i, e in request_extras(t.rows(a, b)):
            extra[row + i] = orjson.dumps(dict(e)).decode()
        row += b - a
    ids_offset, n_blocks, values, added = _pack_blocks(parts, n)
    arrays: list[pa.Array] = [
        pa.array(np.repeat(np.arange(len(flat), dtype=np.int32), counts)),
        pa.array(_column(parts, "input_tokens", np.int64)),
        pa.array(_column(parts, "output_tokens", np.int64)),
        pa.array(floats["t_s"]),
        pa.array(floats["think_time_s"]),
        pa.array(floats["api_time_s"], mask=np.isnan(floats["api_time_s"])),
        pa.array(floats["ttft_s"], mask=np.isnan(floats["ttft_s"])),
        _dictionary(labels["kind"], str),
        _dictionary(labels["model"], lambda v: v),
        _dictionary(labels["stop"], lambda v: v),
        _dictionary(labels["input_types"], _types_text),
        _dictionary(labels["output_types"], _types_text),
        pa.array(extra, type=pa.string()),
        pa.array(ids_offset),
        pa.array(n_blocks),
        *_encode_runs(values, added),
    ]
    # The think gap's parts: a column each only when some row knows it.
    schema = _SCHEMA
    for name in GAP_PARTS:
        if any(t.gap_part(name) is not None for t, _, _ in parts):
            col = np.concatenate([part_column(t, name, a, b) for t, a, b in parts])
            arrays.append(pa.array(col, mask=np.isnan(col)))
            schema = schema.append(pa.field(name, pa.float64()))
    meta = {
        "format": STORE_FORMAT,
        "source_format": trace.source_format,
        "sessions": [_session_meta(*f) for f in flat],
    }
    table = pa.Table.from_arrays(arrays, schema=schema).replace_schema_metadata(
        {_META_KEY: orjson.dumps(meta)}
    )
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TraceError(f"{out}: cannot write: {exc.strerror or exc}") from exc


def _encode_runs(
    values: HashIds, lengths: IntArray
) -> tuple[pa.ListArray, pa.ListArray]:
    """Runs of consecutive ids of ``values``, split into one list per row: row i
    holds the next ``lengths[i]`` values (runs never span two rows)."""
    n_total = values.size
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    is_start = np.ones(n_total, dtype=bool)
    if n_total > 1:
        with np.errstate(over="ignore"):  # wrapped int64 sums are never a run
            is_start[1:] = values[1:] != values[:-1] + 1
            is_start[1:] |= values[1:] < values[:-1]
    is_start[starts[lengths > 0]] = True
    run_idx = np.flatnonzero(is_start)
    run_lengths = np.diff(np.append(run_idx, n_total))
    # Runs per row: runs whose first element lies inside the row's share.
    run_offsets = np.searchsorted(run_idx, np.append(starts, n_total)).astype(np.int32)
    return (
        pa.ListArray.from_arrays(pa.array(run_offsets), pa.array(values[run_idx])),
        pa.ListArray.from_arrays(pa.array(run_offsets), pa.array(run_lengths)),
    )


# --------------------------------------------------------------------------- reading


def _decode_runs(run_starts: IntArray, run_lengths: IntArray) -> HashIds:
    """Ids from runs of consecutive ids: steps of 1 with a jump at each run start,
    summed in place (one array of the result's size, no temporaries)."""
    if run_lengths.size and int(run_lengths.min()) < 1:
        raise TraceError("trace store is corrupt: a run of no blocks")
    values = np.ones(int(run_lengths.sum()), dtype=np.int64)
    if values.size:
        pos = np.zeros(run_lengths.size, dtype=np.int64)
        np.cumsum(run_lengths[:-1], out=pos[1:])
        ends = run_starts[:-1] + run_lengths[:-1] - 1  # last id of each run
        values[pos[1:]] = run_starts[1:] - ends
        values[0] = run_starts[0]
        np.cumsum(values, out=values)  # int64 wraps like the ids it rebuilds
    return values


def _list_column(table: pa.Table, name: str) -> IntArray:
    flat: IntArray = table.column(name).combine_chunks().flatten().to_numpy()
    return flat


def _labels(column: pa.ChunkedArray, parse: Callable[[str], T]) -> Labels[T | None]:
    """Codes and values of a dictionary column; null rows decode to None."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    dictionary = [parse(v) for v in arr.dictionary.to_pylist()]
    codes = arr.indices.fill_null(len(dictionary)).to_numpy().astype(np.int32)
    return Labels(frozen(codes, np.int32), (*dictionary, None))


def _types(value: str) -> tuple[str, ...]:
    return tuple(value.split(_SEP))


def _empty_types(labels: Labels[tuple[str, ...] | None]) -> Labels[tuple[str, ...]]:
    return Labels(labels.codes, tuple(() if v is None else v for v in labels.values))


def _extra(column: pa.ChunkedArray) -> dict[int, dict[str, Any]]:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(valid)
    texts = column.filter(valid).to_pylist() if rows.size else []
    return {
        int(i): orjson.loads(text)
        for i, text in zip(rows.tolist(), texts, strict=True)
        if text
    }


def _v1_blocks(
    table: pa.Table, metas: Sequence[dict[str, Any]]
) -> tuple[HashIds, IntArray]:
    """Format 1 rows hold their whole prompt: decode one session at a time and keep
    its chains, so memory stays at the largest session's prompts."""
    lengths = table.column("n_blocks").to_numpy()
    run_starts = _list_column(table, "id_runs")
    run_lengths = _list_column(table, "id_run_lengths")
    runs_per_row = table.column("id_runs").combine_chunks().value_lengths().to_numpy()
    if int(run_lengths.sum()) != int(lengths.sum()):
        raise TraceError("trace store is corrupt: run lengths do not add up")
    run_at = np.concatenate([[0], np.cumsum(runs_per_row)]).astype(np.int64)
    pieces: list[HashIds] = []
    offsets = np.zeros(lengths.size, dtype=np.int64)
    size = 0
    row = 0
    for m in metas:
        end = row + int(m["n"])
        values = _decode_runs(
            run_starts[run_at[row] : run_at[end]],
            run_lengths[run_at[row] : run_at[end]],
        )
        chains = ChainBuilder()
        at = 0
        for i in range(row, end):
            n = int(lengths[i])
            offsets[i] = size + chains.add(values[at : at + n])
            at += n
        piece = chains.buffer()
        pieces.append(piece)
        size += piece.size
        row = end
    blocks = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return blocks, offsets


def read_store(path: Path) -> Trace:
    """Load a Parquet trace store written by :func:`write_store` (format 2 or 1)."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path}: not a readable Parquet trace store: {exc}") from exc
    raw = (schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise TraceError(f"{path}: a Parquet file, but not a trace store (no metadata)")
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{path}: trace store metadata is not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: trace store metadata is not a JSON object")
    fmt = meta.get("format")
    if fmt not in (STORE_FORMAT, _FORMAT_1):
        raise TraceError(f"{path}: unsupported trace store format {fmt!r}")
    metas = meta.get("sessions")
    if not isinstance(metas, list) or not all(
        isinstance(m, dict) and _is_count(m.get("n")) for m in metas
    ):
        raise TraceError(f"{path}: trace store metadata is corrupt: bad 'sessions'")
    try:
        table = pq.read_table(path, read_dictionary=list(_LABEL_COLUMNS))
        if fmt == STORE_FORMAT:
            blocks = _decode_runs(
                _list_column(table, "block_runs"),
                _list_column(table, "block_run_lengths"),
            )
            ids_offset = table.column("ids_offset").to_numpy()
        else:
            blocks, ids_offset = _v1_blocks(table, metas)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise TraceError(f"{path}: not a readable Parquet trace store: {exc}") from exc
    if sum(m["n"] for m in metas) != table.num_rows:
        raise TraceError(f"{path}: trace store is corrupt: session sizes != rows")
    col = table.column
    try:
        rows = RequestTable(
            input_tokens=col("input_tokens").to_numpy(),
            output_tokens=col("output_tokens").to_numpy(),
            t_s=col("t_s").to_numpy(),
            think_time_s=col("think_time_s").to_numpy(),
            api_time_s=col("api_time_s").to_numpy(),  # nulls come back as NaN
            ttft_s=col("ttft_s").to_numpy(),
            kind=_labels(col("kind"), str),  # type: ignore[arg-type]
            model=_labels(col("model"), str),
            stop=_labels(col("stop"), str),
            input_types=_empty_types(_labels(col("input_types"), _types)),
            output_types=_empty_types(_labels(col("output_types"), _types)),
            blocks=blocks,
            ids_offset=ids_offset,
            n_blocks=col("n_blocks").to_numpy(),
            extra=_extra(col("extra")),
            **{
                name: col(name).to_numpy()  # nulls come back as NaN
                for name in GAP_PARTS
                if name in table.column_names
            },
        )
    except ValueError as exc:
        raise TraceError(f"{path}: trace store is corrupt: {exc}") from exc
    problems = check_rows(path, metas, rows)
    if problems:
        raise TraceFormatError(problems)
    try:
        sessions = _rebuild(metas, rows)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise TraceError(f"{path}: trace store metadata is corrupt: {what}") from exc
    return Trace(
        sessions=sessions, source_format=str(meta.get("source_format", "parquet"))
    )


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_rows(
    path: Path, metas: Sequence[dict[str, Any]], rows: RequestTable
) -> list[Problem]:
    """The checks a JSON trace's reader makes on each request and session, made on
    a store's columns: counts in [0, MAX_TOKENS], times finite and >= 0, hash ids
    that fit the input at the session's block size. Each problem names the row's
    session and request index (within its session) and the field."""
    starts = np.zeros(len(metas) + 1, dtype=np.int64)
    np.cumsum([int(m["n"]) for m in metas], out=starts[1:])
    problems: list[Problem] = []

    def at(row: int, fld: str, reason: str) -> None:
        k = int(np.searchsorted(starts, row, side="right")) - 1
        problems.append(
            Problem(
                path=path,
                session_id=str(metas[k].get("id")),
                request_index=str(row - int(starts[k])),
                field=fld,
                reason=reason,
            )
        )

    block = np.ones(rows.n_blocks.size, dtype=np.int64)
    for k, m in enumerate(metas):
        size = m.get("block_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            problems.append(
                Problem(
                    path=path,
                    session_id=str(m.get("id")),
                    field="block_size",
                    reason=f"expected a positive integer, got {size!r:.40}",
                )
            )
        else:
            block[starts[k] : starts[k + 1]] = size
    for name, fld in (("input_tokens", "in"), ("output_tokens", "out")):
        col = getattr(rows, name)
        for i in np.flatnonzero((col < 0) | (col > MAX_TOKENS)).tolist():
            at(i, fld, f"expected an integer in [0, {MAX_TOKENS:,}], got {col[i]}")
    for name, fld, optional in (
        ("t_s", "t", False),
        ("think_time_s", "think_time", False),
        ("api_time_s", "api_time", True),
        ("ttft_s", "ttft", True),
        ("tool_wait_s", "tool_wait", True),
        ("human_wait_s", "human_wait", True),
    ):
        col = getattr(rows, name)
        if col is None:  # a think-gap part no row knows
            continue
        ok = np.isfinite(col) & (col >= 0) & (col <= MAX_SECONDS)
        if optional:
            ok |= np.isnan(col)
        for i in np.flatnonzero(~ok).tolist():
            at(
                i,
                fld,
                f"expected a finite number in [0, {MAX_SECONDS:,.0f}] s, got {col[i]}",
            )
    if rows.tool_wait_s is not None or rows.human_wait_s is not None:
        think = rows.think_time_s
        tool, human = (
            np.nan_to_num(part_column(rows, name, 0, len(rows))) for name in GAP_PARTS
        )
        for i in np.flatnonzero(tool + human > think).tolist():
            past = parts_past_gap(float(think[i]), float(tool[i]), float(human[i]))
            if past is not None:
                at(i, "tool_wait", past)
    inputs = np.clip(rows.input_tokens, 0, MAX_TOKENS)
    full, ceil = inputs // block, -(-inputs // block)
    n = rows.n_blocks
    # As the JSON reader: a row whose `in` is wrong has nothing to fit its ids to.
    fits = (n == full) | (n == ceil) | (inputs != rows.input_tokens)
    for i in np.flatnonzero(~fits).tolist():
        at(
            i,
            "hash_ids",
            f"{n[i]} blocks do not fit in={inputs[i]} with block_size={block[i]} "
            f"(expected {full[i]})",
        )
    return problems


def _rebuild(
    metas: Sequence[dict[str, Any]], rows: RequestTable
) -> tuple[Session, ...]:
    starts = np.zeros(len(metas) + 1, dtype=np.int64)
    np.cumsum([m["n"] for m in metas], out=starts[1:])
    bounds = starts.tolist()
    children: dict[int, list[int]] = {}
    for i, m in enumerate(metas):
        children.setdefault(m["parent"], []).append(i)

    def build(i: int) -> Session:
        m = metas[i]
        subs = []
        for c in children.get(i, []):
            sp = metas[c]["spawn"]
            subs.append(
                Subagent(
                    session=build(c),
                    anchor_index=sp["anchor_index"],
                    join_index=sp["join_index"],
                    agent_id=sp["agent_id"],
                    t_s=sp["t_s"],
                    subagent_type=sp["subagent_type"],
                    duration_ms=sp["duration_ms"],
                    total_tokens=sp["total_tokens"],
                    tool_use_count=sp["tool_use_count"],
                    status=sp["status"],
                    extra=sp["extra"],
                )
            )
        return Session(
            session_id=m["id"],
            requests=RequestRows(rows, bounds[i], bounds[i + 1]),
            subagents=tuple(subs),
            block_size=m["block_size"],
            hash_id_scope=m["scope"],
            start_s=m["start_s"],
            models=tuple(m["models"]),
            tool_tokens=m["tool_tokens"],
            system_tokens=m["system_tokens"],
            extra=m["extra"],
        )

    return tuple(build(i) for i in children.get(-1, []))
