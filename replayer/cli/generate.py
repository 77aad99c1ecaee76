"""`replayer generate`: write a synthetic trace from a preset, a saved config or a fit.

Module-level imports: click only; numpy and the generator load inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from replayer.cli.errors import CommandError
from replayer.cli.params import POSITIVE, SEED, SESSIONS

if TYPE_CHECKING:
    from traces.generate import GeneratorConfig

_PRESET_NAMES = ("agentx", "agentx-256k", "demo")  # = traces.generate.PRESETS


def _resolve(
    preset: str | None, config: Path | None, calibrate_from: Path | None
) -> GeneratorConfig:
    import orjson

    from traces.errors import TraceError
    from traces.fit import fit_config
    from traces.generate import PRESETS, GeneratorConfig
    from traces.io import read_trace

    if sum(x is not None for x in (preset, config, calibrate_from)) > 1:
        raise click.UsageError("use only one of --preset, --config, --calibrate-from")
    if calibrate_from is not None:
        trace = read_trace(calibrate_from)
        try:
            return fit_config(trace)
        except TraceError as exc:
            raise TraceError(f"{calibrate_from}: {exc}") from exc
    if config is not None:
        try:
            obj = orjson.loads(config.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise CommandError(f"{config}: cannot read config: {exc}") from exc
        return GeneratorConfig.from_dict(obj)
    return PRESETS[preset or "agentx"]


@click.command("generate")
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output trace: .jsonl / .jsonl.gz (native, Weka-compatible) or .parquet.",
)
@click.option(
    "--sessions",
    type=SESSIONS,
    help="Root sessions to generate [default: the preset's or the fitted trace's].",
)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--preset",
    type=click.Choice(_PRESET_NAMES),
    help="Built-in statistics [default: agentx].",
)
@click.option(
    "--calibrate-from",
    type=click.Path(exists=True, path_type=Path),
    help="Fit the distributions to this real trace (Weka or native file/folder).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Generator config JSON written by --save-config.",
)
@click.option(
    "--save-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the effective generator config as JSON.",
)
@click.option(
    "--global-prefix",
    is_flag=True,
    help='Share the system/tools prefix across sessions (hash_id_scope "global").',
)
@click.option(
    "--session-rate",
    type=POSITIVE,
    help="Session arrivals per second (Poisson); writes each session's start_t.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the trace stats as JSON.")
def generate(
    out: Path,
    sessions: int | None,
    seed: int,
    preset: str | None,
    calibrate_from: Path | None,
    config_path: Path | None,
    save_config: Path | None,
    global_prefix: bool,
    session_rate: float | None,
    as_json: bool,
) -> None:
    """Generate a synthetic agentic trace (session trees with subagents) into OUT."""
    import time
    from dataclasses import replace

    from traces.errors import TraceError
    from traces.generate import generate_trace
    from traces.io import write_trace

    try:
        config = _resolve(preset, config_path, calibrate_from)
        if global_prefix or session_rate is not None:
            config = replace(
                config,
                global_prefix=global_prefix or config.global_prefix,
                session_rate_per_s=session_rate or config.session_rate_per_s,
            )
        if save_config is not None:
            _save(config, save_config)
        t0 = time.perf_counter()
        trace = generate_trace(
            config, sessions=sessions or config.default_sessions, seed=seed
        )
        t1 = time.perf_counter()
        write_trace(trace, out)
    except TraceError as exc:
        raise CommandError(str(exc)) from exc
    click.echo(
        f"wrote {out}: {len(trace):,} sessions, {trace.request_count():,} requests "
        f"({config.name}, seed {seed}; generated in {t1 - t0:.2f} s, "
        f"written in {time.perf_counter() - t1:.2f} s)",
        err=as_json,  # with --json, stdout holds only the JSON object
    )
    if as_json:
        from replayer.cli.output import echo_json
        from traces.stats import trace_stats

        echo_json(trace_stats(trace).as_dict())


def _save(config: GeneratorConfig, path: Path) -> None:
    import orjson

    try:
        path.write_bytes(
            orjson.dumps(config.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"
        )
    except OSError as exc:
        raise CommandError(f"{path}: cannot write config: {exc}") from exc
