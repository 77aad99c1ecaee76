"""`replayer capacity`: the most concurrent session trees (or the highest session
rate) a server holds within an SLO (``replayer.studies.capacity``)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.config_file import config_option
from replayer.cli.errors import errors_as_messages, interrupted
from replayer.cli.options import replay_config, replay_options
from replayer.cli.params import (
    LANES,
    MAX_FACTOR,
    POSITIVE,
    POSITIVE_SECONDS,
    Quantity,
    count,
    parse_slo_option,
)

if TYPE_CHECKING:
    from replayer.records.capacity import CapacityCell, CapacityDoc, Confirmation


def _ms(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v / 1000:,.2f} s" if v >= 1000 else f"{v:,.1f} ms"


def _verdict(cell: CapacityCell) -> str:
    if cell.client_limited:
        return "CLIENT-LIMITED"
    return "pass" if cell.passed else "FAIL"


def _cell_line(cell: CapacityCell, percentile: float) -> str:
    verdict = _verdict(cell)
    if cell.borderline:
        verdict += " (borderline)"
    figures = ", ".join(
        f"{c.metric.removesuffix('_ms')} p{percentile:g} {_ms(c.value_ms)}"
        for c in cell.checks
    )
    err = cell.error_rate
    errors = f", errors {err:.1%}" if err else ""
    line = f"{cell.name}: {verdict}: {figures}{errors} ({cell.ok:,} ok)"
    if cell.client_limited:
        line += (
            "; not counted: the replayer, not the server, limited it ("
            + "; ".join(cell.client_reasons)
            + ")"
        )
    return line


def format_capacity(doc: CapacityDoc) -> str:
    """The cell table and the result, as `capacity` prints them."""
    from analysis.text import capacity_headline

    search, result = doc.search, doc.result
    assert result is not None
    pct = search.percentile
    slo = ", ".join(
        f"{k.removesuffix('_ms')} ≤ {_ms(v)}" for k, v in search.slo.items()
    )
    what = "session rate" if search.mode == "session_rate" else "concurrency"
    unit = " sessions/s" if search.mode == "session_rate" else ""
    first = doc.cells[0].checks if doc.cells else ()
    metrics = [f"{c.metric.removesuffix('_ms')} p{pct:g}" for c in first]
    header = ["cell", "level", "verdict", "window s", "ok", *metrics]
    rows = [
        [
            c.name,
            f"{c.level:g}",
            _verdict(c) + (" ~" if c.borderline else ""),
            "-" if not c.window else f"{c.window.length_s:,.1f}",
            f"{c.ok:,}",
            *(_ms(k.value_ms) for k in c.checks),
        ]
        for c in sorted(doc.cells, key=lambda c: (c.level, c.duration_s or 0.0))
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    if any(c.borderline for c in doc.cells):
        lines.append("~ borderline: the percentile's 95% CI contains the target")
    if any(c.client_limited for c in doc.cells):
        lines.append(
            "CLIENT-LIMITED: the self-check found the replayer, not the server, "
            "limiting the cell; it counts as neither a pass nor a failure"
        )
    best = result.max_level
    per_gpu = f" ({result.per_gpu:,.3g} per GPU)" if result.per_gpu is not None else ""
    virtual = (
        " [virtual: predicted, not measured]" if result.source == "virtual" else ""
    )
    headline = capacity_headline(doc)
    if headline is not None:
        lines.append(headline)
    lines.append(
        f"max {what} within the SLO (p{pct:g} {slo}): {best:g}{unit}{per_gpu}{virtual}"
    )
    span = result.answer_range
    if result.thin and span:
        lines.append(
            f"  thin evidence: the cells support anything from {span[0]:g} to "
            f"{span[1]:g}{unit}, not {best:g} exactly ("
            + "; ".join(result.thin_because)
            + ")"
        )
    if result.lower_bound_by_client and result.client_limit is not None:
        lines.append(
            f"  a lower bound set by the client: {result.client_limit.name} was "
            "CLIENT-LIMITED, so the server was not judged there; add --workers "
            "or --ray"
        )
    status = result.status
    if status == "ceiling":
        lines.append(f"  every level up to {best:g} passed (the highest asked for)")
    elif status == "budget":
        bound = result.next_level
        above = f"; {bound:g} failed" if bound is not None else "; no level failed yet"
        lines.append(
            f"  stopped early: {result.stopped_because} (best bound so far{above})"
        )
    elif status == "interrupted":
        lines.append("  interrupted: best bound so far")
    if result.failed_because:
        lines.append(
            f"  {result.next_level:g} fails: " + "; ".join(result.failed_because)
        )
    return "\n".join(lines)


@click.command()
@click.argument(
    "trace_path", metavar="TRACE", type=click.Path(exists=True, path_type=Path)
)
@config_option
@click.option(
    "--slo",
    "slo",
    required=True,
    callback=parse_slo_option,
    help="Objectives a cell must meet, e.g. ttft=2s,tpot=50ms,e2e=60s (TTFT and "
    "E2E are judged from the scheduled send time: client queueing counts).",
)
@click.option(
    "--percentile",
    type=Quantity(min=0, max=100, min_open=True, max_open=True),
    default=90.0,
    show_default=True,
    help="Percentile of each SLO metric over a cell's steady-state window.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Capacity folder (one run directory per cell, capacity.json, sweep.json).",
)
@click.option(
    "--start",
    type=LANES,
    default=1,
    show_default=True,
    help="First concurrency level (with --session-rate, that rate is the first).",
)
@click.option(
    "--growth",
    type=Quantity(min=1, min_open=True, max=MAX_FACTOR),
    default=2.0,
    show_default=True,
    help="Ramp factor between levels until one fails; then bisection.",
)
@click.option(
    "--max-level",
    type=POSITIVE,
    help="Highest level to try (concurrency or rate).",
)
@click.option(
    "--rate-resolution",
    type=POSITIVE,
    default=0.1,
    show_default=True,
    help="With --session-rate: bisect until the bounds are this close (relative).",
)
@click.option(
    "--max-cells",
    type=count(1),
    help="Budget: stop after this many cells with the best bound so far.",
)
@click.option(
    "--max-time",
    "max_time_s",
    type=POSITIVE_SECONDS,
    help="Budget, seconds: start no cell that would end after it.",
)
@click.option(
    "--reset-cache",
    is_flag=True,
    help="Ask the server to drop its prefix cache between cells (vLLM "
    "/reset_prefix_cache, SGLang /flush_cache); cells use fresh salts regardless.",
)
@click.option(
    "--no-widen",
    is_flag=True,
    help="Do not re-run a borderline cell (CI containing a target) for twice as long.",
)
@click.option(
    "--confirm",
    is_flag=True,
    help="With --virtual: replay the answer and the level above it live (against "
    "--endpoint, or the built-in simulator with --virtual sim) and print predicted "
    "beside measured.",
)
@click.option(
    "--host-tier",
    "host_tier",
    metavar="SIZE[,SIZE...]",
    help="With --virtual: search without a host tier and with each size (tokens; "
    "64K = 65,536) and compare the answers and each tier's hit.",
)
@click.option("--json", "as_json", is_flag=True, help="Print capacity.json's content.")
@replay_options()
def capacity(
    trace_path: Path,
    slo: Any,
    percentile: float,
    out: Path,
    start: int,
    growth: float,
    max_level: float | None,
    rate_resolution: float,
    max_cells: int | None,
    max_time_s: float | None,
    reset_cache: bool,
    no_widen: bool,
    confirm: bool,
    host_tier: str | None,
    as_json: bool,
    **opts: Any,
) -> None:
    """Search the most concurrent session trees (or, with --session-rate, the highest
    session rate) the server holds within --slo; one run directory per cell in OUT.

    Each cell replays for --duration (default 60 s), recycling the trace's trees;
    the default cell error limit is 10% (--max-error-rate).
    """
    from replayer.cli.output import echo_json
    from replayer.studies.capacity import (
        CapacitySearch,
        confirm_capacity,
        run_capacity,
    )

    if opts["timestamps"]:
        raise click.UsageError(
            "capacity varies concurrency or --session-rate, not --timestamps"
        )
    rate = opts["session_rate"] is not None
    live_endpoint = _confirm_endpoint(confirm, opts)
    with errors_as_messages():
        config, opts = replay_config(opts, concurrency=None)
        search = CapacitySearch(
            slo=slo,
            percentile=percentile,
            rate=rate,
            start=opts["session_rate"] if rate else float(start),
            growth=growth,
            max_level=max_level,
            rate_resolution=rate_resolution,
            max_cells=max_cells,
            max_time_s=max_time_s,
            max_error_rate=0.1
            if opts["max_error_rate"] is None
            else opts["max_error_rate"],
            reset_cache=reset_cache,
            widen_borderline=not no_widen,
            gpus=opts["gpus"],
        )

        def said(cell: CapacityCell) -> None:
            click.echo(_cell_line(cell, percentile), err=True)

        if host_tier is not None:
            _host_tiers(trace_path, config, search, out, host_tier, confirm, as_json,
                        None if opts["quiet"] else sys.stderr, said)  # fmt: skip
            return
        try:
            doc = run_capacity(
                trace_path,
                config,
                search,
                out,
                progress=None if opts["quiet"] else sys.stderr,
                on_cell=said,
            )
            if confirm:
                live = replace(
                    config,
                    virtual=None,
                    endpoint=replace(
                        config.endpoint, base_url=live_endpoint, model=opts["model"]
                    ),
                )
                doc = confirm_capacity(
                    trace_path,
                    live,
                    search,
                    out,
                    doc,
                    progress=None if opts["quiet"] else sys.stderr,
                )
        except KeyboardInterrupt:
            interrupted(out)
    if doc.reset_cache and doc.reset_cache.failed:
        click.echo(
            "warning: the server offers no prefix-cache reset (/reset_prefix_cache, "
            "/flush_cache); cells relied on fresh cache-bust salts",
            err=True,
        )
    if as_json:
        echo_json(doc.as_dict())
    else:
        click.echo(format_capacity(doc))
        if doc.confirm is not None:
            click.echo(format_confirm(doc.confirm, doc.search.percentile))


def _host_tiers(
    trace_path: Path,
    config: Any,
    search: Any,
    out: Path,
    sizes: str,
    confirm: bool,
    as_json: bool,
    progress: Any,
    said: Any,
) -> None:
    """`--host-tier`: the search without a host tier and with each size."""
    from replayer.cli.output import echo_json
    from replayer.errors import ConfigError
    from replayer.studies.hosttier import (
        format_host_tiers,
        parse_host_sizes,
        run_host_tiers,
    )

    parsed = parse_host_sizes(sizes)
    if confirm:
        raise ConfigError("--host-tier compares virtual answers: drop --confirm")
    try:
        answers, docs = run_host_tiers(
            trace_path, config, search, out, parsed, progress=progress, on_cell=said
        )
    except KeyboardInterrupt:
        interrupted(out)
    if as_json:
        echo_json(
            {
                "host_tiers": [
                    {**a.as_dict(), "capacity": d.as_dict()}
                    for a, d in zip(answers, docs, strict=True)
                ]
            }
        )
        return
    what = "session rate" if search.rate else "concurrency"
    click.echo(format_host_tiers(answers, what))


def _confirm_endpoint(confirm: bool, opts: dict[str, Any]) -> str | None:
    """--confirm's live server (None: the built-in simulator); the search itself
    then runs with no --endpoint."""
    endpoint: str | None = opts["endpoint"]
    if not confirm:
        return endpoint
    if not opts["virtual"]:
        raise click.UsageError(
            "--confirm checks a --virtual search live: add --virtual"
        )
    if endpoint is None and opts["virtual"] != "sim":
        raise click.UsageError(
            "--confirm needs --endpoint (the server the engine model describes); "
            "only --virtual sim confirms against the built-in simulator"
        )
    opts["endpoint"] = None
    return endpoint


def format_confirm(confirm: Confirmation, percentile: float) -> str:
    """The live confirmation: per level, the virtual cell beside the live one."""
    where = confirm.endpoint or "the built-in simulator"
    lines = [f"confirmed live against {where} ({confirm.cell_duration_s:g} s cells):"]
    for row in confirm.levels:
        lines.append(f"  level {row.level:g}:")
        for side, cell in (("predicted", row.predicted), ("measured", row.measured)):
            if cell is None:
                lines.append(f"    {side:<9}  (no virtual cell at this level)")
                continue
            checks = ", ".join(
                f"{c.metric.removesuffix('_ms')} p{percentile:g} {_ms(c.value_ms)}"
                for c in cell.checks
            )
            hit = "" if cell.hit is None else f", hit {cell.hit:.1%}"
            verdict = "pass" if cell.passed else "FAIL"
            lines.append(f"    {side:<9}  {verdict}: {checks}{hit}")
    differ = [
        f"{row.level:g}"
        for row in confirm.levels
        if row.predicted is None or row.predicted.passed != row.measured.passed
    ]
    lines.append(
        "  the live cells agree with the prediction"
        if confirm.agrees
        else f"  the live verdict differs from the prediction at level "
        f"{', '.join(differ)}: recalibrate (replayer calibrate) before trusting "
        "the virtual answer"
    )
    return "\n".join(lines)
