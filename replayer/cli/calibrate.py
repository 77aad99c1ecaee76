"""`replayer calibrate`: fit the engine model (ENGINE.json) to live runs, and print
its error bars on held-out runs (``replayer.studies.calibrate``)."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import errors_as_messages
from replayer.cli.params import BLOCK_TOKENS, count
from replayer.sim.config import POLICIES

if TYPE_CHECKING:
    from replayer.studies.calibrate import Calibration, HoldoutSetting

_FIGURE_NAMES = {
    "output_tok_s": "output tok/s",
    "hit_rate": "server hit",
    "gpu_hit_rate": "GPU hit",
    "host_hit_rate": "host hit",
}


def _figure_name(name: str) -> str:
    if name in _FIGURE_NAMES:
        return _FIGURE_NAMES[name]
    metric, q, _ = name.split("_")
    return f"{metric.upper()} {q.upper()}"


def _value(name: str, v: float) -> str:
    if not math.isfinite(v):
        return "-"
    if name.endswith("hit_rate"):
        return f"{v:.1%}"
    if name == "output_tok_s":
        return f"{v:,.1f}"
    return f"{v:,.1f} ms"


def _error(unit: str, v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:+.1f} pt" if unit == "points" else f"{v:+.1%}"


def _spread(unit: str, v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.1f} pt" if unit == "points" else f"{v:.1%}"


def format_holdout(settings: list[HoldoutSetting]) -> str:
    """Per held-out setting: each figure predicted, measured, error, spread, and
    a latency's sampling error."""
    lines: list[str] = []
    for s in settings:
        repeats = f", {len(s.runs)} repeats" if len(s.runs) > 1 else ""
        lines.append(f"holdout {s.label} ({', '.join(s.runs)}{repeats})")
        header = [
            "figure", "predicted", "measured", "error", "run-to-run spread",
            "sampling (95%)",
        ]  # fmt: skip
        rows = [
            [
                _figure_name(f.name),
                _value(f.name, f.predicted),
                _value(f.name, f.measured),
                _error(f.unit, f.error),
                _spread(f.unit, f.spread),
                "-" if f.sampling is None else f"±{f.sampling:.1%}",
            ]
            for f in s.figures
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append(
                "  "
                + "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))
                ).rstrip()
            )
    return "\n".join(lines)


def format_calibration(cal: Calibration, out: Path) -> str:
    steps = cal.model.steps
    fit = cal.model.fit
    assert fit is not None
    lines = [
        f"engine model → {out} ({cal.steps:,} engine steps, {fit.rows:,} requests, "
        f"{len(fit.runs)} run(s); median step residual {cal.step_residual:.1%})",
        f"  decode base {steps.decode_base_ms:.3f} ms, per sequence "
        f"{steps.decode_per_seq_ms:.3f} ms, per context token "
        f"{steps.decode_us_per_context_token:.4f} µs",
        f"  prefill {steps.prefill_us_per_token:.2f} µs/token, GPU hit "
        f"{steps.gpu_hit_us_per_token:.3f} µs/token, per request "
        f"{steps.request_overhead_us:,.0f} µs",
        f"  cache: {cal.model.cache.kv_capacity_tokens:,} KV tokens in blocks of "
        f"{cal.model.cache.block_size} ({cal.shape_sources})",
        _host_line(cal),
        "  fitted runs replayed, RMS error: "
        + ", ".join(
            f"{_figure_name(k)} {v:.1%}"
            for k, v in fit.residuals.items()
            if k != "steps_median"
        ),
    ]
    return "\n".join(lines)


def _host_line(cal: Calibration) -> str:
    host = cal.model.fit.host if cal.model.fit is not None else None
    size = cal.model.cache.host_capacity_tokens
    tier = f"host tier {size:,} tokens" if size else "no host tier"
    if host is not None and host.fitted:
        return (
            f"  {tier}: load {cal.model.steps.host_hit_us_per_token:.3f} µs/token, "
            f"fitted on {host.steps_with_host_hits:,} steps that loaded host hits "
            f"(median residual {host.median_rel_residual or 0:.1%})"
        )
    reason = "no host fit" if host is None else host.reason
    return f"  {tier}: load cost not fitted ({reason})"


@click.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=Path)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The engine model to write (ENGINE.json).",
)
@click.option(
    "--holdout",
    "holdout_dirs",
    multiple=True,
    type=Path,
    metavar="RUN_DIR",
    help="A live run to predict in virtual time with its own settings "
    "(repeatable; runs of equal settings are repeats, and their spread is shown).",
)
@click.option(
    "--block-size",
    type=BLOCK_TOKENS,
    help="KV block size in tokens (default: the server's vllm:cache_config_info).",
)
@click.option(
    "--num-gpu-blocks",
    type=count(1),
    help="KV blocks on the GPU (default: the server's vllm:cache_config_info).",
)
@click.option(
    "--max-num-seqs",
    type=count(1),
    help="The server's running-sequence cap (default: vLLM's, 256).",
)
@click.option(
    "--max-num-batched-tokens",
    type=count(1),
    help="The server's token budget per step (default: vLLM's, 8192).",
)
@click.option(
    "--max-model-len",
    type=count(1),
    help="The server's longest request (default: the longest in the runs).",
)
@click.option(
    "--host-capacity-tokens",
    type=count(1),
    help="The server's host tier (CPU KV) in tokens (default: SGLang's "
    "sglang:hicache_host_total_tokens, or the simulator's setting; else none).",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="The server's admission: 'vllm' (a request waits until its whole prompt "
    "fits: vLLM's default scheduler_reserve_full_isl), 'vllm-chunk' (admitted on "
    "its first chunk: vLLM with --no-scheduler-reserve-full-isl). Default: the "
    "simulator's setting for runs against it, else 'vllm'.",
)
@click.option(
    "--refine-evals",
    type=count(0),
    default=0,
    show_default=True,
    help="After the step fit, refine the terms against the runs' own P50/P90 "
    "latencies, with at most N virtual replays of each run (0: the step fit "
    "alone).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def calibrate(
    run_dirs: tuple[Path, ...],
    out: Path,
    holdout_dirs: tuple[Path, ...],
    as_json: bool,
    refine_evals: int,
    **shape: Any,
) -> None:
    """Fit the engine model's step terms to live RUN_DIRs (one server); write
    ENGINE.json for `--virtual`, and predict --holdout runs against measured."""
    from replayer.cli.output import echo_json
    from replayer.records.engine_model import write_engine_model
    from replayer.studies.calibrate import (
        ShapeFlags,
        calibrate,
        holdout,
        load_live_runs,
    )

    with errors_as_messages(), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if holdout_dirs:
            # Held-out runs must be of the server the model is fitted on: said
            # before the fit, not after.
            load_live_runs([*run_dirs, *holdout_dirs])
        cal = calibrate(
            list(run_dirs),
            ShapeFlags(**shape),
            refine_evals=refine_evals,
            workdir=work,
            progress=None if as_json else lambda m: click.echo(m, err=True),
        )
        held = []
        if holdout_dirs:
            held = holdout(cal.model, list(holdout_dirs), workdir=work)
        write_engine_model(out, cal.model)
    if as_json:
        echo_json(
            {
                "engine_model": str(out),
                **cal.model.as_dict(),
                "steps_read": cal.steps,
                "step_terms": cal.step_terms,
                "refine_evaluations": cal.evaluations,
                "cache_sources": cal.shape_sources,
                "notes": list(cal.notes),
                "holdout": [s.as_dict() for s in held],
            }
        )
        return
    click.echo(format_calibration(cal, out))
    if held:
        click.echo(format_holdout(held))
    sys.stdout.flush()
