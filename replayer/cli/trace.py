"""`replayer trace stats|validate|convert`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from replayer.cli.errors import errors_as_messages
from replayer.cli.output import echo_json


@click.group()
def trace() -> None:
    """Inspect, validate and convert trace files (Weka/AgentX, Mooncake, native)."""


_TRACE_PATH = click.Path(exists=True, path_type=Path)


@trace.command("stats")
@click.argument("path", type=_TRACE_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def trace_stats_cmd(path: Path, as_json: bool) -> None:
    """Statistics of the trace at PATH (a file or a folder; the format is detected)."""
    from traces.io import read_trace
    from traces.stats import trace_stats

    with errors_as_messages():
        stats = trace_stats(read_trace(path))
    if as_json:
        echo_json(stats.as_dict())
        return
    click.echo(format_stats(stats.as_dict(), path))


def format_stats(d: dict[str, Any], path: Path) -> str:
    """The human-readable `trace stats` table."""
    lines = [
        f"trace            {path}  ({d['source_format']})",
        f"sessions         {d['sessions']:,}  ({d['sessions_with_subagents']:,} with "
        f"subagents, {d['subagent_sessions']:,} subagent sessions)",
        f"requests         {d['requests']:,}",
        f"input tokens     {d['total_input_tokens']:,}",
        f"output tokens    {d['total_output_tokens']:,}",
        f"ideal cache hit  {d['ideal_cache_hit_rate']:.2%}",
        f"block size       {', '.join(map(str, d['block_sizes']))} tokens "
        f"({'/'.join(d['hash_id_scopes'])} hash ids)",
        "",
        f"{'per request':<22}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}",
    ]
    for label, key in (
        ("input tokens", "input_tokens"),
        ("output tokens", "output_tokens"),
        ("think time (s)", "think_time_s"),
        ("requests per session", "requests_per_session"),
    ):
        row = d[key]
        cells = "".join(
            f"{'-':>12}" if not math.isfinite(row[k]) else f"{row[k]:>12,.1f}"
            for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{label:<22}{cells}")
    return "\n".join(lines)


@trace.command("validate")
@click.argument("path", type=_TRACE_PATH)
def trace_validate_cmd(path: Path) -> None:
    """Check the trace at PATH; print every problem, one per line; exit 1 if any."""
    from traces.io import check_trace

    with errors_as_messages():
        loaded, problems = check_trace(path)
    for problem in problems:
        click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem(s) found", err=True)
        raise SystemExit(1)
    assert loaded is not None
    click.echo(
        f"ok: {len(loaded):,} sessions, {loaded.request_count():,} requests "
        f"({loaded.source_format})"
    )


@trace.command("convert")
@click.argument("path", type=_TRACE_PATH)
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output file: .jsonl / .jsonl.gz (native) or .parquet (fast reload).",
)
def trace_convert_cmd(path: Path, out: Path) -> None:
    """Convert the trace at PATH to native JSONL or a Parquet trace store."""
    from traces.io import read_trace, write_trace

    with errors_as_messages():
        loaded = read_trace(path)
        write_trace(loaded, out)
    click.echo(
        f"wrote {out} ({len(loaded):,} sessions, {loaded.request_count():,} requests)"
    )
