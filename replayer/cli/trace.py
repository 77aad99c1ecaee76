"""`replayer trace stats|validate|convert|import`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import errors_as_messages
from replayer.cli.output import echo_json

if TYPE_CHECKING:
    from traces.model import Trace


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


_LOG_SOURCES = ("claude-code", "codex", "tracelab")  # = traces.importers.SOURCES
_TRACE_SOURCES = ("bailian", "burstgpt")  # public traces: traces.bailian, .burstgpt


@trace.command("import")
@click.argument("source", type=click.Choice(_LOG_SOURCES + _TRACE_SOURCES))
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output trace: .jsonl / .jsonl.gz (native) or .parquet.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    help="Tokens per hash block [default: 64; bailian: the trace's 16].",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A local tokenizer.json: block ids from real token ids (claude-code, codex; "
    "needs the 'tokenizers' package).",
)
def trace_import_cmd(
    source: str,
    paths: tuple[str, ...],
    out: Path,
    block_size: int | None,
    tokenizer: Path | None,
) -> None:
    """Import SOURCE logs at PATHS (files, folders or globs) as an anonymized trace.

    claude-code, codex: the agents' own session logs (a live log is fine); tracelab:
    TraceLab round rows; bailian, burstgpt: those public traces (one file). The
    output holds no text, paths, tool inputs or ids from the logs.
    """
    from traces.io import write_trace

    with errors_as_messages():
        loaded, summary, notes = _import(source, paths, block_size, tokenizer)
        write_trace(loaded, out)
    click.echo(f"wrote {out}: {summary}")
    for line in notes:
        click.echo(line, err=True)


def _import(
    source: str, paths: tuple[str, ...], block_size: int | None, tokenizer: Path | None
) -> tuple[Trace, str, list[str]]:
    """(trace, one-line summary, notes for stderr) of one `trace import`."""
    if source in _LOG_SOURCES:
        from traces.importers import DEFAULT_BLOCK_SIZE, import_logs

        res = import_logs(
            source,
            paths,
            block_size=block_size or DEFAULT_BLOCK_SIZE,
            tokenizer=tokenizer,
        )
        rep = res.report
        summary = (
            f"{rep.sessions:,} sessions ({rep.subagent_sessions:,} subagent sessions), "
            f"{rep.calls:,} calls from {len(rep.files):,} files; "
            f"hash ids: {rep.hash_rule}"
        )
        return res.trace, summary, rep.summary_lines()
    if tokenizer is not None:
        raise click.UsageError(
            f"--tokenizer does not apply to {source} traces (no text)"
        )
    if len(paths) != 1:
        raise click.UsageError(
            f"{source} takes one trace file (got {len(paths)} paths)"
        )
    if source == "bailian":
        if block_size is not None:
            raise click.UsageError("bailian traces come with their own 16-token blocks")
        from traces.bailian import read_bailian

        loaded = read_bailian(paths[0])
    else:
        from traces.burstgpt import DEFAULT_BLOCK_SIZE, read_burstgpt

        loaded = read_burstgpt(paths[0], block_size=block_size or DEFAULT_BLOCK_SIZE)
    return loaded, f"{len(loaded):,} sessions, {loaded.request_count():,} requests", []
