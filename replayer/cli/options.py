"""The options `run`, `sweep`, `capacity` and `demo` share, and the one mapping from
them to a ReplayConfig (with the CLI's policy: `--profile` defaults, which flags go
together). docs/replaying.md and docs/agentx.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from replayer.cli.params import (
    BLOCK_TOKENS,
    FACTOR,
    FRACTION,
    MAX_FACTOR,
    POSITIVE,
    POSITIVE_SECONDS,
    PROCESSES,
    SECONDS,
    SEED,
    HttpUrl,
    Quantity,
    Ratio,
    ShellArgs,
    TokenRange,
    count,
    mooncake_rows_option,
)

if TYPE_CHECKING:
    from replayer.config import ReplayConfig

F = TypeVar("F", bound=Callable[..., Any])


def replay_options(*, env: bool = True, **defaults: Any) -> Callable[[F], F]:
    """The options shared by `run`, `sweep`, `capacity` and `demo`; ``defaults``:
    the command's own defaults where they differ (demo's think scale), by name;
    ``env``: whether options read their environment variables (REPLAYER_ENDPOINT).
    The command gets them settled (:func:`settle`: a flag typed beats the
    `--config` file's values it contradicts)."""

    def decorate(f: F) -> F:
        @wraps(f)
        def settled(**opts: Any) -> Any:
            return f(**settle(opts))

        out: Any = settled
        for option in reversed(_options()):
            out = option(out)
        for param in out.__click_params__:
            if not env:
                param.envvar = None
            if param.name in defaults:
                param.default = defaults[param.name]
                param.show_default = True
        return out  # type: ignore[no-any-return]

    return decorate


def _options() -> list[Callable[[F], F]]:
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
            help="Multiplies the trace's think gaps (their human and other time; "
            "tool time where the trace knows it goes by --tool-scale).",
        ),
        click.option(
            "--think-cap",
            "think_cap_s",
            type=SECONDS,
            help="Caps each (scaled) think gap's non-tool time, seconds.",
        ),
        click.option(
            "--tool-scale",
            type=FACTOR,
            default=1.0,
            show_default=True,
            help="Multiplies the think gaps' tool time (the union of the tool "
            "spans, where the trace knows it; imported agent logs do).",
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
            "--output-scale",
            type=Quantity(min=0, min_open=True, max=MAX_FACTOR),
            default=1.0,
            show_default=True,
            help="Multiply every request's output length (max_tokens, and "
            "min_tokens with it) by X.",
        ),
        click.option(
            "--max-output-tokens",
            type=count(1),
            help="Cap every request's output length (after --output-scale).",
        ),
        click.option(
            "--fit-context",
            type=click.Choice(["off", "clamp"]),
            default="off",
            show_default=True,
            help="Requests whose prompt + output pass the server's max_model_len: "
            "sent as they are (off), or their output shortened to fit (clamp; "
            "counted per row).",
        ),
        mooncake_rows_option,
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
    return options


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
            type=click.Choice(
                ["dynamo", "sglang", "header", "dynamo-full", "agent-native"]
            ),
            help="--session-header preset: dynamo x-dynamo-session-id, sglang "
            "x-smg-routing-key, header x-session-id; or a set of headers: "
            "dynamo-full (Dynamo's session, parent session and final), "
            "agent-native (Claude Code's or Codex's own, see --agent-native).",
        ),
        click.option(
            "--agent-native",
            type=click.Choice(["claude", "codex"]),
            help="--session-routing agent-native: whose headers (default: the "
            "agent whose log the trace was imported from).",
        ),
        click.option(
            "--session-token-header",
            metavar="NAME",
            help="Echo the value a response returns in this header on its "
            "session's next request (llm-d's x-session-token); never recorded.",
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


# What `--profile agentx` sets; every one is also a flag of its own, and a value the
# user gave (a flag, its environment variable, a --config file) wins. docs/agentx.md
# says where each value comes from and where AIPerf's implementation differs.
AGENTX_DEFAULTS: dict[str, Any] = {
    "start_ratio": (0.25, 0.75),
    "cache_warmup_s": 300.0,
    "duration_s": 3600.0,
    "idle_skip_s": 10.0,
    "loop": True,
    "on_error": "continue",
    "think_scale": 1.0,
    "max_error_rate": 0.10,
    "api": "chat",
    "replay_markers": True,
}

# A --config file's value counts as given, as a typed flag does.
_GIVEN = (
    ParameterSource.COMMANDLINE,
    ParameterSource.ENVIRONMENT,
    ParameterSource.DEFAULT_MAP,
)
_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)

# Options that choose one thing together (where to replay, the schedule, the
# topology, the routing header): one of them typed on the command line drops the
# --config file's values of the others, which it would contradict. Each with the
# value it then takes.
_CHOICES: tuple[dict[str, Any], ...] = (
    {"endpoint": None, "virtual": None, "model": None},
    {"concurrency": None, "session_rate": None, "timestamps": False},
    {"workers": 1, "ray_address": None, "ray_workers": None},
    {"session_header": None, "session_routing": None},
)


def settle(opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with the command line winning over a --config file: a file's value
    of a choice (:data:`_CHOICES`) is dropped when the command line chose otherwise
    (``--model`` stays with a typed ``--endpoint`` only when typed too), and
    ``--sim-args`` not typed when the run goes to an endpoint."""
    ctx = click.get_current_context()
    out = dict(opts)
    for choice in _CHOICES:
        names = [n for n in choice if n in out]
        typed = {n for n in names if ctx.get_parameter_source(n) in _TYPED}
        if not typed - {"model"}:
            continue
        for name in names:
            if name not in typed and _from_file(ctx, name):
                out[name] = choice[name]
    if out.get("endpoint") and ctx.get_parameter_source("sim_args") not in _TYPED:
        out["sim_args"] = ()  # the file's or the command's: no simulator runs
    return out


def _from_file(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == ParameterSource.DEFAULT_MAP


def apply_profile(opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with ``--profile``'s defaults in place of every option the user
    left at its default (a flag, its environment variable or a --config file's
    value wins)."""
    if opts.get("profile") != "agentx":
        return opts
    if opts.get("session_rate") is not None or opts.get("timestamps"):
        raise click.UsageError(
            "--profile agentx keeps N session trees live: use --concurrency, not "
            "--session-rate or --timestamps"
        )
    ctx = click.get_current_context()
    out = dict(opts)
    for name, default in AGENTX_DEFAULTS.items():  # keys: the option names
        if ctx.get_parameter_source(name) not in _GIVEN:
            out[name] = default
    return out


def replay_config(
    opts: dict[str, Any], *, concurrency: int | None
) -> tuple[ReplayConfig, dict[str, Any]]:
    """The one mapping of the shared options (as :func:`replay_options` hands them
    to the command) to a ReplayConfig: which flags go together, ``--profile``'s
    defaults, then the config. Returns it with the resolved options (the error
    gate and ``--quiet`` are read from them). ``concurrency``: the lanes (None: one,
    or a study sets them per level)."""
    _check_ray(opts)
    opts = apply_profile(opts)
    _reject_idle_flags(opts)
    return build_config(opts, concurrency=concurrency), opts


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


def build_config(opts: dict[str, Any], *, concurrency: int | None) -> ReplayConfig:
    """A ReplayConfig from resolved options (no policy: see :func:`replay_config`)."""
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
            base_url=opts["endpoint"],
            model=opts["model"],
            api=opts["api"],
            api_key=api_key,
            connect_timeout_s=opts["connect_timeout"],
            read_timeout_s=opts["read_timeout"],
            total_timeout_s=opts["request_timeout"],
            vllm_extras=not opts["no_vllm_extras"],
            keepalive=not opts["no_keepalive"],
            session_token_header=opts["session_token_header"],
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
        tool_scale=opts["tool_scale"],
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
        session_routing=opts["session_routing"]
        if opts["session_routing"] not in ROUTING_HEADERS
        else None,
        agent_native=opts["agent_native"],
        output_scale=opts["output_scale"],
        max_output_tokens=opts["max_output_tokens"],
        fit_context=opts["fit_context"],
        mooncake_rows=opts["mooncake_rows"],
        live_assistant=opts["live_assistant"],
        virtual=opts.get("virtual"),
    )


def _session_header(opts: dict[str, Any], presets: dict[str, str]) -> str | None:
    if opts["session_header"] and opts["session_routing"]:
        raise click.UsageError(
            "--session-routing names the header: give it or --session-header"
        )
    if opts["agent_native"] and opts["session_routing"] != "agent-native":
        raise click.UsageError("--agent-native needs --session-routing agent-native")
    if opts["session_routing"] in presets:
        return presets[opts["session_routing"]]
    if opts["session_routing"]:
        return None
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
        if ctx.get_parameter_source(name) not in _TYPED:
            continue
        given = bool(opts.get(needs.lstrip("!")) not in (None, False, ""))
        if given == needs.startswith("!"):
            raise click.UsageError(because)
    if (
        ctx.get_parameter_source("burstiness") == ParameterSource.COMMANDLINE
        and opts["arrival"] != "gamma"
    ):
        raise click.UsageError("--burstiness is the shape of --arrival gamma")
    if ctx.get_parameter_source("session_id_scope") in _TYPED and opts[
        "session_routing"
    ] in ("dynamo-full", "agent-native"):
        raise click.UsageError(
            f"--session-routing {opts['session_routing']} names each session and "
            "its tree itself: drop --session-id-scope"
        )
