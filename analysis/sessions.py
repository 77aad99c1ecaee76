"""Session-tree roll-ups from request rows: wall time, critical-path TTFT and the time a
parent waited on its subagents. Pure, and needs no trace (:func:`session_trees`).
See docs/metrics.md."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.metrics import column, is_warmup, plain_column

_NS_PER_MS = 1e6
TREE_COLUMNS = (
    "root_session_id",
    "requests",
    "sessions",
    "subagent_requests",
    "wall_ms",
    "critical_path_ttft_ms",
    "join_wait_ms",
    "warmup",
)


class _Ids:
    """A frame's session ids as integer codes: each session's, and for the parent
    and root columns their own category codes with the session code of each
    category (-1: none), looked up only where needed (the rows' codes are the
    frame's: no per-row array of 40 MB at 10M rows held while the joins are
    searched)."""

    def __init__(self, df: pd.DataFrame) -> None:
        sess = df["session_id"].astype("category")
        self.names = sess.cat.categories
        # int32: half the memory of intp at 10M rows, and the same sessions.
        self.sid = sess.array.codes.astype(np.int32, copy=False)  # (a view)
        self._of = {name: self._onto(df[name]) for name in _LINKS}

    def _onto(self, ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        c = ids.astype("category")
        # Code -1 (null) reads the last entry: -1.
        remap = np.append(self.names.get_indexer(c.cat.categories), -1)
        return c.array.codes, remap.astype(np.int32)  # the codes: a view

    def of(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The session codes of column ``name`` (-1: none), of ``rows`` or all."""
        codes, remap = self._of[name]
        out: np.ndarray = remap[codes if rows is None else codes[rows]]
        return out


_LINKS = ("parent_session_id", "root_session_id")
_BLOCK = 1 << 20  # rows at a time where a pass needs their row numbers


def _times(df: pd.DataFrame, name: str) -> np.ndarray:
    """A time column: a plain integer one as it is (no nulls: exact, and no
    float64 copy of 80 MB at 10M rows), else float64 with NaN for null. Its
    values fit a float64 exactly (ns offsets under 104 days), so the roll-ups
    are the same either way."""
    raw = plain_column(df, name)
    if raw is not None and raw.dtype.kind in "iu":
        return raw
    return column(df, name)


def _rows_of(df: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    """``column(df, name)[rows]``, the same floats: a plain numeric column's rows
    taken before the cast (not a float64 copy of the whole column first)."""
    raw = plain_column(df, name)
    out: np.ndarray = (
        column(df, name)[rows] if raw is None else raw[rows].astype(np.float64)
    )
    return out


def _positive(df: pd.DataFrame, name: str) -> np.ndarray:
    """Rows whose ``name`` is > 0 (null: not): a plain integer column compared as
    it is, not through a float64 copy."""
    raw = plain_column(df, name)
    values = raw if raw is not None and raw.dtype.kind in "iu" else column(df, name)
    out: np.ndarray = np.greater(values, 0)
    return out


def _sessions(df: pd.DataFrame, ids: _Ids) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sent rows with integer session codes, one row per session)."""
    sid = ids.sid
    start = _times(df, "start_ns")
    end = _times(df, "end_ns")
    ttft = _times(df, "ttft_ns")
    # Copies only where needed: at 10M rows each is 80 MB (only a float column,
    # one with nulls, has NaN).
    if end.dtype.kind == "f" and np.isnan(end).any():  # a cancelled row may
        # have no end: it held the session until it was sent
        end = np.where(np.isnan(end), start, end)
    if ttft.dtype.kind == "f" and np.isnan(ttft).any():
        ttft = np.nan_to_num(ttft)
    who = sid
    if start.dtype.kind == "f" and np.isnan(start).any():  # rows never sent
        sent = ~np.isnan(start)
        who, start, end, ttft = sid[sent], start[sent], end[sent], ttft[sent]
    rows = pd.DataFrame(
        {"sid": who, "start": start, "end": end, "ttft": ttft}, copy=False
    )
    del who, start, end, ttft
    # First row of each session, O(n): later writes of a reversed range win (a
    # block at a time from the last: no row numbers of the whole frame at once).
    n = sid.size
    first = np.zeros(int(sid.max()) + 1 if n else 0, dtype=np.int64)
    for at in range((n - 1) // _BLOCK * _BLOCK, -1, -_BLOCK):
        stop = min(at + _BLOCK, n)
        first[sid[at:stop][::-1]] = np.arange(stop - 1, at - 1, -1)
    size = first.size
    present = np.zeros(size, dtype=bool)
    present[sid] = True
    if not present.all():  # codes of no row (a frame cut from a larger one)
        first = first[present]
    meta = pd.DataFrame(
        {
            "parent": ids.of("parent_session_id", first),
            "root": ids.of("root_session_id", first),
            "depth": np.nan_to_num(_rows_of(df, "agent_depth", first)),
        },
        index=pd.Index(sid[first], name="sid"),
    )
    per = _per_session(rows, size=size)
    # As floats from here on (one row a session), as if the rows had been.
    per = meta.join(per, how="left")
    per["ttft"] = per["ttft"].fillna(0.0)
    return rows.drop(columns="ttft"), per  # the rest reads no TTFT


def _per_session(rows: pd.DataFrame, *, size: int) -> pd.DataFrame:
    """Per session code with rows in ``rows`` (codes below ``size``, ascending):
    first start, last end and Σ TTFT, as float64. One unbuffered pass of each
    reduction into a table of the codes (``ufunc.at``), where a group-by sorted
    the rows and took a copy of each column in that order (0.5 s and 0.3 GB at
    10M rows). The same values: integer sums kept in 64-bit integers, float
    minima and maxima exact; float sums added in row order (the group-by's are
    compensated), the same while they are whole nanoseconds under 2**53 (104
    days a session), as a run's are."""
    sid = rows["sid"].to_numpy()
    present = np.zeros(size, dtype=bool)  # (a bincount widens the codes first)
    present[sid] = True
    codes = np.flatnonzero(present)
    out: dict[str, np.ndarray] = {}
    for name, source, ufunc in (
        ("first_start", "start", np.minimum),
        ("last_end", "end", np.maximum),
        ("ttft", "ttft", np.add),
    ):
        values = rows[source].to_numpy()
        kind = values.dtype.kind
        if ufunc is np.add and kind in "iu":  # summed in 64 bits, as a group-by does
            values = values.astype(np.int64 if kind == "i" else np.uint64, copy=False)
        if ufunc is np.add:
            start: float | int = 0
        elif kind == "f":
            start = math.inf if ufunc is np.minimum else -math.inf
        else:
            limits = np.iinfo(values.dtype)
            start = limits.max if ufunc is np.minimum else limits.min
        table = np.full(size, start, dtype=values.dtype)
        ufunc.at(table, sid, values)  # one dtype: numpy's fast loop
        out[name] = table[codes].astype(np.float64)
    return pd.DataFrame(out, index=pd.Index(codes.astype(sid.dtype), name="sid"))


def _joins(rows: pd.DataFrame, per: pd.DataFrame) -> pd.DataFrame:
    """Subagent sessions that ran entirely between two parent requests.

    Subagent S of parent P is joined at P's request j when j is P's first request
    sent at or after S's last end and P's previous request ended at or before S's
    first start. A subagent overlapping a parent request runs in the background.
    """
    subs = per[(per["parent"] >= 0) & per["last_end"].notna()].reset_index()
    if subs.empty:
        return pd.DataFrame(
            columns=["sid", "parent", "last_end", "join_start", "prev_end"]
        )
    is_parent = np.zeros(int(rows["sid"].max()) + 1, dtype=bool)
    is_parent[subs["parent"].to_numpy()] = True
    sid = rows["sid"].to_numpy()
    mine = is_parent[sid]
    # One sort by start serves both: merge_asof's order and each parent's previous
    # request (groupby-shift keeps row order within a group). Timsort: rows arrive
    # nearly in start order. Plain arrays, taken once: a 10M-row frame's take and
    # assign copied every column twice.
    start = rows["start"].to_numpy()[mine].astype(np.float64, copy=False)
    order = np.argsort(start, kind="stable")
    start = start[order]
    sid = sid[mine][order]
    end = rows["end"].to_numpy()[mine][order].astype(np.float64, copy=False)
    del mine, order
    prev_end = pd.Series(end, copy=False).groupby(sid).shift(1).to_numpy()
    del end
    right = pd.DataFrame(
        {"parent": sid, "join_start": start, "prev_end": prev_end}, copy=False
    )
    found = pd.merge_asof(
        subs.sort_values("last_end"),
        right,
        left_on="last_end",
        right_on="join_start",
        by="parent",
        direction="forward",
    )
    joined = found["prev_end"].notna() & (found["prev_end"] <= found["first_start"])
    return found.loc[joined, ["sid", "parent", "last_end", "join_start", "prev_end"]]


def session_trees(df: pd.DataFrame) -> pd.DataFrame:
    """One row per session tree (``root_session_id``), durations in ms.

    Population: every row for ``requests``; rows that were sent (start_ns not null)
    for the times; a row without end_ns ends at its start.

    - ``wall_ms``: last end - first start over the tree's rows.
    - ``join_wait_ms``: time the root agent was blocked on subagents: for each join
      (see ``_joins``), from the end of the root's request before the join until the
      last joined subagent ended (at most until the join request was sent), summed.
      The rest of that gap is think time and dispatch.
    - ``critical_path_ttft_ms``: cp(root), with cp(S) = Σ TTFT of S's own requests +
      Σ over S's joins of cp(the joined subagent that ended last): the prefill waits
      the user sat through on the path that set the tree's wall time (a background
      subagent, and a joined one that finished early, are off that path).
    - ``warmup``: whether any of its rows was sent in the warm-up window.
    """
    if df.empty:
        return pd.DataFrame(columns=list(TREE_COLUMNS))
    ids = _Ids(df)
    names = ids.names
    rows, per = _sessions(df, ids)
    joins = _joins(rows, per)
    # Join wait: per (parent, join request) the latest subagent end, clipped.
    wait = pd.Series(0.0, index=per.index)
    cp = per["ttft"].astype(float).copy()
    if not joins.empty:
        g = joins.groupby(["parent", "join_start"]).agg(
            last_end=("last_end", "max"), prev_end=("prev_end", "first")
        )
        blocked = (
            np.minimum(g["last_end"], g.index.get_level_values(1)) - g["prev_end"]
        ).clip(lower=0)
        wait = wait.add(blocked.groupby(level="parent").sum(), fill_value=0.0)
        # Critical path, bottom-up: a child's cp is final before its parent's.
        joins = joins.assign(depth=per.loc[joins["sid"], "depth"].to_numpy())
        for depth in sorted(joins["depth"].unique(), reverse=True):
            level = joins[joins["depth"] == depth]
            last = level.loc[
                level.groupby(["parent", "join_start"])["last_end"].idxmax()
            ]
            add = cp.loc[last["sid"]].groupby(last["parent"].to_numpy()).sum()
            cp = cp.add(add, fill_value=0.0)
    roots = per[per.index == per["root"]]
    n_codes = len(names)
    # Widened once, not by each bincount; counts of the rows where a flag is set
    # taken on those rows (the same counts as summed 0/1 weights).
    # Each row's tree: its root's code, its own where it has no root.
    tree = ids.of("root_session_id").astype(np.intp)
    np.copyto(tree, ids.sid, where=tree < 0)
    requests = np.bincount(tree, minlength=n_codes)
    sub_reqs = np.bincount(tree[_positive(df, "agent_depth")], minlength=n_codes)
    warm = np.bincount(tree[is_warmup(df)], minlength=n_codes) > 0
    del tree
    sessions = np.bincount(
        np.where(per["root"] >= 0, per["root"], per.index), minlength=n_codes
    )
    span = per.groupby("root").agg(
        first=("first_start", "min"), last=("last_end", "max")
    )
    r = roots.index.to_numpy()
    trees = pd.DataFrame(
        {
            "root_session_id": names[r],
            "requests": requests[r],
            "sessions": sessions[r],
            "subagent_requests": sub_reqs[r].astype(np.int64),
            # Wall time spans the whole tree, not only the root session's own rows.
            "wall_ms": (span["last"] - span["first"]).reindex(r).to_numpy()
            / _NS_PER_MS,
            "critical_path_ttft_ms": cp.loc[r].to_numpy() / _NS_PER_MS,
            "join_wait_ms": wait.loc[r].to_numpy() / _NS_PER_MS,
            "warmup": warm[r],
        }
    )
    return trees[list(TREE_COLUMNS)]
