"""The columnar request table (:class:`RequestTable`: numpy columns and one block
buffer) and :class:`RequestRows`, the ``Sequence[Request]`` over its rows that sessions
hold. No I/O. See docs/architecture.md."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar, overload

import numpy as np
import numpy.typing as npt

from traces.model import HashIds, Request, Session

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
CodeArray = npt.NDArray[np.int32]
T = TypeVar("T", bound=Hashable)

_NUMERIC = ("input_tokens", "output_tokens", "t_s", "think_time_s")
_OPTIONAL = ("api_time_s", "ttft_s")  # NaN = not recorded
_LABELS = ("kind", "model", "stop", "input_types", "output_types")
# The think gap's parts (traces.model.Request): a column only when some row knows
# it, NaN in the rows that do not.
GAP_PARTS = ("tool_wait_s", "human_wait_s")


def frozen(values: npt.ArrayLike, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """``values`` as a read-only 1-D array of ``dtype`` (a view when it already is)."""
    arr = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
    if arr.flags.writeable:
        arr = arr.view()
        arr.setflags(write=False)
    return arr


_ZERO_CODES: dict[int, CodeArray] = {}


def _zero_codes(n: int) -> CodeArray:
    """A read-only int32 array of ``n`` zeros, shared by every small one-value column
    (tables of one-request sessions would otherwise build thousands of them)."""
    codes = _ZERO_CODES.get(n)
    if codes is None:
        codes = np.zeros(n, dtype=np.int32)
        codes.setflags(write=False)
        if n <= 1024:
            _ZERO_CODES[n] = codes
    return codes


def _column(values: list[Any], dtype: type[np.generic]) -> npt.NDArray[Any]:
    """A fresh read-only 1-D array of ``values`` (what :func:`frozen` makes of a list,
    without the view)."""
    arr = np.array(values, dtype=dtype)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class Labels(Generic[T]):
    """A column of few distinct values: int32 codes into ``values``."""

    codes: CodeArray
    values: tuple[T, ...]

    @classmethod
    def of(cls, items: Sequence[T]) -> Labels[T]:
        """Encode ``items`` (values in order of first appearance)."""
        if items and items.count(items[0]) == len(items):  # one value: the usual case
            return cls(_zero_codes(len(items)), (items[0],))
        values = tuple(dict.fromkeys(items))
        index = {v: k for k, v in enumerate(values)}
        codes = np.fromiter(map(index.__getitem__, items), np.int32, count=len(items))
        return cls(frozen(codes, np.int32), values)

    @classmethod
    def constant(cls, value: T, n: int) -> Labels[T]:
        return cls(frozen(np.zeros(n, dtype=np.int32), np.int32), (value,))

    @classmethod
    def concat(cls, parts: Sequence[tuple[Labels[T], int, int]]) -> Labels[T]:
        """Rows [start, stop) of each part, one after the other, re-coded."""
        index: dict[T, int] = {}
        codes: list[CodeArray] = []
        for labels, start, stop in parts:
            remap = np.array(
                [index.setdefault(v, len(index)) for v in labels.values],
                dtype=np.int32,
            )
            codes.append(remap[labels.codes[start:stop]])
        joined = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int32)
        return cls(frozen(joined, np.int32), tuple(index))

    def __len__(self) -> int:
        return int(self.codes.size)

    def __getitem__(self, i: int) -> T:
        return self.values[int(self.codes[i])]

    def tolist(self, start: int = 0, stop: int | None = None) -> list[T]:
        values = self.values
        return [values[c] for c in self.codes[start:stop].tolist()]


# Request's fields in order: rows become requests without its __init__ (the table's
# columns already hold valid values), which halves the cost of a full scan.
_REQUEST_FIELDS = (
    "input_tokens",
    "output_tokens",
    "hash_ids",
    "t_s",
    "think_time_s",
    "api_time_s",
    "ttft_s",
    *_LABELS,
    "extra",
    *GAP_PARTS,
)
if tuple(f.name for f in fields(Request)) != _REQUEST_FIELDS:
    raise ImportError("traces.table is out of step with traces.model.Request's fields")
(
    _set_in,
    _set_out,
    _set_ids,
    _set_t,
    _set_think,
    _set_api,
    _set_ttft,
    _set_kind,
    _set_model,
    _set_stop,
    _set_in_types,
    _set_out_types,
    _set_extra,
    _set_tool,
    _set_human,
) = (getattr(Request, name).__set__ for name in _REQUEST_FIELDS)


def _request(
    input_tokens: int,
    output_tokens: int,
    hash_ids: HashIds,
    t_s: float,
    think_time_s: float,
    api_time_s: float | None,
    ttft_s: float | None,
    kind: str,
    model: str | None,
    stop: str | None,
    input_types: tuple[str, ...],
    output_types: tuple[str, ...],
    extra: Mapping[str, Any],
    tool_wait_s: float | None,
    human_wait_s: float | None,
) -> Request:
    # Unrolled slot stores: a loop over the slots costs 2.5x as much.
    r: Request = object.__new__(Request)
    _set_in(r, input_tokens)
    _set_out(r, output_tokens)
    _set_ids(r, hash_ids)
    _set_t(r, t_s)
    _set_think(r, think_time_s)
    _set_api(r, api_time_s)
    _set_ttft(r, ttft_s)
    _set_kind(r, kind)
    _set_model(r, model)
    _set_stop(r, stop)
    _set_in_types(r, input_types)
    _set_out_types(r, output_types)
    _set_extra(r, extra)
    _set_tool(r, tool_wait_s)
    _set_human(r, human_wait_s)
    return r


_BUILT_ROWS = 256


def _no_extra() -> dict[int, Mapping[str, Any]]:
    return {}


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RequestTable:
    """Requests as columns, one row each, in the order their sessions list them.

    A row's hash ids are ``blocks[ids_offset : ids_offset + n_blocks]``: rows share
    blocks, so the table costs the blocks it holds, not the sum of its prompts.

    The columnar request table: many requests as numpy columns plus one buffer of
    hash-id blocks, each row's prompt a slice (``ids_offset``, ``n_blocks``) of it; and
    :class:`RequestRows`, the ``Sequence[Request]`` over a range of rows that sessions
    hold.

    Owns chain compaction (a request whose prompt extends the previous one of its
    session adds only its new blocks, so a session costs its unique blocks, not the sum
    of its prompt lengths) and :func:`session_rows`, the bridge from any
    ``Session.requests`` to rows. A ``Request`` object is built only when one is asked
    for. No I/O.
    """

    input_tokens: IntArray
    output_tokens: IntArray
    t_s: FloatArray
    think_time_s: FloatArray
    api_time_s: FloatArray  # NaN: not recorded
    ttft_s: FloatArray  # NaN: not recorded
    kind: Labels[str]
    model: Labels[str | None]
    stop: Labels[str | None]
    input_types: Labels[tuple[str, ...]]
    output_types: Labels[tuple[str, ...]]
    blocks: HashIds  # the block buffer (read-only int64)
    ids_offset: IntArray
    n_blocks: IntArray
    # Row → its unknown fields, kept verbatim; most rows have none.
    extra: Mapping[int, Mapping[str, Any]] = field(default_factory=_no_extra)
    # The think gap's parts (NaN: not known for that row); None when no row knows.
    tool_wait_s: FloatArray | None = None
    human_wait_s: FloatArray | None = None
    # Rows whose extra is not empty, sorted (derived from ``extra``).
    extra_rows: IntArray = field(init=False, repr=False)
    # The last rows built by ``request`` (a replay asks for one row several times).
    _built: dict[int, Request] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in (*_NUMERIC, *_OPTIONAL, "ids_offset", "n_blocks"):
            dtype = (
                np.float64 if name in ("t_s", "think_time_s", *_OPTIONAL) else np.int64
            )
            object.__setattr__(self, name, frozen(getattr(self, name), dtype))
        object.__setattr__(self, "blocks", frozen(self.blocks, np.int64))
        for name in GAP_PARTS:
            col = getattr(self, name)
            if col is not None:
                object.__setattr__(self, name, frozen(col, np.float64))
        rows = sorted(i for i, e in self.extra.items() if e)
        object.__setattr__(self, "extra_rows", frozen(rows, np.int64))
        object.__setattr__(self, "_built", {})
        n = self.input_tokens.size
        sizes = {getattr(self, name).size for name in (*_NUMERIC, *_OPTIONAL)}
        sizes |= {len(getattr(self, name)) for name in _LABELS}
        sizes |= {self.ids_offset.size, self.n_blocks.size}
        sizes |= {c.size for c in map(self.gap_part, GAP_PARTS) if c is not None}
        if sizes != {n}:
            raise ValueError(f"request table columns differ in length: {sorted(sizes)}")
        if n and (
            int(self.n_blocks.min()) < 0
            or int(self.ids_offset.min()) < 0
            or int((self.ids_offset + self.n_blocks).max()) > self.blocks.size
        ):
            raise ValueError("request table: a row's hash ids lie outside its blocks")

    def __len__(self) -> int:
        return int(self.input_tokens.size)

    def gap_part(self, name: str) -> FloatArray | None:
        """The column of one think-gap part (``GAP_PARTS``); None: no row knows it."""
        col: FloatArray | None = getattr(self, name)
        return col

    def hash_ids(self, i: int) -> HashIds:
        """Row ``i``'s hash ids: a read-only view into ``blocks``."""
        off = int(self.ids_offset[i])
        return self.blocks[off : off + int(self.n_blocks[i])]

    def request(self, i: int) -> Request:
        """Row ``i`` as a :class:`Request` (a frozen value: the last few built are
        kept and handed out again)."""
        built = self._built
        req = built.get(i)
        if req is None:
            req = built[i] = next(self.requests(i, i + 1))
            if len(built) > _BUILT_ROWS:
                del built[next(iter(built))]
        return req

    def requests(self, start: int, stop: int) -> Iterator[Request]:
        """Rows [start, stop) as :class:`Request` objects, built one by one as the
        iteration asks (the columns are read in bulk)."""
        rows = zip(
            *(
                getattr(self, name)[start:stop].tolist()
                for name in (*_NUMERIC, *_OPTIONAL, "ids_offset", "n_blocks")
            ),
            *(getattr(self, name).tolist(start, stop) for name in _LABELS),
            strict=True,
        )
        blocks, extra = self.blocks, self.extra
        tools, humans = (
            itertools.repeat(None) if c is None else iter(c[start:stop].tolist())
            for c in map(self.gap_part, GAP_PARTS)
        )
        for k, row in enumerate(rows, start):
            ins, outs, t, think, api, ttft, off, n, kind, model, stop_, i_t, o_t = row
            tool, human = next(tools), next(humans)
            yield _request(
                ins,
                outs,
                blocks[off : off + n],
                t,
                think,
                None if api != api else api,  # NaN: not recorded
                None if ttft != ttft else ttft,
                kind,
                model,
                stop_,
                i_t,
                o_t,
                extra.get(k, {}),
                None if tool != tool else tool,  # NaN: not known
                None if human != human else human,
            )

    def rows(self, start: int = 0, stop: int | None = None) -> RequestRows:
        """Rows [start, stop) as a sequence of requests."""
        return RequestRows(self, start, len(self) if stop is None else stop)

    @classmethod
    def from_requests(
        cls, requests: Iterable[Request], *, chain_breaks: Iterable[int] = ()
    ) -> RequestTable:
        """A table of ``requests``; each request whose hash ids extend the longest
        prompt so far of its chain adds only its new blocks. A chain restarts at a
        request that does not extend it and at every row in ``chain_breaks`` (session
        boundaries: chains never span sessions)."""
        reqs = list(requests)
        chains = ChainBuilder()
        breaks = set(chain_breaks)
        offsets: list[int] = []
        for i, r in enumerate(reqs):
            if i in breaks:
                chains.restart()
            offsets.append(chains.add(r.hash_ids))
        nan = float("nan")
        parts = {
            name: _column(
                [nan if (v := getattr(r, name)) is None else v for r in reqs],
                np.float64,
            )
            for name in GAP_PARTS
            if any(getattr(r, name) is not None for r in reqs)
        }
        extra = {i: r.extra for i, r in enumerate(reqs) if r.extra}
        # Every column is built here with its dtype, read-only and of one length, and
        # the offsets lie inside the buffer by construction: __post_init__'s checks and
        # conversions (most of the cost of a small session's table) are skipped.
        table: RequestTable = object.__new__(cls)
        for name, value in (
            ("input_tokens", _column([r.input_tokens for r in reqs], np.int64)),
            ("output_tokens", _column([r.output_tokens for r in reqs], np.int64)),
            ("t_s", _column([r.t_s for r in reqs], np.float64)),
            ("think_time_s", _column([r.think_time_s for r in reqs], np.float64)),
            (
                "api_time_s",
                _column(
                    [nan if (v := r.api_time_s) is None else v for r in reqs],
                    np.float64,
                ),
            ),
            (
                "ttft_s",
                _column(
                    [nan if (v := r.ttft_s) is None else v for r in reqs], np.float64
                ),
            ),
            ("kind", Labels.of([r.kind for r in reqs])),
            ("model", Labels.of([r.model for r in reqs])),
            ("stop", Labels.of([r.stop for r in reqs])),
            ("input_types", Labels.of([r.input_types for r in reqs])),
            ("output_types", Labels.of([r.output_types for r in reqs])),
            ("blocks", chains.buffer()),
            ("ids_offset", _column(offsets, np.int64)),
            ("n_blocks", _column([r.hash_ids.size for r in reqs], np.int64)),
            ("extra", extra),
            ("tool_wait_s", parts.get("tool_wait_s")),
            ("human_wait_s", parts.get("human_wait_s")),
            ("extra_rows", _column(sorted(i for i, e in extra.items()), np.int64)),
            ("_built", {}),
        ):
            object.__setattr__(table, name, value)
        return table


class ChainBuilder:
    """Appends prompts (hash-id arrays) to one block buffer; a prompt that extends the
    current chain (the longest prompt added since the last restart) appends only its
    new blocks. ``add`` returns where the prompt starts in the buffer."""

    __slots__ = ("_longest", "_pieces", "_size", "_start")

    def __init__(self) -> None:
        self._pieces: list[HashIds] = []
        self._size = 0
        self._start = 0
        self._longest: HashIds | None = None

    def restart(self) -> None:
        self._longest = None

    def add(self, ids: HashIds) -> int:
        longest = self._longest
        if longest is not None:
            m = min(ids.size, longest.size)
            # Chained ids usually differ at the last shared block when they differ at
            # all: that test is cheap, the full comparison is the proof.
            if m == 0 or (
                ids[m - 1] == longest[m - 1] and bool((ids[:m] == longest[:m]).all())
            ):
                if ids.size > longest.size:
                    self._pieces.append(ids[longest.size :])
                    self._size += ids.size - longest.size
                    self._longest = ids
                return self._start
        self._start = self._size
        self._pieces.append(ids)
        self._size += ids.size
        self._longest = ids
        return self._start

    def buffer(self) -> HashIds:
        """The blocks added so far, as one read-only array."""
        if not self._pieces:
            return frozen(np.zeros(0, dtype=np.int64), np.int64)
        return frozen(np.concatenate(self._pieces), np.int64)


class RequestRows(Sequence[Request]):
    """Rows [start, stop) of a :class:`RequestTable` as a read-only sequence of
    requests (``Session.requests`` of sessions read or generated in bulk). Indexing
    builds the :class:`Request`; slicing returns rows of the same table."""

    __slots__ = ("_start", "_stop", "_table")

    def __init__(self, table: RequestTable, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= len(table):
            raise ValueError(f"rows [{start}, {stop}) outside a {len(table)}-row table")
        self._table = table
        self._start = start
        self._stop = stop

    @property
    def table(self) -> RequestTable:
        return self._table

    @property
    def start(self) -> int:
        return self._start

    @property
    def stop(self) -> int:
        return self._stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, i: int) -> Request: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Request]: ...

    def __getitem__(self, i: int | slice) -> Request | Sequence[Request]:
        n = self._stop - self._start
        if isinstance(i, slice):
            lo, hi, step = i.indices(n)
            if step == 1:
                return RequestRows(
                    self._table, self._start + lo, self._start + max(lo, hi)
                )
            return tuple(
                self._table.request(self._start + k) for k in range(lo, hi, step)
            )
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        return self._table.request(self._start + i)

    def __iter__(self) -> Iterator[Request]:
        return self._table.requests(self._start, self._stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestRows):
            return _rows_equal(self, other)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestRows({len(self)} requests)"


def _rows_equal(a: RequestRows, b: RequestRows) -> bool:
    if len(a) != len(b):
        return False
    ta, tb = a.table, b.table
    sa, sb = slice(a.start, a.stop), slice(b.start, b.stop)
    for name in (*_NUMERIC, *_OPTIONAL, "n_blocks"):
        if not np.array_equal(
            getattr(ta, name)[sa], getattr(tb, name)[sb], equal_nan=True
        ):
            return False
    for name in _LABELS:
        la: Labels[Any] = getattr(ta, name)
        lb: Labels[Any] = getattr(tb, name)
        if la.tolist(a.start, a.stop) != lb.tolist(b.start, b.stop):
            return False
    for name in GAP_PARTS:
        if not np.array_equal(
            part_column(ta, name, a.start, a.stop),
            part_column(tb, name, b.start, b.stop),
            equal_nan=True,
        ):
            return False
    for k in range(len(a)):
        if dict(ta.extra.get(a.start + k, {})) != dict(tb.extra.get(b.start + k, {})):
            return False
    if ta.blocks is tb.blocks and np.array_equal(ta.ids_offset[sa], tb.ids_offset[sb]):
        return True
    return all(
        np.array_equal(ta.hash_ids(a.start + k), tb.hash_ids(b.start + k))
        for k in range(len(a))
    )


def part_column(table: RequestTable, name: str, start: int, stop: int) -> FloatArray:
    """Rows [start, stop) of one think-gap part, NaN where not known."""
    col = table.gap_part(name)
    if col is None:
        return np.full(stop - start, np.nan)
    return col[start:stop]


Rows = tuple[RequestTable, int, int]
"""A session's requests as (table, first row, end row)."""


def session_rows(sessions: Iterable[Session]) -> list[Rows]:
    """Each session's requests as rows of a table. Sessions that hold
    :class:`RequestRows` give theirs; the others (tuples of requests) are converted
    together into one table, chains compacted within each session."""
    sessions = list(sessions)
    out: list[Rows | None] = []
    loose: list[Request] = []
    breaks: list[int] = []
    pending: list[tuple[int, int, int]] = []  # (index in out, first row, end row)
    for s in sessions:
        reqs = s.requests
        if isinstance(reqs, RequestRows):
            out.append((reqs.table, reqs.start, reqs.stop))
            continue
        pending.append((len(out), len(loose), len(loose) + len(reqs)))
        breaks.append(len(loose))
        loose.extend(reqs)
        out.append(None)
    if pending:
        table = RequestTable.from_requests(loose, chain_breaks=breaks)
        for k, start, stop in pending:
            out[k] = (table, start, stop)
    return [r for r in out if r is not None]


def table_of(requests: Sequence[Request]) -> RequestRows:
    """``requests`` as rows of a table (converted, chains compacted, unless they
    already are rows)."""
    if isinstance(requests, RequestRows):
        return requests
    return RequestTable.from_requests(requests).rows()


def request_column(requests: Sequence[Request], name: str) -> npt.NDArray[Any]:
    """One numeric field of every request, as an array: ``input_tokens``,
    ``output_tokens``, ``t_s``, ``think_time_s``, ``api_time_s`` / ``ttft_s`` (NaN:
    not recorded), a think-gap part (``tool_wait_s``, ``human_wait_s``; NaN: not
    known) or ``n_blocks``. A view, with no request objects built, when
    ``requests`` are rows; scans of a whole trace should use this."""
    if name not in (*_NUMERIC, *_OPTIONAL, *GAP_PARTS, "n_blocks"):
        raise ValueError(f"not a numeric request column: {name!r}")
    if isinstance(requests, RequestRows) and name in GAP_PARTS:
        return part_column(requests.table, name, requests.start, requests.stop)
    if isinstance(requests, RequestRows):
        col: npt.NDArray[Any] = getattr(requests.table, name)
        return col[requests.start : requests.stop]
    if name == "n_blocks":
        return np.array([r.hash_ids.size for r in requests], dtype=np.int64)
    values = [getattr(r, name) for r in requests]
    if name in (*_OPTIONAL, *GAP_PARTS):
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    dtype = np.int64 if name in ("input_tokens", "output_tokens") else np.float64
    return np.array(values, dtype=dtype)


def request_extras(
    requests: Sequence[Request],
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(index, unknown fields) of the requests that carry any, in order; rows are
    visited without building request objects."""
    if isinstance(requests, RequestRows):
        table, start = requests.table, requests.start
        lo, hi = np.searchsorted(table.extra_rows, [start, requests.stop]).tolist()
        for i in table.extra_rows[lo:hi].tolist():
            yield i - start, table.extra[i]
        return
    yield from ((i, r.extra) for i, r in enumerate(requests) if r.extra)
