"""`replayer run` and `replayer sweep`: options → a typed ReplayConfig → the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.config_file import config_option
from replayer.cli.errors import errors_as_messages, interrupted
from replayer.cli.options import replay_config, replay_options
from replayer.cli.params import LANES, MAX_LANES, int_list

if TYPE_CHECKING:
    from replayer.play.progress import ReplayOutcome


class GateFailed(click.ClickException):
    """The run finished but failed its error gate: exit status 1."""

    exit_code = 1


def gate(summaries: list[ReplayOutcome], max_error_rate: float | None) -> None:
    """Warnings about what a server ignored; exit status 1 when the error gate
    fails (default: a run without one ok request)."""
    for s in summaries:
        for warning in s.warnings:
            click.echo(f"warning: {warning}", err=True)
        c = s.counts
        if c.not_streamed:
            click.echo(
                f"warning: {s.run_dir}: {c.not_streamed:,} responses were not streamed "
                '(the server ignored "stream": true; their TTFT is their E2E)',
                err=True,
            )
        if c.short_output:
            click.echo(
                f"warning: {s.run_dir}: {c.short_output:,} responses had fewer output "
                "tokens than max_tokens (does the server honour ignore_eos/min_tokens?"
                " else pass --no-vllm-extras and expect shorter outputs)",
                err=True,
            )
        if s.client_limited:
            assert s.client_check is not None
            click.echo(
                f"warning: {s.run_dir}: CLIENT-LIMITED: the replayer, not the server, "
                f"limited this run ({'; '.join(s.client_check.reasons)}); its "
                "latencies include the client's own delays: add --workers or --ray, "
                "or give the replayer cores the server does not use",
                err=True,
            )
        for note in () if s.client_check is None else s.client_check.server_notes:
            click.echo(f"note: {s.run_dir}: {note}", err=True)
    for s in summaries:
        aborted = _aborted(s.run_dir)
        if aborted:
            raise GateFailed(f"{s.run_dir}: run stopped: {aborted}")
        rate = s.counts.error_rate
        if s.counts.ok == 0:
            raise GateFailed(f"{s.run_dir}: no request succeeded ({s.one_line()})")
        if max_error_rate is not None and rate is not None and rate > max_error_rate:
            raise GateFailed(
                f"{s.run_dir}: error rate {rate:.1%} is above --max-error-rate "
                f"{max_error_rate:.1%} ({s.counts.failed:,} of "
                f"{s.counts.ok + s.counts.failed:,} requests failed)"
            )


def _aborted(run_dir: Path) -> str | None:
    """Why the run stopped early on its own: ``--on-error abort-run``, or the server
    that stopped answering (None: it did not)."""
    import json

    from replayer.records import RunMeta

    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return None
    meta = RunMeta.from_dict(json.loads(path.read_text()))
    aborted = meta.error or (meta.protocol and meta.protocol.aborted)
    return str(aborted) if aborted else None


@click.command()
@click.argument(
    "trace_path", metavar="TRACE", type=click.Path(exists=True, path_type=Path)
)
@config_option
@click.option(
    "--concurrency",
    type=LANES,
    help="Live session trees (default mode; default 1).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory (default: runs/<run id>).",
)
@replay_options()
def run(
    trace_path: Path, concurrency: int | None, out: Path | None, **opts: Any
) -> None:
    """Replay TRACE against an OpenAI-compatible endpoint; write a run directory."""
    from replayer.launch import replay
    from replayer.records.rundir import new_run_id

    run_id = new_run_id()
    run_dir = out or Path("runs") / run_id
    with errors_as_messages():
        config, opts = replay_config(opts, concurrency=concurrency)
        try:
            summary = replay(
                trace_path,
                config,
                run_dir,
                run_id=run_id,
                progress=None if opts["quiet"] else sys.stderr,
            )
        except KeyboardInterrupt:
            interrupted(run_dir)
    click.echo(summary.one_line())
    gate([summary], opts["max_error_rate"])


def _levels(text: str) -> list[int]:
    try:
        return int_list(text, minimum=1, maximum=MAX_LANES, example="1,2,4,8")
    except click.BadParameter as exc:
        exc.param_hint = "'--concurrency'"  # parsed after click: name the flag
        raise


@click.command()
@click.argument(
    "trace_path", metavar="TRACE", type=click.Path(exists=True, path_type=Path)
)
@config_option
@click.option(
    "--concurrency",
    "levels",
    required=True,
    metavar="N,N,...",
    help="Concurrency levels, one run each, e.g. 1,2,4,8.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Sweep directory (one run directory per level).",
)
@replay_options()
def sweep(trace_path: Path, levels: str, out: Path, **opts: Any) -> None:
    """Replay TRACE once per concurrency level into SWEEP_DIR/c<N>/."""
    from replayer.studies.sweep import run_sweep

    concurrency = _levels(levels)
    if opts["session_rate"] is not None or opts["timestamps"]:
        raise click.UsageError(
            "a sweep varies --concurrency: --session-rate and --timestamps do not apply"
        )
    summaries = []
    with errors_as_messages():
        config, opts = replay_config(opts, concurrency=None)
        try:
            for name, summary in run_sweep(
                trace_path,
                config,
                concurrency,
                out,
                progress=None if opts["quiet"] else sys.stderr,
            ):
                click.echo(f"{name}: {summary.one_line()}")
                summaries.append(summary)
        except KeyboardInterrupt:
            interrupted(out)
    gate(summaries, opts["max_error_rate"])
