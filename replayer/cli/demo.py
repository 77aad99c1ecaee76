"""`replayer demo`: a small AgentX-like trace → the built-in simulator → replay → the
P90 summary. Everything a first-time user needs to see the tool work, on a laptop."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from replayer.cli.errors import errors_as_messages, interrupted
from replayer.cli.params import LANES, SESSIONS

# The simulator runs 20x faster than one modeled GPU so the demo takes seconds.
_SIM_ARGS = (
    "--speed",
    "20",
    "--kv-capacity-tokens",
    "262144",
    "--max-model-len",
    "131072",
)


def run_demo(out: Path, *, sessions: int, concurrency: int, quiet: bool) -> str:
    """Run the demo into ``out``; return the text to print."""
    from analysis import load_run, summarize
    from analysis.text import format_summaries
    from replayer.config import EndpointConfig, Lanes, ReplayConfig
    from replayer.launch import replay
    from replayer.records.rundir import new_run_id
    from traces.generate import PRESETS, generate_trace
    from traces.io import write_trace
    from traces.materialize import PromptConfig

    out.mkdir(parents=True, exist_ok=True)
    trace = generate_trace(PRESETS["demo"], sessions=sessions, seed=0)
    trace_path = write_trace(trace, out / "trace.jsonl")
    run_id = new_run_id()
    run_dir = out / "runs" / run_id
    config = ReplayConfig(
        endpoint=EndpointConfig(model="sim", api="completions"),  # the built-in sim
        prompt=PromptConfig(api="completions", salt=run_id),
        schedule=Lanes(concurrency=concurrency),
        think_scale=0.1,
        sim_args=_SIM_ARGS,
    )
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
    return "\n".join(
        [
            f"trace: {trace_path} ({len(trace)} sessions, "
            f"{trace.request_count()} requests; simulated endpoint)",
            summary.one_line(),
            "",
            table,
            "",
            f"analyze again: replayer analyze {run_dir}",
        ]
    )


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
@click.option("--quiet", is_flag=True, help="No progress line.")
def demo(out: Path, sessions: int, concurrency: int, quiet: bool) -> None:
    """Generate a small AgentX-like trace, replay it against the built-in simulator
    and print the P90 summary."""
    with errors_as_messages():
        text = run_demo(out, sessions=sessions, concurrency=concurrency, quiet=quiet)
    click.echo(text)
