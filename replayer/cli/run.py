"""`replayer run` and `replayer sweep`: options → a typed ReplayConfig → the library."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from replayer.cli.errors import errors_as_messages, interrupted
from replayer.cli.params import (
    BLOCK_TOKENS,
    FACTOR,
    FRACTION,
    LANES,
    MAX_LANES,
    POSITIVE,
    POSITIVE_SECONDS,
    PROCESSES,
    SECONDS,
    SEED,
    HttpUrl,
    Ratio,
    ShellArgs,
    TokenRange,
    count,
    int_list,
)

if TYPE_CHECKING:
    from replayer.config import ReplayConfig
    from replayer.play.progress import RunSummary


class GateFailed(click.ClickException):
    """The run finished but failed its error gate: exit status 1."""

    exit_code = 1


F = TypeVar("F", bound=Callable[..., Any])


def _replay_options(f: F) -> F:
    """The options shared by `run` and `sweep`."""
    options = [
        click.option(
            "--endpoint",
            envvar="REPLAYER_ENDPOINT",
            type=HttpUrl(),
            metavar="URL",
            help="Base URL of the OpenAI-compatible server. Without it, the "
            "built-in simulated endpoint is started (and stopped after).",
        ),
        click.option(
            "--virtual",
            metavar="ENGINE.json|sim",
            help="Replay in virtual time against an engine model (from `replayer "
            "calibrate`; `sim`: the built-in simulator's settings) instead of a "
            "server: seconds, not hours. --sim-args given beside it override the "
            "model (a what-if: --kv-capacity-tokens, --host-capacity-tokens, "
            "--policy).",
        ),
        click.option(
            "--model",
            metavar="NAME",
            help="Model name to request. Default: the first one the server lists.",
        ),
        click.option(
            "--api",
            type=click.Choice(["chat", "completions"]),
            default="completions",
            show_default=True,
            help="completions sends token ids (exact counts); chat sends "
            "text messages (system + accumulated user/assistant).",
        ),
        click.option(
            "--session-rate",
            type=POSITIVE,
            help="Session trees per second (Poisson or gamma arrivals).",
        ),
        click.option(
            "--arrival",
            type=click.Choice(["poisson", "gamma"]),
            default="poisson",
            show_default=True,
        ),
        click.option(
            "--burstiness",
            type=POSITIVE,
            default=1.0,
            show_default=True,
            help="Gamma shape for --arrival gamma (1 = Poisson).",
        ),
        click.option(
            "--timestamps",
            is_flag=True,
            help="Start each session at its trace arrival time (Mooncake).",
        ),
        click.option(
            "--speedup",
            type=POSITIVE,
            default=1.0,
            show_default=True,
            help="Trace time / replay time with --timestamps.",
        ),
        click.option(
            "--think-scale",
            type=FACTOR,
            default=1.0,
            show_default=True,
            help="Multiplies the trace's think gaps.",
        ),
        click.option(
            "--think-cap",
            "think_cap_s",
            type=SECONDS,
            help="Caps each (scaled) think gap, seconds.",
        ),
        click.option(
            "--warmup",
            "warmup_s",
            type=SECONDS,
            default=0.0,
            show_default=True,
            help="Rows started in the first S seconds are flagged warm-up.",
        ),
        click.option(
            "--duration",
            "duration_s",
            type=POSITIVE_SECONDS,
            help="Stop starting new requests after S seconds.",
        ),
        click.option(
            "--drain",
            type=click.Choice(["finish", "cancel"]),
            default="finish",
            show_default=True,
            help="At --duration end: let in-flight requests finish, or cancel.",
        ),
        click.option(
            "--loop",
            is_flag=True,
            help="Start the trace over when exhausted (needs --duration).",
        ),
        click.option("--salt", help="Cache-bust salt (default: a fresh one per run)."),
        click.option(
            "--no-cache-bust",
            is_flag=True,
            help="Same prompt content in every run (runs share server cache).",
        ),
        click.option(
            "--block-tokens",
            type=BLOCK_TOKENS,
            help="Tokens per materialized hash block (shrinks contexts, keeps "
            "the prefix structure).",
        ),
        click.option(
            "--max-input-tokens",
            type=count(1),
            help="Cut prompts longer than this (from the end); counted per row.",
        ),
        click.option(
            "--tokenizer",
            type=click.Path(exists=True, dir_okay=False),
            help="A local tokenizer.json: --api chat text becomes exact in that "
            "model's tokens (needs the 'tokenizers' package).",
        ),
        click.option(
            "--token-range",
            type=TokenRange(),
            default="1000-30000",
            show_default=True,
            help="Token ids used for prompt content (MIN-MAX, MAX exclusive).",
        ),
        click.option(
            "--prompt-cache-mb",
            type=count(0, 1 << 30),
            default=256,
            show_default=True,
            help="Bound on the cache of encoded prompt blocks (later turns of a "
            "session reuse their prefix's blocks); 0: no cache.",
        ),
        click.option(
            "--no-vllm-extras",
            is_flag=True,
            help="Do not send ignore_eos/min_tokens (servers that reject them).",
        ),
        click.option(
            "--no-keepalive", is_flag=True, help="A new connection per request."
        ),
        click.option(
            "--connect-timeout",
            type=POSITIVE_SECONDS,
            default=10.0,
            show_default=True,
        ),
        click.option(
            "--read-timeout",
            type=POSITIVE_SECONDS,
            default=300.0,
            show_default=True,
            help="Max seconds between two chunks of a response.",
        ),
        click.option(
            "--request-timeout",
            type=POSITIVE_SECONDS,
            help="Total seconds per request (default: none).",
        ),
        click.option(
            "--max-inflight",
            type=count(1),
            help="Cap on requests in flight.",
        ),
        click.option(
            "--api-key",
            metavar="KEY",
            help="API key (prefer --api-key-env: flags show in process lists). "
            "Sent as a Bearer token; never recorded.",
        ),
        click.option(
            "--api-key-env",
            default="OPENAI_API_KEY",
            show_default=True,
            metavar="NAME",
            help="Environment variable holding the API key (never recorded).",
        ),
        click.option(
            "--label",
            "labels",
            multiple=True,
            metavar="KEY=VALUE",
            help="Free-form run label (repeatable).",
        ),
        click.option("--engine", help="Label: serving engine (vllm, sglang, ...)."),
        click.option("--engine-version", help="Label: engine version."),
        click.option("--tp", type=count(1), help="Label: tensor parallel size."),
        click.option("--ep", type=count(1), help="Label: expert parallel size."),
        click.option("--gpus", type=count(1), help="Label: GPU count."),
        click.option("--seed", type=SEED, default=0, show_default=True),
        click.option(
            "--workers",
            type=PROCESSES,
            default=1,
            show_default=True,
            help="Worker processes (sessions sharded; one start barrier).",
        ),
        click.option(
            "--ray",
            "ray_address",
            metavar="ADDR",
            help="Run workers as Ray actors on this cluster ('auto': the one "
            "this machine belongs to). Needs the [ray] extra.",
        ),
        click.option(
            "--ray-workers",
            type=PROCESSES,
            help="Ray actors (default: one per live node, at most one per lane).",
        ),
        click.option(
            "--sim-args",
            type=ShellArgs(),
            default="",
            metavar="ARGS",
            help="Options for the built-in simulator, e.g. '--speed 10'.",
        ),
        click.option(
            "--max-error-rate",
            type=FRACTION,
            help="Exit status 1 when failed / (ok + failed) exceeds this "
            "(default: only a run with no ok request fails).",
        ),
        click.option("--quiet", is_flag=True, help="No progress line."),
        *_protocol_options(),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _protocol_options() -> list[Callable[[F], F]]:
    """The AgentX protocol's parts, each a flag of its own; ``--profile agentx``
    only changes their defaults (an explicit flag wins)."""
    return [
        click.option(
            "--profile",
            type=click.Choice(["agentx"]),
            help="Apply a protocol's defaults: agentx = mid-session starts "
            "0.25-0.75, --cache-warmup 300, --duration 3600 (the measured "
            "window), --idle-skip 10, --loop, --on-error continue, "
            "--max-error-rate 0.10, --api chat.",
        ),
        click.option(
            "--start-ratio",
            metavar="MIN-MAX|off",
            type=Ratio(),
            help="Each lane's first tree starts at a seeded point this far into its "
            "session (e.g. 0.25-0.75); its prefix is primed with one max_tokens=1 "
            "request, flagged and excluded.",
        ),
        click.option(
            "--cache-warmup",
            "cache_warmup_s",
            type=SECONDS,
            default=0.0,
            show_default=True,
            help="Seconds of cache-pressure warm-up (zero think gaps, max_tokens=1, "
            "rows flagged) after the primers; --duration then counts from its end.",
        ),
        click.option(
            "--idle-skip",
            "idle_skip_s",
            type=SECONDS,
            help="Whole-system idle (no request in flight) beyond S seconds is "
            "skipped, not waited out.",
        ),
        click.option(
            "--on-error",
            type=click.Choice(["skip-session", "continue", "abort-run"]),
            default="skip-session",
            show_default=True,
            help="A failed request: skip the rest of its session, continue it, or "
            "stop the run (exit status 1).",
        ),
        click.option(
            "--replay-markers/--no-replay-markers",
            default=True,
            show_default=True,
            help="A cache-bust marker per replay of a tree: recycled trees never "
            "share cache with their earlier replays.",
        ),
        click.option(
            "--session-header",
            metavar="NAME",
            help="Stamp each request with its session tree's identity in this "
            "header (for KV-aware routers).",
        ),
        click.option(
            "--session-routing",
            type=click.Choice(["dynamo", "sglang", "header"]),
            help="--session-header preset: dynamo x-dynamo-session-id, sglang "
            "x-smg-routing-key, header x-session-id.",
        ),
        click.option(
            "--session-id-scope",
            type=click.Choice(["tree", "session"]),
            default="tree",
            show_default=True,
            help="A subagent's session identity: its root's (tree) or its own.",
        ),
        click.option(
            "--live-assistant",
            is_flag=True,
            help="Carry the model's real replies into the history (needs --api "
            "chat): prompts drift from the trace, reported per request and run.",
        ),
        click.option("--hardware", help="Label: accelerator (e.g. H100-SXM)."),
        click.option("--precision", help="Label: weights/KV precision (fp8 ...)."),
        click.option("--pp", type=count(1), help="Label: pipeline parallel size."),
        click.option("--disagg", help="Label: disaggregation (e.g. 1P2D, none)."),
        click.option("--kv-offload", help="Label: KV offload (e.g. lmcache, none)."),
        click.option("--spec-decode", help="Label: speculative decoding (none ...)."),
        click.option("--router", help="Label: router (dynamo-kv, sglang ...)."),
    ]


def apply_profile(opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with ``--profile``'s defaults in place of every option the user
    left at its default (an explicit flag, or its environment variable, wins)."""
    if opts.get("profile") != "agentx":
        return opts
    from replayer.config import AGENTX_DEFAULTS

    if opts.get("session_rate") is not None or opts.get("timestamps"):
        raise click.UsageError(
            "--profile agentx keeps N session trees live: use --concurrency, not "
            "--session-rate or --timestamps"
        )

    ctx = click.get_current_context()
    explicit = (
        click.core.ParameterSource.COMMANDLINE,
        click.core.ParameterSource.ENVIRONMENT,
    )
    out = dict(opts)
    for name, default in AGENTX_DEFAULTS.items():  # keys: the option names
        if ctx.get_parameter_source(name) not in explicit:
            out[name] = default
    return out


def _labels(opts: dict[str, Any]) -> dict[str, Any]:
    labels: dict[str, Any] = {
        "engine": opts["engine"],
        "engine_version": opts["engine_version"],
        "tp": opts["tp"],
        "ep": opts["ep"],
        "gpus": opts["gpus"],
    }
    for name in (
        "hardware", "precision", "pp", "disagg", "kv_offload", "spec_decode", "router"
    ):  # fmt: skip
        if opts.get(name) is not None:
            labels[name] = opts[name]
    for item in opts["labels"]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE, got {item!r}", param_hint="--label"
            )
        labels[key] = value
    return labels


def build_config(
    opts: dict[str, Any],
    *,
    endpoint: str | None,
    model: str | None,
    concurrency: int | None,
) -> ReplayConfig:
    """A ReplayConfig from parsed `run`/`sweep` options."""
    from replayer.config import (
        ROUTING_HEADERS,
        EndpointConfig,
        Lanes,
        RateArrivals,
        ReplayConfig,
        Schedule,
        TraceTimestamps,
    )
    from replayer.records.rundir import new_run_id
    from traces.materialize import PromptConfig

    modes = [
        opts["timestamps"],
        opts["session_rate"] is not None,
        concurrency is not None,
    ]
    if sum(bool(m) for m in modes) > 1:
        raise click.UsageError(
            "use one of --concurrency, --session-rate and --timestamps"
        )
    schedule: Schedule
    if opts["timestamps"]:
        schedule = TraceTimestamps(speedup=opts["speedup"])
    elif opts["session_rate"] is not None:
        schedule = RateArrivals(
            session_rate=opts["session_rate"],
            arrival=opts["arrival"],
            burstiness=opts["burstiness"],
        )
    else:
        schedule = Lanes(concurrency=concurrency or 1)
    lo, hi = opts["token_range"]
    salt = "" if opts["no_cache_bust"] else opts["salt"] or new_run_id()
    api_key = opts["api_key"] or os.environ.get(opts["api_key_env"]) or None
    return ReplayConfig(
        endpoint=EndpointConfig(
            base_url=endpoint,
            model=model,
            api=opts["api"],
            api_key=api_key,
            connect_timeout_s=opts["connect_timeout"],
            read_timeout_s=opts["read_timeout"],
            total_timeout_s=opts["request_timeout"],
            vllm_extras=not opts["no_vllm_extras"],
            keepalive=not opts["no_keepalive"],
        ),
        prompt=PromptConfig(
            api=opts["api"],
            salt=salt,
            token_min=lo,
            token_max=hi,
            cache_bytes=opts["prompt_cache_mb"] << 20,
            block_tokens=opts["block_tokens"],
            max_input_tokens=opts["max_input_tokens"],
            tokenizer=opts["tokenizer"],
            replay_markers=opts["replay_markers"],
        ),
        schedule=schedule,
        think_scale=opts["think_scale"],
        think_cap_s=opts["think_cap_s"],
        warmup_s=opts["warmup_s"],
        duration_s=opts["duration_s"],
        drain=opts["drain"],
        loop=opts["loop"],
        seed=opts["seed"],
        max_inflight=opts["max_inflight"],
        labels=_labels(opts),
        workers=opts["workers"],
        sim_args=tuple(opts["sim_args"]),
        ray_address=opts["ray_address"] or None,
        ray_workers=opts["ray_workers"],
        profile=opts["profile"],
        start_ratio=opts["start_ratio"],
        cache_warmup_s=opts["cache_warmup_s"],
        idle_skip_s=opts["idle_skip_s"],
        on_error=opts["on_error"],
        session_header=_session_header(opts, ROUTING_HEADERS),
        session_id_scope=opts["session_id_scope"],
        max_error_rate=opts["max_error_rate"],
        live_assistant=opts["live_assistant"],
        virtual=opts.get("virtual"),
    )


def _session_header(opts: dict[str, Any], presets: dict[str, str]) -> str | None:
    if opts["session_header"] and opts["session_routing"]:
        raise click.UsageError(
            "--session-routing names the header: give it or --session-header"
        )
    if opts["session_routing"]:
        return presets[opts["session_routing"]]
    return str(opts["session_header"]) if opts["session_header"] else None


def _check_ray(opts: dict[str, Any]) -> None:
    """Flags of the run's topology that do not go together (Ray, workers, virtual)."""
    if opts.get("virtual"):
        if opts["endpoint"]:
            raise click.UsageError(
                "--virtual replays against an engine model, not a server: "
                "drop --endpoint (or --virtual)"
            )
        if opts["ray_address"] or opts["workers"] > 1:
            raise click.UsageError(
                "--virtual runs in one process: drop --workers/--ray"
            )
    if opts["ray_workers"] is not None and not opts["ray_address"]:
        raise click.UsageError("--ray-workers needs --ray")
    if opts["ray_address"] and opts["workers"] > 1:
        raise click.UsageError("--ray runs its own workers: use --ray-workers")


# Flags that only mean something beside another one: (flag, needs, because).
_NEEDS: tuple[tuple[str, str, str], ...] = (
    ("speedup", "timestamps", "--speedup scales trace time: it needs --timestamps"),
    ("arrival", "session_rate", "--arrival shapes --session-rate arrivals"),
    ("burstiness", "session_rate", "--burstiness shapes --session-rate arrivals"),
    ("drain", "duration_s", "--drain says what happens at the --duration end"),
    ("sim_args", "!endpoint", "--sim-args configure the built-in simulator (or "
     "override --virtual's engine model), neither of which runs with --endpoint"),
)  # fmt: skip


def _reject_idle_flags(opts: dict[str, Any]) -> None:
    """A flag that would do nothing in the chosen mode is an error, not a no-op."""
    ctx = click.get_current_context()
    for name, needs, because in _NEEDS:
        source = ctx.get_parameter_source(name)
        if source not in (
            click.core.ParameterSource.COMMANDLINE,
            click.core.ParameterSource.ENVIRONMENT,
        ):
            continue
        given = bool(opts.get(needs.lstrip("!")) not in (None, False, ""))
        if given == needs.startswith("!"):
            raise click.UsageError(because)
    if (
        ctx.get_parameter_source("burstiness") == click.core.ParameterSource.COMMANDLINE
        and opts["arrival"] != "gamma"
    ):
        raise click.UsageError("--burstiness is the shape of --arrival gamma")


def _gate(summaries: list[RunSummary], max_error_rate: float | None) -> None:
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
                "latencies include the client's own delays: add --workers or --ray",
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
@_replay_options
def run(
    trace_path: Path, concurrency: int | None, out: Path | None, **opts: Any
) -> None:
    """Replay TRACE against an OpenAI-compatible endpoint; write a run directory."""
    from replayer.launch import replay
    from replayer.records.rundir import new_run_id

    run_id = new_run_id()
    run_dir = out or Path("runs") / run_id
    with errors_as_messages():
        _check_ray(opts)
        _reject_idle_flags(opts)
        opts = apply_profile(opts)
        config = build_config(
            opts,
            endpoint=opts["endpoint"],
            model=opts["model"],
            concurrency=concurrency,
        )
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
    _gate([summary], opts["max_error_rate"])


def _levels(text: str) -> list[int]:
    return int_list(text, minimum=1, maximum=MAX_LANES, example="1,2,4,8")


@click.command()
@click.argument(
    "trace_path", metavar="TRACE", type=click.Path(exists=True, path_type=Path)
)
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
@_replay_options
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
        _check_ray(opts)
        _reject_idle_flags(opts)
        opts = apply_profile(opts)
        config = build_config(
            opts, endpoint=opts["endpoint"], model=opts["model"], concurrency=None
        )
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
    _gate(summaries, opts["max_error_rate"])
