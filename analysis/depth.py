"""Figures by position in the session: by turn (power-of-two buckets) and by subagent
depth, as SGLang's HiCache plots show them. Pure: a numeric request frame in, table
rows out. See docs/metrics.md#kv-cache."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from analysis.results import PositionRow

_NS_PER_MS = 1e6
FloatArray = npt.NDArray[np.float64]


def turn_bucket(request_index: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Bucket of each turn index: 0, 1, 2-3, 4-7, 8-15, ... (bucket k >= 1 holds
    indices 2^(k-1) to 2^k - 1)."""
    idx = np.floor(request_index)  # NaN (unknown) stays NaN: bucket 0
    # The bucket is the index's bit length: frexp's exponent (exact, unlike log2).
    exponent = np.frexp(idx)[1].astype(np.int64)
    out: npt.NDArray[np.int64] = np.where(idx >= 1, exponent, 0)
    return out


def _bucket_label(k: int) -> str:
    if k == 0:
        return "0"
    lo, hi = 1 << (k - 1), (1 << k) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


class _Table:
    """One table being filled: the group of each kept row (ok, measured), and its
    figures per group, a column at a time (so that only one or two kept columns
    are held at once, not all seven)."""

    def __init__(self, g: npt.NDArray[np.int64], labels: dict[int, str]) -> None:
        self.labels = labels
        self.n = int(g.max()) + 1 if g.size else 0
        self.count = np.bincount(g, minlength=self.n)
        # Small group numbers held in 2 bytes (a quarter of the memory at 10M rows;
        # bincount widens them as it reads) and sorted by radix.
        self.g: npt.NDArray[np.integer[Any]] = (
            g.astype(np.int16) if self.n < 2**15 else g
        )
        self.figures: dict[str, list[float]] = {}
        self._order: npt.NDArray[np.signedinteger[Any]] | None = None

    def rates(self, name: str, values: FloatArray, prompt: FloatArray | None) -> None:
        """Per group, Σ values / Σ prompt (NaN prompts as 0) over the rows whose
        value is known (not NaN): :func:`metrics.hit_rate`; with no ``prompt``, the
        mean of the known values. NaN where nothing is known. Token counts are
        whole numbers, so these sums are exact in any order."""
        self.ratios(name, *_sums(self.g, self.n, values, prompt))

    def ratios(self, name: str, num: FloatArray, den: npt.NDArray[Any]) -> None:
        """Per group, ``num`` / ``den`` (NaN where ``den`` is 0)."""
        self.figures[name] = [
            float(x / d) if d > 0 else math.nan for x, d in zip(num, den, strict=True)
        ]

    def latencies(self, name: str, values: FloatArray) -> None:
        """Per group, the p50 and p90 of ``values``. The rows grouped by one stable
        sort (small keys: a radix sort), kept for the next column; each group's
        percentiles are then taken on a slice."""
        if self._order is None:
            order = np.argsort(self.g, kind="stable")
            # Kept for the next column: in 4 bytes a row, not 8, when that holds it.
            self._order = order.astype(np.int32) if order.size < 2**31 else order
        ordered = values[self._order]
        cuts = np.concatenate([[0], np.cumsum(self.count)]).tolist()
        self.figures_of(name, [ordered[cuts[k] : cuts[k + 1]] for k in range(self.n)])

    def figures_of(self, name: str, groups: Iterable[FloatArray]) -> None:
        """The p50 and p90 of each group's values (taken one group at a time)."""
        p50s, p90s = [], []
        for values in groups:
            p50, p90 = m.percentiles(values, [50, 90])
            p50s.append(p50)
            p90s.append(p90)
        self.figures[name + "_p50"], self.figures[name + "_p90"] = p50s, p90s

    def rows(self) -> tuple[PositionRow, ...]:
        """The table rows of the groups that have rows."""
        f = self.figures
        lru = f.get("lru")
        return tuple(
            PositionRow(
                group=self.labels[k],
                requests=int(self.count[k]),
                ttft_ms_p50=f["ttft_p50"][k],
                ttft_ms_p90=f["ttft_p90"][k],
                e2e_ms_p50=f["e2e_p50"][k],
                e2e_ms_p90=f["e2e_p90"][k],
                prompt_tokens_mean=f["prompt"][k],
                hit_rate_server=f["server"][k],
                hit_rate_ideal=f["ideal"][k],
                hit_rate_lru=None if lru is None else lru[k],
            )
            for k in np.flatnonzero(self.count).tolist()
        )


def _sums(
    g: npt.NDArray[np.integer[Any]],
    n: int,
    values: FloatArray,
    prompt: FloatArray | None,
) -> tuple[FloatArray, npt.NDArray[Any]]:
    """Per group of ``g`` (0 to n - 1), Σ values and Σ prompt (NaN prompts as 0;
    with no ``prompt``, the count) over the rows whose value is not NaN."""
    nan = np.isnan(values)
    known = ~nan if nan.any() else None
    gk, v = (g, values) if known is None else (g[known], values[known])
    if prompt is None:
        den = np.bincount(gk, minlength=n)
    else:
        p = prompt if known is None else prompt[known]
        p_nan = np.isnan(p)
        den = np.bincount(
            gk, weights=np.where(p_nan, 0.0, p) if p_nan.any() else p, minlength=n
        )
    num = cast("FloatArray", np.bincount(gk, weights=v, minlength=n))
    return num, den


class _Cells:
    """The kept rows of two tables, grouped by (turn, depth) cell: one pass of
    sums per column serves both, each table's sums being its cells' summed
    (whole token counts: exact in any order)."""

    # More cells than this (a foreign writer's many depths): each table on its own.
    MOST = 2**16  # keys in 2 bytes: radix-sorted

    def __init__(self, turn: _Table, depth: _Table) -> None:
        self.tables = (turn, depth)
        self.shape = (turn.n, depth.n)
        # In 2 bytes (MOST cells), a quarter of the memory; bincount widens it.
        self.key = turn.g.astype(np.uint16)
        self.key *= depth.n
        self.key += depth.g.astype(np.uint16)
        for t in self.tables:  # their groups are the key's now
            t.g = np.empty(0, dtype=t.g.dtype)
        self._order: npt.NDArray[np.signedinteger[Any]] | None = None
        self._cuts: list[int] = []

    def rates(self, name: str, values: FloatArray, prompt: FloatArray | None) -> None:
        """Each table's :meth:`_Table.rates`."""
        num, den = _sums(self.key, self.shape[0] * self.shape[1], values, prompt)
        num2, den2 = num.reshape(self.shape), den.reshape(self.shape)
        for axis, t in ((1, self.tables[0]), (0, self.tables[1])):
            t.ratios(name, num2.sum(axis=axis), den2.sum(axis=axis))

    def latencies(self, name: str, values: FloatArray) -> None:
        """Each table's :meth:`_Table.latencies` from one stable sort of the rows
        by cell (turn-major, kept for the next column): a turn's rows are one
        slice, a depth's its cells' slices joined."""
        if self._order is None:
            cells = np.bincount(self.key, minlength=self.shape[0] * self.shape[1])
            self._cuts = np.concatenate([[0], np.cumsum(cells)]).tolist()
            order = np.argsort(self.key, kind="stable")  # 2-byte keys: radix
            self._order = order.astype(np.int32) if order.size < 2**31 else order
            del order
        ordered = values[self._order]
        cuts, (nt, nd) = self._cuts, self.shape
        turn, depth = self.tables
        turn.figures_of(
            name, [ordered[cuts[i * nd] : cuts[(i + 1) * nd]] for i in range(nt)]
        )
        depth.figures_of(
            name,
            (
                np.concatenate(
                    [
                        ordered[cuts[i * nd + j] : cuts[i * nd + j + 1]]
                        for i in range(nt)
                    ]
                )
                for j in range(nd)
            ),
        )


def _small_ints(
    df: pd.DataFrame, name: str, keep: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.integer[Any]], int, int] | None:
    """The kept rows of an integer column of at most 2 bytes (no nulls), with the
    column's least and greatest value (over all rows); None for any other."""
    raw = m.plain_column(df, name)
    if raw is None or raw.dtype.kind not in "iu" or raw.dtype.itemsize > 2:
        return None
    kept = cast("npt.NDArray[np.integer[Any]]", raw[keep])
    return kept, int(raw.min(initial=0)), int(raw.max(initial=0))


def _turn_groups(
    df: pd.DataFrame, keep: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], dict[int, str]]:
    """Each kept row's turn bucket, and the labels of the buckets up to the run's
    last. A small integer column: the buckets of its values' range looked up."""
    small = _small_ints(df, "request_index", keep)
    if small is None:
        all_groups = turn_bucket(m.column(df, "request_index"))
        groups, last = all_groups[keep], int(all_groups.max(initial=0))
    else:
        kept, lo, hi = small
        table = turn_bucket(np.arange(lo, hi + 1, dtype=np.float64))
        groups = table[kept.astype(np.intp) - lo]
        last = int(table.max(initial=0))
    return groups, {k: _bucket_label(k) for k in range(last + 1)}


# Depths up to this are their own group number; any other (a negative or huge
# agent_depth from a foreign writer) is numbered by its rank among the depths.
_DENSE_DEPTHS = 2**15


def _depth_groups(
    df: pd.DataFrame, keep: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], dict[int, str]]:
    small = _small_ints(df, "agent_depth", keep)
    if small is not None and small[1] >= 0 and small[2] < _DENSE_DEPTHS:
        kept, _, hi = small
        return kept.astype(np.int64), {k: str(k) for k in range(hi + 1)}
    depth = np.nan_to_num(m.column(df, "agent_depth"), nan=0.0).astype(np.int64)
    if depth.min(initial=0) >= 0 and depth.max(initial=0) < _DENSE_DEPTHS:
        return depth[keep], {k: str(k) for k in range(int(depth.max(initial=0)) + 1)}
    values, groups = np.unique(depth, return_inverse=True)
    labels = {k: str(v) for k, v in enumerate(values.tolist())}
    return groups.astype(np.int64)[keep], labels


def by_turn(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[PositionRow, ...]:
    """Per turn bucket (see :func:`turn_bucket`): requests, TTFT and E2E p50/p90,
    mean prompt, and the prefix hit rates side by side (server: Σ cached / Σ server
    prompt over rows reporting cached_tokens; ideal: Σ ideal / Σ prompt; LRU with
    an estimate). Population: ok, measured rows. Hit rates by
    :func:`metrics.hit_rate` (NaN, never 0, when unknown).

    Figures by position in the session: by turn (the request's index within its session,
    in power-of-two buckets) and by subagent depth, as SGLang's HiCache plots show them.
    Long agent sessions hit the prefix cache more turn after turn, until eviction
    catches up; subagents start with a cold, shorter context.
    """
    return by_turn_and_depth(df, lru)[0]


def by_depth(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[PositionRow, ...]:
    """The same figures per subagent depth (0 = root sessions, 1 = their
    subagents, …). Population: ok, measured rows."""
    return by_turn_and_depth(df, lru)[1]


def by_turn_and_depth(
    df: pd.DataFrame, lru: npt.NDArray[np.float64] | None = None
) -> tuple[tuple[PositionRow, ...], tuple[PositionRow, ...]]:
    """(:func:`by_turn`, :func:`by_depth`): each kept column taken once, for both
    tables, and let go before the next."""
    keep = m.measured_ok(df)
    # One table at a time: each keeps its groups in 2 bytes a row, not 8.
    tables = [_Table(*groups(df, keep)) for groups in (_turn_groups, _depth_groups)]
    if not keep.any():
        return (), ()
    prompt = m.kept_column(df, "prompt_tokens", keep)
    kept: list[tuple[str, FloatArray, FloatArray | None]] = [("prompt", prompt, None)]
    for name, values in (("ideal", m.kept_column(df, "ideal_cached_tokens", keep)),
                         ("lru", None if lru is None else lru[keep])):  # fmt: skip
        if values is not None:
            kept.append((name, values, prompt))
    # Both tables' sums from one pass over a (turn, depth) cell key, if few cells.
    pair = _Cells(*tables) if tables[0].n * tables[1].n <= _Cells.MOST else None
    sinks: list[_Table] | list[_Cells] = list(tables) if pair is None else [pair]
    for name, values, den in kept:
        for t in sinks:
            t.rates(name, values, den)
    kept.clear()
    # The server's prompt where it reported one, else ours (metrics.server_prompt).
    server = m.kept_column(df, "server_prompt_tokens", keep)
    np.copyto(server, prompt, where=np.isnan(server))  # in place: a fresh column
    del prompt
    cached = m.kept_column(df, "cached_tokens", keep)
    for t in sinks:
        t.rates("server", cached, server)
    del cached, server
    for name in ("ttft", "e2e"):
        values = m.kept_column(df, f"{name}_ns", keep, _NS_PER_MS)
        for t in sinks:
            t.latencies(name, values)
    return tables[0].rows(), tables[1].rows()
