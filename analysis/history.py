"""The results store over time: each run's identity and headline figures in DuckDB (the
rows stay in the runs' Parquet), trends per configuration, regressions with bootstrap
CIs from the rows, and the cache-hit canary. See docs/history.md."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from analysis import metrics as m
from analysis.compare import bootstrap, verdict
from analysis.errors import HistoryError
from replayer.records import RunMeta
from replayer.records.parts import footer_reads, request_parts
from traces.stats import percentiles

if TYPE_CHECKING:
    import duckdb

FloatArray = npt.NDArray[np.float64]
SCHEMA_VERSION = 1
DEFAULT_DB = "results.duckdb"

# The labels of a run's identity (run.json ``labels``; the CLI's --engine, --tp ...).
IDENTITY_LABELS = (
    "engine", "engine_version", "hardware", "tp", "ep", "pp", "gpus", "precision",
    "kv_offload", "spec_decode", "router", "disagg",
)  # fmt: skip
# Points of a trend compare only when these are equal (trend refuses to mix them).
COMPARABLE = ("trace_hash", "protocol", "protocol_config", "tool_version")

# Headline figures stored per run: (column, what it is). Percentiles by the project's
# one definition (traces.stats.percentiles) over the rows DuckDB reads, so they
# equal ``analyze``'s figures of the same run.
FIGURES: tuple[tuple[str, str], ...] = (
    ("requests", "rows"),
    ("measured_ok", "ok, measured rows"),
    ("ttft_ms_p50", "P50 TTFT, ms"),
    ("ttft_ms_p90", "P90 TTFT, ms"),
    ("ttft_ms_p99", "P99 TTFT, ms"),
    ("tpot_ms_p50", "P50 TPOT, ms"),
    ("tpot_ms_p90", "P90 TPOT, ms"),
    ("e2e_ms_p50", "P50 E2E, ms"),
    ("e2e_ms_p90", "P90 E2E, ms"),
    ("interactivity_tok_s_p90", "P90 interactivity, tok/s/user"),
    ("e2e_norm_interactivity_tok_s", "E2E-normalized interactivity, tok/s/user"),
    ("throughput_output_tok_s", "output throughput, tok/s"),
    ("throughput_total_tok_s", "total throughput, tok/s"),
    ("tok_s_gpu", "output throughput per GPU, tok/s/GPU"),
    ("server_hit", "server prefix-cache hit rate"),
    ("ideal_hit", "the trace's ideal hit rate"),
    ("lru_hit", "LRU hit rate at the server's KV"),
    ("lru_capacity_tokens", "KV tokens of the LRU estimate"),
)
FIGURE_NAMES = tuple(name for name, _ in FIGURES)
# trend's METRIC names for the figures people ask for most.
TREND_METRICS = {
    "ttft_p90": "ttft_ms_p90",
    "tok_s_gpu": "tok_s_gpu",
    "interactivity": "interactivity_tok_s_p90",
    "server_hit": "server_hit",
}
# Regressions: the P90s bootstrapped from the rows (name, row values, higher is better).
REGRESSION_FIGURES = (("ttft_ms_p90", "ttft_ms"), ("tpot_ms_p90", "tpot_ms"),
                      ("e2e_ms_p90", "e2e_ms"))  # fmt: skip
CANARY_POINTS = 10.0  # server hit this many points under its LRU estimate: flagged

_TEXT_COLUMNS = (
    "run_id", "path", "model", *IDENTITY_LABELS, "labels", "trace_hash", "trace_path",
    "protocol", "protocol_config", "mode", "tool_version", "config_key", "config_name",
)  # fmt: skip
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS store_info (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (
    {", ".join(f"{c} VARCHAR" for c in _TEXT_COLUMNS)},
    run_date TIMESTAMP,
    added_at TIMESTAMP,
    {", ".join(f"{c} DOUBLE" for c in FIGURE_NAMES)},
    PRIMARY KEY (run_id)
);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Added:
    """What ``add`` did with one run directory."""

    run_id: str
    path: str
    status: str  # added | already | moved (the stored path was updated)
    # Why a newly added run has no LRU estimate (the canary skips it); None: it has
    # one, or the run was not newly added.
    no_lru: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Filters:
    """Which runs a query looks at (every field optional; all must match)."""

    labels: dict[str, str] = field(default_factory=dict)
    trace: str | None = None  # a prefix of the trace's content hash
    config: str | None = None  # a prefix of the configuration key
    run_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RowValues:
    """A run's per-request values as the figures' populations (ms, s/token)."""

    ttft_ms: FloatArray
    tpot_ms: FloatArray
    e2e_ms: FloatArray
    e2e_per_token_s: FloatArray


def _hash(obj: Any) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, default=str).encode()
    ).hexdigest()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


# -- identity -----------------------------------------------------------------------


def identity(meta: RunMeta, path: Path) -> dict[str, Any]:
    """The identity columns of a run (labels, trace, protocol and its config, tool
    version, run date) and its configuration: the identity less the engine version
    and the run date, the axes along which a configuration changes."""
    labels = meta.labels
    protocol = meta.protocol
    settings = None if protocol is None else replace(protocol, outcome=None).as_dict()
    protocol_config = {
        "api": meta.api,
        "warmup_s": meta.warmup_s,
        "duration_limit_s": meta.duration_limit_s,
        "settings": settings,
    }
    mode = asdict(meta.mode)
    start = meta.start_unix_ns or meta.end_unix_ns
    if start is None:
        run_date = datetime.fromtimestamp((path / "run.json").stat().st_mtime, UTC)
    else:
        run_date = datetime.fromtimestamp(start / 1e9, UTC)
    out: dict[str, Any] = {
        "run_id": meta.run_id,
        "path": str(path.resolve()),
        "model": meta.model,
        **{k: _text(labels.get(k)) for k in IDENTITY_LABELS},
        "labels": json.dumps(labels, sort_keys=True, default=str),
        "trace_hash": meta.trace.content_hash,
        "trace_path": meta.trace.path,
        "protocol": (protocol.profile if protocol else None) or "none",
        "protocol_config": json.dumps(protocol_config, sort_keys=True, default=str),
        "mode": json.dumps(mode, sort_keys=True),
        "tool_version": meta.tool_version,
        "run_date": run_date.replace(tzinfo=None),
    }
    server = {k: out[k] for k in IDENTITY_LABELS if k != "engine_version"}
    sim = meta.sim.args if meta.simulated and meta.sim is not None else None
    virtual = meta.virtual
    config = {
        **server,
        "model": meta.model,
        "simulated": meta.simulated,
        "sim": sim,
        # A replay in virtual time: its engine model (and the changes made to it).
        "virtual": None if virtual is None else [virtual.source, virtual.sim_args],
        "mode": mode,
        **{k: out[k] for k in COMPARABLE},
    }
    out["config_key"] = _hash(config)[:12]
    out["config_name"] = config_name(server, meta)
    return out


def config_name(server: dict[str, Any], meta: RunMeta) -> str:
    """A configuration as people say it: its server labels and the load."""
    parts = [f"{k}={v}" for k, v in server.items() if v is not None]
    mode = meta.mode
    load = {
        "concurrency": mode.concurrency and f"c={mode.concurrency}",
        "session_rate": mode.session_rate and f"rate={mode.session_rate:g}/s",
        "timestamps": mode.speedup and f"timestamps x{mode.speedup:g}",
    }.get(mode.kind, mode.kind)
    if meta.simulated:
        parts.insert(0, "sim")
    if meta.virtual is not None:
        parts.insert(0, f"virtual:{meta.virtual.source}")
    return " ".join([*parts, *([load] if load else [])]) or "(no labels)"


# -- rows (DuckDB over the run's Parquet) --------------------------------------------


def part_files(run_dir: Path) -> list[str]:
    """The run's readable request part files (DuckDB reads them in place); one a
    crash left without its footer is skipped, as ``analysis.load.load_run`` does."""
    return [str(part) for part in request_parts(run_dir) if footer_reads(part)]


_MEASURED = "status = 'ok' AND NOT coalesce(warmup, false)"


def _scan(con: duckdb.DuckDBPyConnection, run_dir: Path, sql: str) -> pa.Table:
    """``sql`` over the run's rows (``ROWS`` in it), as an Arrow table."""
    import duckdb

    files = part_files(run_dir)
    if not files:
        raise HistoryError(f"{run_dir}: no request rows (requests/part-*.parquet)")
    try:
        return con.sql(
            sql.replace("ROWS", "read_parquet($files, union_by_name = true)"),
            params={"files": files},
        ).to_arrow_table()
    except duckdb.Error as exc:
        raise HistoryError(
            f"{run_dir}: cannot read its rows: {_one_line(exc)}"
        ) from None


def row_values(con: duckdb.DuckDBPyConnection, run_dir: Path) -> RowValues:
    """The measured ok rows' TTFT, TPOT, E2E (ms) and E2E per output token (s), each
    NaN where its population (``analysis.metrics``) leaves the row out."""
    table = _scan(
        con,
        run_dir,
        f"""SELECT ttft_ns / 1e6 AS ttft_ms, tpot_ns / 1e6 AS tpot_ms,
            e2e_ns / 1e6 AS e2e_ms,
            CASE WHEN output_tokens >= 1 THEN e2e_ns / 1e9 / output_tokens END
              AS e2e_per_token_s
        FROM ROWS WHERE {_MEASURED}""",
    )

    def col(name: str) -> FloatArray:
        v = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        out: FloatArray = v[~np.isnan(v)]
        return out

    return RowValues(
        ttft_ms=col("ttft_ms"),
        tpot_ms=col("tpot_ms"),
        e2e_ms=col("e2e_ms"),
        e2e_per_token_s=col("e2e_per_token_s"),
    )


def _inverse(x: float, scale: float) -> float:
    return scale / x if x > 0 and math.isfinite(x) else math.nan


def run_figures(
    con: duckdb.DuckDBPyConnection, run_dir: Path, meta: RunMeta
) -> dict[str, float]:
    """The stored headline figures of a run, from its rows (``analyze``'s formulas;
    LRU figures NaN: see :func:`lru_estimate`)."""
    sums = _scan(
        con,
        run_dir,
        f"""SELECT count(*) AS requests,
          count(*) FILTER (WHERE {_MEASURED}) AS ok,
          min(start_ns) FILTER (WHERE {_MEASURED}) AS first,
          max(end_ns) FILTER (WHERE {_MEASURED}) AS last,
          sum(prompt_tokens) FILTER (WHERE {_MEASURED}) AS tin,
          sum(output_tokens) FILTER (WHERE {_MEASURED}) AS tout,
          sum(cached_tokens) FILTER (WHERE {_MEASURED}) AS cached,
          sum(coalesce(server_prompt_tokens, prompt_tokens))
            FILTER (WHERE {_MEASURED} AND cached_tokens IS NOT NULL) AS cached_prompt,
          sum(ideal_cached_tokens) FILTER (WHERE {_MEASURED}) AS ideal,
          sum(prompt_tokens)
            FILTER (WHERE {_MEASURED} AND ideal_cached_tokens IS NOT NULL)
            AS ideal_prompt
        FROM ROWS""",
    ).to_pylist()[0]
    requests, ok, first, last = (sums[k] for k in ("requests", "ok", "first", "last"))
    tin, tout = sums["tin"], sums["tout"]
    values = row_values(con, run_dir)
    ttft = percentiles(values.ttft_ms, [50, 90, 99])
    tpot = percentiles(values.tpot_ms, [50, 90])
    e2e = percentiles(values.e2e_ms, [50, 90])
    # m.measured_window_s: last end - first start, NaN when not positive.
    window = (
        float(last - first) / 1e9
        if first is not None and last is not None and last > first
        else math.nan
    )
    tin, tout = float(tin or 0), float(tout or 0)
    gpus = meta.labels.get("gpus")
    gpus = int(gpus) if isinstance(gpus, int | float) and gpus > 0 else None

    def rate(hits: Any, prompt: Any) -> float:  # m.hit_rate
        return float(hits) / float(prompt) if prompt else math.nan

    return {
        "requests": float(requests),
        "measured_ok": float(ok),
        "ttft_ms_p50": ttft[0],
        "ttft_ms_p90": ttft[1],
        "ttft_ms_p99": ttft[2],
        "tpot_ms_p50": tpot[0],
        "tpot_ms_p90": tpot[1],
        "e2e_ms_p50": e2e[0],
        "e2e_ms_p90": e2e[1],
        "interactivity_tok_s_p90": _inverse(tpot[1], 1000.0),
        "e2e_norm_interactivity_tok_s": _inverse(
            percentiles(values.e2e_per_token_s, [90])[0], 1.0
        ),
        "throughput_output_tok_s": tout / window,
        "throughput_total_tok_s": (tin + tout) / window,
        "tok_s_gpu": tout / window / gpus if gpus else math.nan,
        "server_hit": rate(sums["cached"], sums["cached_prompt"]),
        "ideal_hit": rate(sums["ideal"], sums["ideal_prompt"]),
        "lru_hit": math.nan,
        "lru_capacity_tokens": math.nan,
    }


def server_kv(meta: RunMeta, run_dir: Path) -> tuple[int, int | None] | None:
    """The server's KV capacity in tokens (GPU tier, host tier): the simulator's
    settings, the engine model's of a run in virtual time, else vLLM's
    ``cache_config_info`` (num_gpu_blocks x block_size) in the scraped metrics;
    None when none says."""
    if meta.simulated and meta.sim is not None:
        s = meta.sim.settings
        return s.kv_capacity_tokens, s.host_capacity_tokens or None
    if meta.virtual is not None:
        cache = meta.virtual.engine_model.cache
        return cache.kv_capacity_tokens, cache.host_capacity_tokens or None
    path = run_dir / "server_metrics.parquet"
    if not path.is_file():
        return None
    import pyarrow.parquet as pq

    try:
        sm = pq.read_table(path, columns=["metric", "labels"]).to_pandas()
    except (OSError, ValueError, KeyError):
        return None
    for raw in sm.loc[sm["metric"] == m.PROM_CACHE_CONFIG, "labels"].drop_duplicates():
        labels = json.loads(raw)
        blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
        if str(blocks).isdigit() and str(size).isdigit():
            return int(blocks) * int(size), None
    return None


def lru_estimate(
    run_dir: Path,
    meta: RunMeta,
    *,
    capacity: tuple[int, int | None],
    trace_path: Path,
    traces: dict[Path, Any],
) -> float:
    """The run's LRU hit rate at ``capacity`` (GPU, host tokens) over its trace
    (``analysis.cache.lru_cached_tokens``, as ``analyze --kv-capacity-tokens``)."""
    from analysis.cache import lru_cached_tokens
    from analysis.load import block_tokens_of, load_run
    from traces.errors import TraceError
    from traces.io import read_trace

    if trace_path not in traces:
        try:
            traces[trace_path] = read_trace(trace_path)
        except TraceError as exc:
            raise HistoryError(f"{run_dir}: cannot read its trace: {exc}") from None
    trace = traces[trace_path]
    run = load_run(
        run_dir,
        columns=["session_id", "request_index", "start_ns", "prompt_tokens",
                 "status", "warmup"],
    )  # fmt: skip
    df = m.numeric_view(run.requests)
    lru = lru_cached_tokens(
        df,
        trace,
        block_size=block_tokens_of(run, trace),
        capacity_tokens=capacity[0],
        host_capacity_tokens=capacity[1],
    )
    return m.lru_hit_rate(df, lru)


def _trace_for_lru(
    meta: RunMeta, given: Path | None, seen: dict[Path, Any]
) -> tuple[Path | None, str | None]:
    """The trace to estimate LRU hits over: ``given``, else run.json's ``trace.path``
    when that file still holds the trace replayed (same content hash). Returns it
    or None and why not."""
    if given is not None:
        return given, None
    if not meta.trace.path:
        return None, "run.json names no trace (--trace)"
    path = Path(meta.trace.path)
    if not path.exists():
        return None, f"its trace {path} is gone (--trace)"
    if meta.trace.content_hash:
        from replayer.records.rundir import trace_content_hash

        key = Path(f"{path}#hash")  # the hash of a path, once per add
        if key not in seen:
            seen[key] = trace_content_hash(path)
        if seen[key] != meta.trace.content_hash:
            return None, f"{path} no longer holds the trace replayed (--trace)"
    return path, None


# -- the store ----------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def run_dirs(path: Path) -> list[Path]:
    """The run directories of ``path``: itself, or a sweep folder's levels, or a
    capacity folder's cells (every cell ``capacity.json`` lists)."""
    for name, key in (("capacity.json", "cells"), ("sweep.json", "levels")):
        doc_path = path / name
        if not doc_path.is_file():
            continue
        try:
            doc = json.loads(doc_path.read_text())
            items = doc[key]
            names = [x["name"] if isinstance(x, dict) else x for x in items]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HistoryError(f"{doc_path}: cannot read its {key}: {exc}") from None
        return [path / str(n) for n in dict.fromkeys(names)]
    return [path]


def read_meta(run_dir: Path) -> RunMeta:
    """run.json of a run directory to be recorded.

    Raises:
        HistoryError: no directory, no run.json, not a JSON object, no run id.
    """
    path = run_dir / "run.json"
    if not run_dir.is_dir():
        raise HistoryError(f"{run_dir}: no such run directory")
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise HistoryError(f"{run_dir}: not a run directory (no run.json)") from None
    except (OSError, ValueError) as exc:
        raise HistoryError(f"{path}: cannot read: {_one_line(exc)}") from None
    if not isinstance(obj, dict):
        raise HistoryError(f"{path}: not a JSON object")
    meta = RunMeta.from_dict(obj)
    if not meta.run_id:
        raise HistoryError(f"{path}: no run_id; the store finds runs by their id")
    return meta


class Store:
    """The results store: one DuckDB file, one ``runs`` row per run (its identity
    and headline figures, the path of its directory). Use as a context manager."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        import duckdb

        self.path = Path(path)
        if read_only and not self.path.is_file():
            raise HistoryError(
                f"{self.path}: no results store here (create one with `replayer "
                "history add`)"
            )
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise HistoryError(_open_error(self.path, exc)) from None
        try:
            if not read_only:
                self.con.execute(_SCHEMA)
                self.con.execute(
                    "INSERT OR IGNORE INTO store_info VALUES ('schema_version', ?)",
                    [str(SCHEMA_VERSION)],
                )
            found = self.con.execute(
                "SELECT value FROM store_info WHERE key = 'schema_version'"
            ).fetchone()
        except duckdb.Error as exc:
            self.con.close()
            raise HistoryError(
                f"{self.path}: not a results store ({_one_line(exc)})"
            ) from None
        if found is None or found[0] != str(SCHEMA_VERSION):
            self.con.close()
            raise HistoryError(
                f"{self.path}: a results store of another version (schema "
                f"{found[0] if found else 'unknown'}, this one reads {SCHEMA_VERSION})"
            )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    # -- add ------------------------------------------------------------------------

    def add(
        self,
        paths: Sequence[Path],
        *,
        trace: Path | None = None,
        kv_capacity_tokens: int | None = None,
        host_capacity_tokens: int | None = None,
        on_added: Callable[[Added], None] | None = None,
    ) -> list[Added]:
        """Record the runs of ``paths`` (run directories, sweep or capacity folders).

        Every directory is checked (run.json, run id) before any is recorded; each
        run is then recorded in its own transaction, so an interrupted add keeps the
        runs before it. A run already stored under the same path is left as it is;
        one stored under another path (its directory moved) gets the new path.
        The LRU estimate (for the canary) needs the server's KV capacity
        (``kv_capacity_tokens``, else :func:`server_kv`) and the trace (``trace``,
        else run.json's ``trace.path`` when that file still exists).
        """
        todo = [(d, read_meta(d)) for p in paths for d in run_dirs(Path(p))]
        traces: dict[Path, Any] = {}
        out = []
        for run_dir, meta in todo:
            done = self._add_one(
                run_dir,
                meta,
                trace=trace,
                capacity=(kv_capacity_tokens, host_capacity_tokens)
                if kv_capacity_tokens is not None
                else None,
                traces=traces,
            )
            out.append(done)
            if on_added is not None:
                on_added(done)
        return out

    def _add_one(
        self,
        run_dir: Path,
        meta: RunMeta,
        *,
        trace: Path | None,
        capacity: tuple[int, int | None] | None,
        traces: dict[Path, Any],
    ) -> Added:
        ident = identity(meta, run_dir)
        found = self.con.execute(
            "SELECT path FROM runs WHERE run_id = ?", [meta.run_id]
        ).fetchone()
        if found is not None:
            if found[0] == ident["path"]:
                return Added(run_id=meta.run_id, path=ident["path"], status="already")
            with self._transaction():
                self.con.execute(
                    "UPDATE runs SET path = ? WHERE run_id = ?",
                    [ident["path"], meta.run_id],
                )
            return Added(run_id=meta.run_id, path=ident["path"], status="moved")
        figures = run_figures(self.con, run_dir, meta)
        capacity = capacity or server_kv(meta, run_dir)
        trace_path, no_lru = _trace_for_lru(meta, trace, traces)
        if capacity is None:
            no_lru = "the server's KV capacity is unknown (--kv-capacity-tokens)"
        elif trace_path is not None:
            figures["lru_hit"] = lru_estimate(
                run_dir, meta, capacity=capacity, trace_path=trace_path, traces=traces
            )
            figures["lru_capacity_tokens"] = float(capacity[0])
        row = {**ident, "added_at": datetime.now(UTC).replace(tzinfo=None), **figures}
        names = list(row)
        with self._transaction():
            self.con.execute(
                f"INSERT INTO runs ({', '.join(names)}) "
                f"VALUES ({', '.join('?' for _ in names)})",
                [None if isinstance(v, float) and math.isnan(v) else v
                 for v in row.values()],
            )  # fmt: skip
        return Added(
            run_id=meta.run_id, path=ident["path"], status="added", no_lru=no_lru
        )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One run's change, all of it or none (a killed add keeps earlier runs)."""
        import duckdb

        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
            self.con.execute("COMMIT")
        except duckdb.Error as exc:
            with suppress(duckdb.Error):  # a failed COMMIT has rolled back already
                self.con.execute("ROLLBACK")
            raise HistoryError(
                f"{self.path}: cannot record: {_one_line(exc)}; nothing of this run "
                "was stored, the runs before it were"
            ) from None
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    # -- queries --------------------------------------------------------------------

    def runs(self, filters: Filters = Filters()) -> list[dict[str, Any]]:
        """The stored runs that match ``filters``, oldest first (dicts of columns,
        NaN for an unknown figure, ``labels`` parsed, ``path_exists`` added)."""
        where: list[str] = []
        args: list[Any] = []
        if filters.run_id:
            where.append("run_id = ?")
            args.append(filters.run_id)
        if filters.trace:
            where.append("starts_with(trace_hash, ?)")
            args.append(filters.trace)
        if filters.config:
            where.append("starts_with(config_key, ?)")
            args.append(filters.config)
        if filters.since is not None:
            where.append("run_date >= ?")
            args.append(_utc(filters.since))
        if filters.until is not None:
            where.append("run_date <= ?")
            args.append(_utc(filters.until))
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        cursor = self.con.execute(sql + " ORDER BY run_date, run_id", args)
        names = [d[0] for d in cursor.description]
        out = []
        for values in cursor.fetchall():
            row = dict(zip(names, values, strict=True))
            row["labels"] = json.loads(row["labels"] or "{}")
            if any(_text(row["labels"].get(k)) != v for k, v in filters.labels.items()):
                continue
            for name in FIGURE_NAMES:
                row[name] = math.nan if row[name] is None else float(row[name])
            row["path_exists"] = Path(row["path"]).is_dir()
            out.append(row)
        return out


def _utc(when: datetime) -> datetime:
    """The naive UTC instant the store's run dates are in (naive: taken as UTC)."""
    return when.astimezone(UTC).replace(tzinfo=None) if when.tzinfo else when


def _open_error(path: Path, exc: BaseException) -> str:
    text = _one_line(exc)
    if "lock" in text.lower():
        return f"{path}: the results store is locked by another process ({text})"
    return f"{path}: cannot open the results store (corrupt or not DuckDB?): {text}"


# -- trend --------------------------------------------------------------------------


def metric_column(metric: str) -> str:
    """A trend METRIC (``ttft_p90`` ... or a stored figure's name) → its column."""
    column = TREND_METRICS.get(metric, metric)
    if column not in FIGURE_NAMES:
        known = ", ".join([*TREND_METRICS, *FIGURE_NAMES])
        raise HistoryError(f"unknown metric {metric!r}; one of: {known}")
    return column


def comparable_sets(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct (trace hash, protocol, its config, tool version) among ``runs``."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in runs:
        key = tuple(r[k] for k in COMPARABLE)
        seen.setdefault(key, dict(zip(COMPARABLE, key, strict=True)))
    return list(seen.values())


def trend(
    runs: Sequence[dict[str, Any]], metric: str, *, by: str, mixed: bool = False
) -> dict[str, Any]:
    """``metric`` over run date, one series per configuration, each point marked
    with its ``by`` (an identity column or label, e.g. the engine version).

    Raises:
        HistoryError: the runs span several traces, protocols or tool versions
            (points that do not compare) and ``mixed`` is False.
    """
    column = metric_column(metric)
    sets = comparable_sets(runs)
    if len(sets) > 1 and not mixed:
        differ = [k for k in COMPARABLE if len({str(x[k]) for x in sets}) > 1]
        raise HistoryError(
            f"the selected runs do not compare: {len(sets)} different "
            f"(trace hash, protocol, protocol config, tool version) sets, which differ "
            f"in {', '.join(differ)} ({_describe_sets(sets, differ)}); narrow them "
            "with --trace / --label, or pass --mixed to draw them anyway"
        )
    series: dict[str, dict[str, Any]] = {}
    for r in runs:
        s = series.setdefault(
            r["config_key"],
            {"config": r["config_key"], "name": r["config_name"], "points": []},
        )
        s["points"].append(
            {
                "run_id": r["run_id"],
                "run_date": r["run_date"].isoformat(),
                by: _text(r.get(by, r["labels"].get(by))),
                "value": r[column],
            }
        )
    return {
        "metric": metric,
        "column": column,
        "by": by,
        "comparable": len(sets) <= 1,
        "sets": sets,
        "configurations": list(series.values()),
    }


def _flat_config(text: Any) -> dict[str, str]:
    """A stored protocol config (JSON) as ``key=value`` pairs, nested keys dotted."""
    try:
        obj = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        obj = text
    if not isinstance(obj, dict):
        return {"": str(obj)}
    out: dict[str, str] = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in _flat_config(v).items()})
        else:
            out[k] = json.dumps(v, default=str)
    return out


def _describe_sets(sets: Sequence[dict[str, Any]], differ: Sequence[str]) -> str:
    """Each set (the first few) by the fields that differ among them; of the
    protocol config, only the keys that differ."""
    flat = [_flat_config(s["protocol_config"]) for s in sets]
    keys = sorted({k for f in flat for k in f})
    varying = [k for k in keys if len({f.get(k) for f in flat}) > 1]
    shown = {"trace_hash": "trace", "protocol": "protocol", "tool_version": "tool"}

    def one(s: dict[str, Any], f: dict[str, str]) -> str:
        parts = []
        for k in differ:
            if k == "protocol_config":
                parts += [f"{c or 'protocol_config'}={f.get(c, '-')}" for c in varying]
            elif k == "trace_hash":
                parts.append(f"trace {str(s[k])[:12]}")
            else:
                parts.append(f"{shown[k]} {s[k]}")
        return ", ".join(parts)

    return "; ".join(one(s, f) for s, f in zip(sets[:4], flat, strict=False)) + (
        f"; and {len(sets) - 4} more" if len(sets) > 4 else ""
    )


# -- regressions --------------------------------------------------------------------


@dataclass(slots=True)
class _Boot:
    """One run's bootstrap of each regression figure: its point value and the
    resampled deviations from it, scaled to the run's own row count."""

    point: dict[str, float]
    deviations: dict[str, FloatArray]


def _run_bootstrap(
    values: RowValues,
    *,
    seed: int,
    run_id: str,
    resamples: int,
    bootstrap_rows: int,
) -> _Boot:
    """Seeded per run (the same run resamples alike in every comparison). Above
    ``bootstrap_rows`` values, an m-out-of-n bootstrap: resample m = bootstrap_rows
    of them and scale the deviations by sqrt(m / n), the rate of a percentile's
    sampling error; at or below, the plain bootstrap of ``compare``."""
    key = int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng([seed, key])
    point, deviations = {}, {}
    for name, attr in REGRESSION_FIGURES:
        x: FloatArray = getattr(values, attr)
        p = percentiles(x, [90])[0]
        sample, scale = x, 1.0
        if x.size > bootstrap_rows:
            sample = rng.choice(x, size=bootstrap_rows, replace=False)
            scale = math.sqrt(bootstrap_rows / x.size)
        centre = percentiles(sample, [90])[0]
        boot = bootstrap(
            sample,
            lambda v: m.percentile_rows(v, 90),
            resamples=resamples,
            rng=rng,
        )
        point[name] = p
        deviations[name] = (boot - centre) * scale
    return _Boot(point=point, deviations=deviations)


def regressions(
    store: Store,
    runs: Sequence[dict[str, Any]],
    *,
    baseline: str | None = None,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    bootstrap_rows: int = 20_000,
    fail_on: float | None = None,
) -> dict[str, Any]:
    """For each configuration among ``runs``: its latest run against its
    predecessor and against ``baseline`` (a run id, or an engine version: that
    configuration's latest run of it), P90 TTFT, TPOT and E2E with the bootstrap CI
    of the change (``analysis.compare``'s bootstrap and verdict, over the rows DuckDB
    reads). A change is flagged when its CI excludes zero; ``failed`` lists the
    flagged worsenings of at least ``fail_on`` percent."""
    if fail_on is not None and not 0 <= fail_on < math.inf:
        # nan compares false with every change: the gate would silently never fail.
        raise HistoryError(f"fail_on must be a finite percent >= 0 (got {fail_on})")
    tail = (1 - confidence) / 2 * 100
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_config.setdefault(r["config_key"], []).append(r)
    boots: dict[str, _Boot] = {}

    def boot(run: dict[str, Any]) -> _Boot:
        if run["run_id"] not in boots:
            if not run["path_exists"]:
                raise HistoryError(
                    f"run {run['run_id']}: its directory {run['path']} is gone; "
                    "`replayer history add` it again from where it is now"
                )
            boots[run["run_id"]] = _run_bootstrap(
                row_values(store.con, Path(run["path"])),
                seed=seed,
                run_id=run["run_id"],
                resamples=resamples,
                bootstrap_rows=bootstrap_rows,
            )
        return boots[run["run_id"]]

    rows: list[dict[str, Any]] = []
    for key, group in by_config.items():
        latest = group[-1]
        pairs = []
        if len(group) > 1:
            pairs.append(("predecessor", group[-2]))
        base = _baseline(group, baseline)
        if base is not None and base is not latest:
            pairs.append(("baseline", base))
        for against, a in pairs:
            ba, bb = boot(a), boot(latest)
            for name, _ in REGRESSION_FIGURES:
                pa_, pb = ba.point[name], bb.point[name]
                deltas = (pb - pa_) + bb.deviations[name] - ba.deviations[name]
                deltas = deltas[np.isfinite(deltas)]
                low, high = m.percentiles(deltas, [tail, 100 - tail])
                delta = pb - pa_
                v = verdict(low, high, higher_is_better=False)
                rows.append(
                    {
                        "config": key,
                        "name": latest["config_name"],
                        "against": against,
                        "figure": name,
                        "a_run": a["run_id"],
                        "b_run": latest["run_id"],
                        "a_version": a["engine_version"],
                        "b_version": latest["engine_version"],
                        "a": pa_,
                        "b": pb,
                        "delta": delta,
                        "delta_pct": delta / pa_ * 100 if pa_ else math.nan,
                        "ci_low": low,
                        "ci_high": high,
                        # The CI in the delta's percent (of A), as `delta_pct`.
                        "ci_low_pct": low / pa_ * 100 if pa_ else math.nan,
                        "ci_high_pct": high / pa_ * 100 if pa_ else math.nan,
                        "verdict": v,
                        "flagged": v != "no clear difference",
                    }
                )
    failed = [
        r
        for r in rows
        if fail_on is not None
        and r["verdict"] == "worse"
        and abs(r["delta_pct"]) >= fail_on
    ]
    return {
        "resamples": resamples,
        "confidence": confidence,
        "seed": seed,
        "bootstrap_rows": bootstrap_rows,
        "fail_on": fail_on,
        "comparisons": rows,
        "failed": failed,
    }


def _baseline(
    group: Sequence[dict[str, Any]], baseline: str | None
) -> dict[str, Any] | None:
    if baseline is None:
        return None
    for r in group:
        if r["run_id"] == baseline:
            return r
    versions = [r for r in group if r["engine_version"] == baseline]
    return versions[-1] if versions else None


# -- the cache-hit canary -----------------------------------------------------------


def canary(
    runs: Sequence[dict[str, Any]], *, points: float = CANARY_POINTS
) -> list[dict[str, Any]]:
    """Per run: the server's prefix hit against the trace's ideal hit and against
    LRU at the server's KV; ``flagged`` when the server hit is ``points`` or more
    percentage points under the LRU estimate (an engine's prefix-cache regression,
    free of timing noise). Runs without an LRU estimate are listed, never flagged."""
    out = []
    for r in runs:
        server, ideal, lru = r["server_hit"], r["ideal_hit"], r["lru_hit"]
        gap = (lru - server) * 100 if np.isfinite(lru) and np.isfinite(server) else None
        out.append(
            {
                "run_id": r["run_id"],
                "run_date": r["run_date"].isoformat(),
                "config": r["config_key"],
                "engine_version": r["engine_version"],
                "server_hit": server,
                "ideal_hit": ideal,
                "lru_hit": lru,
                "lru_capacity_tokens": r["lru_capacity_tokens"],
                "under_lru_points": gap,
                "under_ideal_points": (ideal - server) * 100,
                "flagged": gap is not None and gap >= points,
            }
        )
    return out
