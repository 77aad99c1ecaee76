"""The `history` commands: record runs in the results store and ask it for trends,
regressions and the cache-hit canary. Module level imports click only. See
docs/history.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import errors_as_messages
from replayer.cli.params import (
    DIRECTORY,
    MAX_RATE,
    SEED,
    TOKENS,
    Quantity,
    count,
)

if TYPE_CHECKING:
    from analysis.history import Filters

_DB = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default="results.duckdb",
    show_default=True,
    help="The results store (a DuckDB file).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def _date(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    if value is None:
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"expected a date (YYYY-MM-DD or ISO 8601), got {value!r}",
            param=param,
        ) from None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


_FILTERS = (
    click.option(
        "--label",
        "labels",
        multiple=True,
        metavar="KEY=VALUE",
        help="Only runs with this label (repeatable; engine, hardware, tp ...).",
    ),
    click.option("--engine", help="Only runs of this engine label."),
    click.option("--engine-version", help="Only runs of this engine version."),
    click.option(
        "--trace", help="Only runs of the trace with this content hash prefix."
    ),
    click.option("--config", help="Only the configuration with this key prefix."),
    click.option("--run-id", help="Only the run with this id."),
    click.option("--since", callback=_date, help="Only runs started on or after."),
    click.option("--until", callback=_date, help="Only runs started on or before."),
)


def _with_filters(fn: Any) -> Any:
    for option in reversed(_FILTERS):
        fn = option(fn)
    return fn


def _filters(opts: dict[str, Any]) -> Filters:
    from analysis.history import Filters

    labels: dict[str, str] = {}
    for item in opts.pop("labels"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE, got {item!r}", param_hint="--label"
            )
        labels[key] = value
    for name in ("engine", "engine_version"):
        value = opts.pop(name)
        if value is not None:
            labels[name] = value
    return Filters(labels=labels, **opts)


@click.group("history")
def history() -> None:
    """Results over engine versions and dates: a DuckDB store of runs' identities
    and headline figures (the rows stay in the runs' Parquet)."""


@history.command("add")
@click.argument("paths", nargs=-1, required=True, type=DIRECTORY)
@_DB
@click.option(
    "--trace",
    type=click.Path(exists=True, path_type=Path),
    help="The replayed trace, for the LRU estimate [run.json trace.path].",
)
@click.option(
    "--kv-capacity-tokens",
    type=TOKENS,
    help="The server's GPU KV tokens, for the canary's LRU estimate [the "
    "simulator's settings, else vllm:cache_config_info].",
)
@click.option(
    "--host-capacity-tokens",
    type=TOKENS,
    help="The server's host-tier KV tokens (with --kv-capacity-tokens).",
)
@_JSON
def add(
    paths: tuple[Path, ...],
    db: Path,
    trace: Path | None,
    kv_capacity_tokens: int | None,
    host_capacity_tokens: int | None,
    as_json: bool,
) -> None:
    """Record PATHS (run directories, sweep or capacity folders) in the store.

    A run already stored is left as it is (found by its run id); a run whose
    directory moved gets its new path.
    """
    from analysis.history import Added, Store
    from replayer.cli.output import echo_json

    def said(done: Added) -> None:
        if not as_json:
            why = f"  (no LRU estimate: {done.no_lru})" if done.no_lru else ""
            click.echo(f"{done.status:8} {done.run_id}  {done.path}{why}")

    with errors_as_messages(), Store(db) as store:
        done = store.add(
            list(paths),
            trace=trace,
            kv_capacity_tokens=kv_capacity_tokens,
            host_capacity_tokens=host_capacity_tokens,
            on_added=said,
        )
    if as_json:
        echo_json(
            {
                "db": str(db),
                "runs": [
                    {
                        "run_id": d.run_id,
                        "path": d.path,
                        "status": d.status,
                        "no_lru": d.no_lru,
                    }
                    for d in done
                ],
            }
        )


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _signed(value: float, digits: int) -> str:
    """A change with its sign ("-": unknown)."""
    return f"{value:+,.{digits}f}" if math.isfinite(value) else "-"


def _pct(rate: Any) -> str:
    """A hit rate in percent ("-": unknown)."""
    text = _fmt(None if rate is None else rate * 100)
    return text if text == "-" else text + "%"


def _grid(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    rows = [list(header), *[list(r) for r in body]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    )


def _json_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**r, "run_date": r["run_date"].isoformat(), "added_at": str(r["added_at"])}
        for r in runs
    ]


@history.command("show")
@_DB
@_with_filters
@_JSON
def show(db: Path, as_json: bool, **opts: Any) -> None:
    """A table of the stored runs, oldest first (filters narrow it)."""
    from analysis.history import Store
    from replayer.cli.output import echo_json

    filters = _filters(opts)
    with errors_as_messages(), Store(db, read_only=True) as store:
        runs = store.runs(filters)
    if as_json:
        echo_json({"db": str(db), "runs": _json_runs(runs)})
        return
    click.echo(
        _grid(
            [
                "run date",
                "run id",
                "engine",
                "version",
                "configuration",
                "trace",
                "TTFT p90 ms",
                "tok/s/GPU",
                "hit",
                "path",
            ],
            [
                [
                    r["run_date"].strftime("%Y-%m-%d %H:%M"),
                    r["run_id"],
                    _fmt(r["engine"]),
                    _fmt(r["engine_version"]),
                    f"{r['config_key'][:8]} {r['config_name']}",
                    str(r["trace_hash"] or "-")[:12],
                    _fmt(r["ttft_ms_p90"]),
                    _fmt(r["tok_s_gpu"]),
                    _pct(r["server_hit"]),
                    r["path"] + ("" if r["path_exists"] else " (gone)"),
                ]
                for r in runs
            ],
        )
    )
    click.echo(f"{len(runs)} run(s)")


@history.command("trend")
@click.argument("metric")
@_DB
@click.option(
    "--by",
    default="engine_version",
    show_default=True,
    help="What marks each point (an identity column or label).",
)
@click.option(
    "--mixed",
    is_flag=True,
    help="Draw runs of different traces, protocols or tool versions together.",
)
@_with_filters
@_JSON
def trend(
    metric: str, db: Path, by: str, mixed: bool, as_json: bool, **opts: Any
) -> None:
    """METRIC over run date, per configuration: ttft_p90, tok_s_gpu, interactivity,
    server_hit (or any stored figure, e.g. e2e_ms_p90).

    Points compare only on one trace (content hash), protocol and tool version:
    the command refuses to mix them unless --mixed is given.
    """
    from analysis import history as h
    from replayer.cli.output import echo_json

    filters = _filters(opts)
    with errors_as_messages(), h.Store(db, read_only=True) as store:
        found = h.trend(store.runs(filters), metric, by=by, mixed=mixed)
    if as_json:
        echo_json(found)
        return
    if found["comparable"] and found["sets"]:
        (s,) = found["sets"]
        click.echo(
            f"comparable: trace {str(s['trace_hash'])[:12]}, protocol "
            f"{s['protocol']}, tool {s['tool_version']}"
        )
    elif found["sets"]:
        click.echo(
            "MIXED (--mixed): these points come from different traces, protocols "
            "or tool versions and do not compare"
        )
    for series in found["configurations"]:
        click.echo(f"\n{series['config'][:8]} {series['name']}")
        click.echo(
            _grid(
                ["run date", by, metric, "run id"],
                [
                    [p["run_date"][:16], _fmt(p[by]), _fmt(p["value"], 3), p["run_id"]]
                    for p in series["points"]
                ],
            )
        )


@history.command("regressions")
@_DB
@click.option(
    "--baseline",
    help="Also compare each configuration's latest run with this run id, or with "
    "its latest run of this engine version.",
)
@click.option(
    "--fail-on",
    # nan compares false with every change: the gate would never fail.
    type=Quantity(min=0, max=MAX_RATE),
    metavar="PERCENT",
    help="Exit 1 when a flagged change makes a P90 worse by at least PERCENT.",
)
@click.option("--resamples", type=count(100, 100_000), default=1000, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--bootstrap-rows",
    type=count(100),
    default=20_000,
    show_default=True,
    help="Rows per resample above which the bootstrap is m-out-of-n (rescaled).",
)
@_with_filters
@_JSON
def regressions(
    db: Path,
    baseline: str | None,
    fail_on: float | None,
    resamples: int,
    seed: int,
    bootstrap_rows: int,
    as_json: bool,
    **opts: Any,
) -> None:
    """Each configuration's latest run against its predecessor (and --baseline):
    P90 TTFT, TPOT and E2E with 95% bootstrap CIs from the rows. A change whose CI
    excludes zero is flagged; exit 1 with --fail-on when one is past it."""
    from analysis import history as h
    from replayer.cli.output import echo_json

    filters = _filters(opts)
    with errors_as_messages(), h.Store(db, read_only=True) as store:
        found = h.regressions(
            store,
            store.runs(filters),
            baseline=baseline,
            resamples=resamples,
            seed=seed,
            bootstrap_rows=bootstrap_rows,
            fail_on=fail_on,
        )
    if as_json:
        echo_json(found)
    else:
        click.echo(
            _grid(
                [
                    "configuration",
                    "against",
                    "figure",
                    "A",
                    "B",
                    "delta (ms)",
                    "95% CI (ms)",
                    "delta (%)",
                    "95% CI (%)",
                    "verdict",
                ],
                [
                    [
                        f"{r['config'][:8]} {r['name']}",
                        f"{r['against']} {r['a_version'] or r['a_run']}",
                        r["figure"],
                        _fmt(r["a"], 2),
                        _fmt(r["b"], 2),
                        _signed(r["delta"], 2),
                        f"[{_signed(r['ci_low'], 2)}, {_signed(r['ci_high'], 2)}]",
                        _signed(r["delta_pct"], 1),
                        f"[{_signed(r['ci_low_pct'], 1)}, "
                        f"{_signed(r['ci_high_pct'], 1)}]",
                        r["verdict"].upper() if r["flagged"] else r["verdict"],
                    ]
                    for r in found["comparisons"]
                ],
            )
        )
        for r in found["failed"]:
            click.echo(
                f"FAIL: {r['name']}: {r['figure']} {r['delta_pct']:+.1f}% "
                f"({r['a_run']} -> {r['b_run']}) past --fail-on {fail_on:g}%",
                err=True,
            )
    if found["failed"]:
        raise SystemExit(1)


@history.command("canary")
@_DB
@click.option(
    "--points",
    type=Quantity(min=0, max=100),
    default=10.0,
    show_default=True,
    help="Flag a run whose server hit is this many points under its LRU estimate.",
)
@_with_filters
@_JSON
def canary(db: Path, points: float, as_json: bool, **opts: Any) -> None:
    """The cache-hit canary: each run's server prefix hit against the trace's
    ideal hit and LRU at the server's KV (no timing noise in it)."""
    from analysis import history as h
    from replayer.cli.output import echo_json

    filters = _filters(opts)
    with errors_as_messages(), h.Store(db, read_only=True) as store:
        rows = h.canary(store.runs(filters), points=points)
    if as_json:
        echo_json({"points": points, "runs": rows})
        return
    click.echo(
        _grid(
            [
                "run date",
                "run id",
                "version",
                "server",
                "LRU",
                "ideal",
                "under LRU",
                "flag",
            ],
            [
                [
                    r["run_date"][:16],
                    r["run_id"],
                    _fmt(r["engine_version"]),
                    _pct(r["server_hit"]),
                    _pct(r["lru_hit"]),
                    _pct(r["ideal_hit"]),
                    _fmt(r["under_lru_points"])
                    + (" pt" if r["under_lru_points"] is not None else ""),
                    "FLAGGED" if r["flagged"] else "",
                ]
                for r in rows
            ],
        )
    )
    unknown = sum(r["lru_hit"] is None or not math.isfinite(r["lru_hit"]) for r in rows)
    if unknown:
        click.echo(
            f"{unknown} run(s) without an LRU estimate (never flagged): add them with "
            "--kv-capacity-tokens and the trace (--trace)"
        )
