"""The `analyze`, `compare` and `report` commands. Module level imports click only:
pandas, matplotlib and ``analysis`` load inside the commands. See docs/metrics.md."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import CommandError, errors_as_messages
from replayer.cli.params import (
    BLOCK_TOKENS,
    DIRECTORY,
    SEED,
    TOKENS,
    count,
    parse_slo_option,
)

if TYPE_CHECKING:
    from analysis.load import Run
    from analysis.slo import Slo
    from analysis.summary import Summary
    from replayer.records.capacity import CapacityDoc

_RUN_DIR = DIRECTORY


def _summaries(
    runs: list[Run],
    *,
    gpus: int | None,
    slo: Slo | None,
    kv_capacity_tokens: int | None,
    host_capacity_tokens: int | None,
    trace: Path | None,
    server_block_tokens: int | None,
) -> list[Summary]:
    from analysis.load import load_trace_for
    from analysis.summary import summarize

    out = []
    for run in runs:
        tr = load_trace_for(run, trace) if kv_capacity_tokens is not None else None
        s = summarize(
            run,
            gpus=gpus,
            slo=slo,
            kv_capacity_tokens=kv_capacity_tokens,
            host_capacity_tokens=host_capacity_tokens,
            trace=tr,
            server_block_tokens=server_block_tokens,
        )
        out.append(s)
    return out


def _run_dirs(
    paths: tuple[Path, ...],
) -> tuple[list[Path], list[tuple[Path, list[Path]]]]:
    """All run directories among ``paths`` (sweeps' levels in their place), and the
    sweeps with their levels."""
    from analysis.load import is_sweep, sweep_levels

    runs: list[Path] = []
    sweeps: list[tuple[Path, list[Path]]] = []
    for p in paths:
        if is_sweep(p):
            levels = sweep_levels(p)
            sweeps.append((p, levels))
            runs.extend(levels)
        else:
            runs.append(p)
    return runs, sweeps


def _summarized(run_dirs: list[Path], **options: Any) -> list[Summary]:
    """The summary of each run directory, loaded one after the other (only the
    columns a summary reads, compact): memory holds one run at a time, however
    many runs a sweep has."""
    from analysis.load import load_run
    from analysis.summary import COLUMNS

    out = []
    for path in run_dirs:
        run = load_run(path, columns=COLUMNS, compact=True)
        out.extend(_summaries([run], **options))
        del run
    return out


def _load(paths: tuple[Path, ...]) -> tuple[list[Run], list[tuple[Path, list[Run]]]]:
    """All runs, and the sweeps among ``paths`` with their runs."""
    from analysis.load import is_sweep, load_run, load_sweep

    runs: list[Run] = []
    sweeps: list[tuple[Path, list[Run]]] = []
    for p in paths:
        if is_sweep(p):
            level_runs = list(load_sweep(p).runs)
            sweeps.append((p, level_runs))
            runs.extend(level_runs)
        else:
            runs.append(load_run(p))
    return runs, sweeps


_ANALYSIS_OPTIONS = (
    click.option(
        "--gpus",
        type=count(1),
        help="GPUs behind the endpoint, for per-GPU throughput [run.json labels.gpus].",
    ),
    click.option(
        "--slo",
        callback=parse_slo_option,
        help="Objectives for goodput, e.g. ttft=2s,tpot=50ms,e2e=60s.",
    ),
    click.option(
        "--kv-capacity-tokens",
        type=TOKENS,
        help="GPU KV-cache size for the LRU hit-rate estimate (needs the trace).",
    ),
    click.option(
        "--host-capacity-tokens",
        type=TOKENS,
        help="Host-tier KV size for the LRU estimate (with --kv-capacity-tokens).",
    ),
    click.option(
        "--trace",
        type=click.Path(exists=True, path_type=Path),
        help="The replayed trace, if run.json's trace.path moved.",
    ),
    click.option(
        "--server-block-tokens",
        type=BLOCK_TOKENS,
        help="The server's KV block size, for the ideal-hit check "
        "[its vllm:cache_config_info, else the replay's block size].",
    ),
)


def _with_analysis_options(fn: Any) -> Any:
    for option in reversed(_ANALYSIS_OPTIONS):
        fn = option(fn)
    return fn


@click.command("analyze")
@click.argument("run_dirs", nargs=-1, required=True, type=_RUN_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("text", "json", "llmd-br")),
    help="text (the default), json (= --json), or llmd-br: llm-d's Benchmark "
    "Report v0.2 (JSON; one object, or a list with several runs).",
)
@_with_analysis_options
def analyze(
    run_dirs: tuple[Path, ...], as_json: bool, fmt: str | None, **options: Any
) -> None:
    """Summaries of RUN_DIRS (run directories or sweep folders).

    With one run, --json prints its summary object; with several (or a sweep) it
    prints {"runs": [summary, ...]} plus "sweeps": [{"path", "levels": [...]}] with
    each level's Pareto flag. --format llmd-br prints each run as llm-d's Benchmark
    Report v0.2, with the same figures.
    """
    from analysis.heap import hold_freed_memory

    # A one-shot process: freed arrays' pages reused. Before pandas and Arrow are
    # imported (Arrow starts a thread, which would fix glibc's arenas first).
    hold_freed_memory()
    from analysis.load import load_capacity
    from analysis.sweep import sweep_table
    from analysis.text import (
        format_positions,
        format_summaries,
        format_sweep,
        format_tiers,
    )
    from replayer.cli.output import echo_json

    with errors_as_messages():
        paths, sweeps = _run_dirs(run_dirs)
        summaries = _summarized(paths, **options)
        # A capacity folder is a sweep with the search's result beside it.
        capacities = [load_capacity(p) for p, _ in sweeps]
    by_path = {s.run.path: s for s in summaries}
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} contradict each other")
    if fmt == "llmd-br":
        from analysis.llmd import benchmark_report
        from analysis.load import load_run

        # One run in memory at a time, as the summaries were made.
        reports = [
            benchmark_report(load_run(p), s)
            for p, s in zip(paths, summaries, strict=True)
        ]
        echo_json(reports[0] if len(reports) == 1 else reports)
        return
    tables = [
        (p, sweep_table([by_path[str(level)] for level in levels]))
        for p, levels in sweeps
    ]
    if as_json or fmt == "json":
        if len(summaries) == 1 and not sweeps:
            echo_json(summaries[0].as_dict())
            return
        echo_json(
            {
                "runs": [s.as_dict() for s in summaries],
                "sweeps": [
                    {
                        "path": str(p),
                        "levels": t.to_dict(orient="records"),
                        **(_capacity_json(c) if c and c.result else {}),
                    }
                    for (p, t), c in zip(tables, capacities, strict=True)
                ],
            }
        )
        return
    click.echo(format_summaries(summaries))
    if len(summaries) == 1 and not sweeps:
        click.echo("\n" + format_positions(summaries[0]))
        if summaries[0].cache_tiers is not None:
            click.echo("\n" + format_tiers(summaries[0]))
    for (p, table), cap in zip(tables, capacities, strict=True):
        click.echo(f"\nsweep {p} (* = on the Pareto front)")
        click.echo(format_sweep(table))
        if cap:
            from replayer.cli.capacity import format_capacity, format_confirm

            click.echo(f"\ncapacity search {p}")
            click.echo(format_capacity(cap))
            if cap.confirm is not None:
                click.echo(format_confirm(cap.confirm, cap.search.percentile))


def _capacity_json(doc: CapacityDoc) -> dict[str, Any]:
    """A capacity folder's keys in analyze --json: ``capacity``, the result as
    capacity.json has it (``source``: live or virtual); ``capacity_headline``, what
    a virtual answer is (None: a live one); ``confirm``, the live check of a
    virtual answer, when one ran."""
    from analysis.text import capacity_headline

    assert doc.result is not None
    out: dict[str, Any] = {
        "capacity": doc.result.as_dict(),
        "capacity_headline": capacity_headline(doc),
    }
    if doc.confirm is not None:
        out["confirm"] = doc.confirm.as_dict()
    return out


@click.command("compare")
@click.argument("run_a", type=_RUN_DIR)
@click.argument("run_b", type=_RUN_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--resamples", type=count(100, 100_000), default=1000, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--mixed-profiles",
    is_flag=True,
    help="Compare an AgentX-profile run with a run without the profile anyway.",
)
def compare(
    run_a: Path,
    run_b: Path,
    as_json: bool,
    resamples: int,
    seed: int,
    mixed_profiles: bool,
) -> None:
    """B against A: deltas of headline figures with 95% bootstrap CIs and a verdict
    (better / worse / no clear difference) for B."""
    from analysis.compare import comparability_warnings, compare_runs
    from analysis.load import load_run
    from analysis.text import format_comparison
    from replayer.cli.output import echo_json

    with errors_as_messages():
        a, b = load_run(run_a), load_run(run_b)
        profiles = [r.meta.protocol and r.meta.protocol.profile for r in (a, b)]
        if profiles[0] != profiles[1]:
            click.echo(
                f"warning: A ({run_a}) ran with profile {profiles[0] or 'none'}, B "
                f"({run_b}) with {profiles[1] or 'none'}: their figures come from "
                "different protocols and look alike without being comparable",
                err=True,
            )
            if not mixed_profiles:
                raise CommandError(
                    "refusing to compare runs of different profiles; pass "
                    "--mixed-profiles to compare them anyway"
                )
        rows = compare_runs(a.requests, b.requests, resamples=resamples, seed=seed)
    warnings = comparability_warnings(a.meta, b.meta)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        echo_json(
            {
                "a": str(run_a),
                "b": str(run_b),
                "resamples": resamples,
                "seed": seed,
                "confidence": 0.95,
                "figures": rows,
                "warnings": warnings,
            }
        )
        return
    click.echo(f"A = {run_a}\nB = {run_b}")
    click.echo(format_comparison(rows))


@click.command("report")
@click.argument("run_dirs", nargs=-1, type=_RUN_DIR)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The HTML file to write.",
)
@click.option(
    "--history",
    "history_db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A results store (`replayer history`): add its trends over run date.",
)
@_with_analysis_options
def report(
    run_dirs: tuple[Path, ...], out: Path, history_db: Path | None, **options: Any
) -> None:
    """One self-contained HTML report (tables and plots) of RUN_DIRS, and with
    --history the trend charts of a results store."""
    from analysis.load import load_capacity
    from analysis.report import render_html
    from analysis.sweep import sweep_table

    if not run_dirs and history_db is None:
        raise click.UsageError("give RUN_DIRS, --history DB, or both")
    with errors_as_messages():
        history = _history_trends(history_db) if history_db is not None else None
        runs, sweeps = _load(run_dirs)
        summaries = _summaries(runs, **options)
        by_path = {s.run.path: s for s in summaries}
        sweep = (
            sweep_table([by_path[str(r.path)] for r in sweeps[0][1]])
            if sweeps
            else None
        )
        capacity = load_capacity(sweeps[0][0]) if sweeps else None
        page = render_html(
            runs, summaries, sweep=sweep, capacity=capacity, history=history
        )
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"{out}: cannot write: {exc}") from exc
    stored = f", {history_db}'s trends" if history_db is not None else ""
    click.echo(f"wrote {out} ({len(runs)} run(s){stored})")


def _history_trends(db: Path) -> list[dict[str, Any]]:
    """The report's trends of the store at ``db`` (every run; lines of runs that do
    not compare are drawn and the section says so)."""
    from analysis.history import Store, trend
    from analysis.report import HISTORY_CHARTS

    with Store(db, read_only=True) as store:
        runs = store.runs()
    return [
        trend(runs, metric, by="engine_version", mixed=True)
        for metric, _ in HISTORY_CHARTS
    ]
