"""`replayer demo`: a small AgentX-like trace → the built-in simulator → replay → the
P90 summary. Everything a first-time user needs to see the tool work, on a laptop."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import errors_as_messages, interrupted
from replayer.cli.options import replay_config, replay_options
from replayer.cli.params import LANES, SESSIONS
from replayer.cli.run import gate

if TYPE_CHECKING:
    from replayer.config import ReplayConfig
    from replayer.play.progress import ReplayOutcome

# The simulator runs 20x faster than one modeled GPU so the demo takes seconds.
_SIM_ARGS = (
    "--speed",
    "20",
    "--kv-capacity-tokens",
    "262144",
    "--max-model-len",
    "131072",
)


def run_demo(
    out: Path, *, sessions: int, config: ReplayConfig, quiet: bool
) -> tuple[str, ReplayOutcome]:
    """Run the demo into ``out``; return the text to print and the run's summary."""
    from analysis import load_run, summarize
    from analysis.text import format_summaries
    from replayer.launch import replay
    from replayer.records.rundir import new_run_id
    from traces.generate import PRESETS, generate_trace
    from traces.io import write_trace

    out.mkdir(parents=True, exist_ok=True)
    trace = generate_trace(PRESETS["demo"], sessions=sessions, seed=0)
    trace_path = write_trace(trace, out / "trace.jsonl")
    run_id = new_run_id()
    run_dir = out / "runs" / run_id
    try:
        summary = replay(
            trace_path,
            config,
            run_dir,
            run_id=run_id,
            progress=None if quiet else sys.stderr,
        )
    except KeyboardInterrupt:
        interrupted(run_dir)
    table = format_summaries([summarize(load_run(run_dir))])
    if config.virtual is not None:
        against = f"virtual time, engine model {config.virtual}"
    elif config.endpoint.base_url is None:
        against = "simulated endpoint"
    else:
        against = "endpoint from --endpoint"
    text = "\n".join(
        [
            f"trace: {trace_path} ({len(trace)} sessions, "
            f"{trace.request_count()} requests; {against})",
            summary.one_line(),
            "",
            table,
            "",
            f"analyze again: replayer analyze {run_dir}",
        ]
    )
    return text, summary


@click.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-run"),
    show_default=True,
    help="Folder for the demo trace and run directory.",
)
@click.option("--sessions", type=SESSIONS, default=6, show_default=True)
@click.option("--concurrency", type=LANES, default=4, show_default=True)
# The built-in simulator unless --endpoint is typed: REPLAYER_ENDPOINT is not read.
@replay_options(env=False, think_scale=0.1, sim_args=shlex.join(_SIM_ARGS))
def demo(out: Path, sessions: int, concurrency: int, **opts: Any) -> None:
    """Generate a small AgentX-like trace, replay it against the built-in simulator
    and print the P90 summary. Every option of `run` applies."""
    with errors_as_messages():
        config, opts = replay_config(opts, concurrency=concurrency)
        text, summary = run_demo(
            out, sessions=sessions, config=config, quiet=opts["quiet"]
        )
    click.echo(text)
    gate([summary], opts["max_error_rate"])
