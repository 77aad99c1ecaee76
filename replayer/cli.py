"""The `replayer` command line: parse options, build config, call one library function.

Heavy imports (pandas, pyarrow, aiohttp) happen inside the commands so `--help` is fast.
Every ReplayerError/TraceError becomes a one-line message and exit status 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from replayer import __version__
from replayer.cli_errors import errors_as_messages


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN → null recursively, so `--json` output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def echo_json(obj: object) -> None:
    """Print ``obj`` as one JSON object on stdout."""
    click.echo(json.dumps(_clean(obj), default=_json_default))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="replayer")
def main() -> None:
    """Replay agentic coding-session traces against OpenAI-compatible servers."""


@main.group()
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


def _register_subcommands() -> None:
    # Each of these modules defines click commands with lazy heavy imports.
    import importlib

    for module, names in (
        ("replayer.sim.cli", ("sim",)),
        ("replayer.cli_run", ("run", "sweep", "demo")),
        ("replayer.cli_generate", ("generate",)),
        ("replayer.cli_analysis", ("analyze", "compare", "report")),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # TODO(founding-eng): drop once all land
            if exc.name != module:
                raise
            continue
        for name in names:
            main.add_command(getattr(mod, name))


_register_subcommands()
