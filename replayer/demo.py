"""`replayer demo`: a small AgentX-like trace → the built-in simulator → replay → the
P90 summary. Everything a first-time user needs to see the tool work, on a laptop."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from replayer.config import EndpointConfig, ReplayConfig
from replayer.run import new_run_id, replay_trace
from replayer.simproc import running_sim, sim_settings
from traces.generate import PRESETS, generate_trace
from traces.io import write_trace
from traces.materialize import PromptConfig

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
    out.mkdir(parents=True, exist_ok=True)
    trace = generate_trace(PRESETS["demo"], sessions=sessions, seed=0)
    trace_path = write_trace(trace, out / "trace.jsonl")
    run_id = new_run_id()
    run_dir = out / "runs" / run_id
    with running_sim(_SIM_ARGS) as url:
        config = ReplayConfig(
            endpoint=EndpointConfig(base_url=url, model="sim", api="completions"),
            prompt=PromptConfig(api="completions", salt=run_id),
            mode="concurrency",
            concurrency=concurrency,
            think_scale=0.1,
        )
        summary = asyncio.run(
            replay_trace(
                trace,
                config,
                run_dir,
                trace_path=trace_path,
                run_id=run_id,
                progress=None if quiet else sys.stderr,
                extra_metadata={
                    "simulated": True,
                    "sim": {"args": " ".join(_SIM_ARGS), **sim_settings(_SIM_ARGS)},
                },
            )
        )
    return "\n".join(
        [
            f"trace: {trace_path} ({len(trace)} sessions, "
            f"{trace.request_count()} requests; simulated endpoint)",
            summary.one_line(),
            "",
            _summary_table(run_dir),
            "",
            f"analyze again: replayer analyze {run_dir}",
        ]
    )


def _summary_table(run_dir: Path) -> str:
    from analysis import load_run, summarize
    from analysis.text import format_summaries

    return format_summaries([summarize(load_run(run_dir)).as_dict()])
