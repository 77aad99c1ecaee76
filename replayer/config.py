"""Run configuration: frozen dataclasses built once (by the CLI or a test) and passed
down. No global settings; the library never reads the environment."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from replayer.errors import ConfigError
from traces.gaps import GapRule
from traces.materialize import Api, PromptConfig
from traces.mooncake import MOONCAKE_ROWS, MooncakeRows

Mode = Literal["concurrency", "session_rate", "timestamps"]
Arrival = Literal["poisson", "gamma"]
Drain = Literal["finish", "cancel"]
Profile = Literal["agentx"]
OnError = Literal["skip-session", "continue", "abort-run"]
SessionIdScope = Literal["tree", "session"]
# --session-routing: the header each KV-aware router reads for session affinity.
ROUTING_HEADERS: dict[str, str] = {
    "dynamo": "x-dynamo-session-id",
    "sglang": "x-smg-routing-key",
    "header": "x-session-id",
}
# --session-routing modes that stamp more than one header (docs/agentx.md):
# Dynamo's agentic set, or the headers the agent itself sends.
SessionRouting = Literal["dynamo-full", "agent-native"]
AgentNative = Literal["claude", "codex"]
FitContext = Literal["off", "clamp"]
# An HTTP header name: RFC 9110's token characters.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def check_header_name(name: str, option: str) -> None:
    """Raise ConfigError unless ``name`` is a valid HTTP header name."""
    if not _HEADER_NAME.match(name):
        raise ConfigError(
            f"{option} {name!r}: not an HTTP header name (letters, digits and "
            "!#$%&'*+-.^_`|~ only; no spaces)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """Where and how to talk to the server.

    EndpointConfig(base_url="http://127.0.0.1:8000", model="Qwen/Qwen3-8B")
    """

    base_url: str | None = None  # None: start the built-in simulated endpoint
    model: str | None = None  # None: the first model the server lists
    api: Api = "completions"
    api_key: str | None = field(default=None, repr=False)  # never stored or printed
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # max gap between SSE chunks, not total request time
    total_timeout_s: float | None = None  # None: long generations are never cut
    vllm_extras: bool = True  # send ignore_eos/min_tokens (some servers reject them)
    keepalive: bool = True  # reuse connections (off: one connection per request)
    include_usage: bool = True  # stream_options.include_usage
    # A response header whose value is echoed (same name) on the session's next
    # request (llm-d's x-session-token); the value is never recorded.
    session_token_header: str | None = None

    def __post_init__(self) -> None:
        if self.session_token_header is not None:
            check_header_name(self.session_token_header, "--session-token-header")
        if self.base_url is not None and not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(
                f"endpoint must be an http(s) URL (got {public_url(self.base_url)!r})"
            )
        if self.api_key is not None and self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.username is not None or parts.password is not None:
                raise ConfigError(
                    f"{public_url(self.base_url)}: credentials in the URL and an API "
                    "key both set the Authorization header; give one of them"
                )
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("timeouts must be > 0 seconds")
        if self.total_timeout_s is not None and self.total_timeout_s <= 0:
            raise ConfigError(f"total timeout must be > 0 (got {self.total_timeout_s})")

    def _at(self, path: str) -> str:
        """The base URL with ``path`` in place of its ``/v1`` (which it may or may
        not end in); its query string, if any, kept."""
        if self.base_url is None:
            raise ConfigError("no endpoint URL: the simulated endpoint was not started")
        parts = urlsplit(self.base_url)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return urlunsplit(parts._replace(path=base + path))

    def models_url(self) -> str:
        """``<base>/v1/models``."""
        return self._at("/v1/models")

    def url(self) -> str:
        """The POST URL for the chosen API."""
        return self._at(
            "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        )

    def metrics_url(self) -> str:
        """The server's Prometheus ``/metrics`` (at its root, beside ``/v1``)."""
        return self._at("/metrics")

    def reset_cache_urls(self) -> tuple[str, ...]:
        """Prefix-cache reset routes at the server's root, tried in order: vLLM's
        ``/reset_prefix_cache`` (served with VLLM_SERVER_DEV_MODE=1), SGLang's
        ``/flush_cache``."""
        return (self._at("/reset_prefix_cache"), self._at("/flush_cache"))

    def as_metadata(self) -> dict[str, Any]:
        """JSON-ready, without the API key or credentials in the URL."""
        d = {k: v for k, v in asdict(self).items() if k != "api_key"}
        d["base_url"] = public_url(self.base_url)
        d["api_key_set"] = self.api_key is not None
        return d


# Query parameters whose values are secrets: ``bearer``, ``jwt``, ``code`` (an OAuth
# grant) by name, and any name holding one of the other words (api_key, access_token,
# X-Amz-Signature, passwd, ...).
_SECRET_PARAM = re.compile(
    r"^code$|bearer|jwt|token|secret|key|auth|pass|sig|credential", re.I
)
_URL_IN_TEXT = re.compile(r"https?://[^\s'\"<>]+", re.I)


def public_url(url: str | None) -> str | None:
    """``url`` as it may be recorded, logged or printed: without user:password, and
    with the values of secret-like query (and fragment) parameters replaced by
    ``***``. A URL that does not parse comes back as ``<unparsable URL>``."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = host + (f":{parts.port}" if parts.port is not None else "")
            parts = parts._replace(netloc=netloc)
    except ValueError:
        return "<unparsable URL>"
    return urlunsplit(
        parts._replace(query=_redact_params(parts.query))._replace(
            fragment=_redact_params(parts.fragment)
        )
    )


def _redact_params(text: str) -> str:
    if "=" not in text:
        return text
    pairs = [
        (k, "***" if _SECRET_PARAM.search(k) else v)
        for k, v in parse_qsl(text, keep_blank_values=True)
    ]
    return urlencode(pairs, safe="*")


def redact_urls(text: str) -> str:
    """``text`` with every http(s) URL in it passed through :func:`public_url`
    (error messages that quote the URL they failed on)."""
    return _URL_IN_TEXT.sub(lambda m: public_url(m.group(0)) or "", text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lanes:
    """N live session trees (AgentX): a lane takes the next tree only when its whole
    tree, subagents included, has drained."""

    concurrency: int = 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1 (got {self.concurrency})")


@dataclass(frozen=True, slots=True, kw_only=True)
class RateArrivals:
    """Session trees start as a Poisson (or gamma) process of ``session_rate``/s."""

    session_rate: float
    arrival: Arrival = "poisson"
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson (vLLM's convention)

    def __post_init__(self) -> None:
        if not self.session_rate > 0:
            raise ConfigError(
                f"session rate must be > 0 sessions/s (got {self.session_rate})"
            )
        if self.burstiness <= 0:
            raise ConfigError(f"burstiness must be > 0 (got {self.burstiness})")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceTimestamps:
    """Each session starts at its trace arrival time, and each request no earlier
    than its trace time, divided by ``speedup`` (Mooncake)."""

    speedup: float = 1.0  # trace time / replay time

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ConfigError(f"speedup must be > 0 (got {self.speedup})")


Schedule = Lanes | RateArrivals | TraceTimestamps


_SCHEDULES: dict[str, type[Lanes] | type[RateArrivals] | type[TraceTimestamps]] = {
    "concurrency": Lanes,
    "session_rate": RateArrivals,
    "timestamps": TraceTimestamps,
}


def _known(cls: type, obj: Mapping[str, Any], skip: tuple[str, ...]) -> dict[str, Any]:
    """The items of ``obj`` that are init fields of dataclass ``cls``, less ``skip``."""
    names = {f.name for f in fields(cls) if f.init} - set(skip)
    return {k: v for k, v in obj.items() if k in names}


def schedule_kind(schedule: Schedule) -> Mode:
    """The run.json name of a schedule."""
    if isinstance(schedule, RateArrivals):
        return "session_rate"
    if isinstance(schedule, TraceTimestamps):
        return "timestamps"
    return "concurrency"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    """How a trace is replayed.

    ReplayConfig(endpoint=EndpointConfig(...), schedule=Lanes(concurrency=8),
                 think_scale=0.0)
    """

    endpoint: EndpointConfig
    prompt: PromptConfig = field(default_factory=PromptConfig)
    schedule: Schedule = field(default_factory=Lanes)
    think_scale: float = 1.0  # multiplies the trace's think gaps
    think_cap_s: float | None = None  # caps each (scaled) think gap, tool time apart
    tool_scale: float = 1.0  # multiplies the gaps' tool time (traces.gaps)
    warmup_s: float = 0.0  # rows scheduled before this are flagged warmup
    duration_s: float | None = None  # stop starting work after this
    drain: Drain = "finish"  # at duration end: finish or cancel in-flight requests
    loop: bool = False  # start the trace over when exhausted (until duration_s)
    seed: int = 0  # arrivals and anything random
    flush_interval_s: float = 2.0  # Parquet part files at least this often
    scrape_interval_s: float = 1.0  # server /metrics; 0 disables
    max_inflight: int | None = None  # cap on requests in flight (None: no cap)
    labels: dict[str, Any] = field(default_factory=dict)  # engine, tp, gpus ...
    workers: int = 1  # processes, sessions sharded round-robin
    sim_args: tuple[str, ...] = ()  # options of the built-in simulated endpoint
    # Ray: the cluster ("auto", or an address ray.init takes) whose actors replay;
    # None: this machine only. ray_workers: actors (None: one per live node, at most
    # one per lane).
    ray_address: str | None = None
    ray_workers: int | None = None
    # The AgentX protocol (docs/agentx.md); the CLI's `--profile agentx` sets its
    # parts' defaults.
    profile: Profile | None = None  # the protocol whose defaults were applied
    # Each lane's first tree starts at a seeded point this far into its session
    # (fraction of its recorded duration); its prefix is primed with one
    # max_tokens=1 request. None: every tree starts at its first turn.
    start_ratio: tuple[float, float] | None = None
    # After the primers: zero think gaps, max_tokens=1, for this long; then the
    # measured window opens (and --duration counts from there).
    cache_warmup_s: float = 0.0
    idle_skip_s: float | None = None  # whole-system idle beyond this is skipped
    on_error: OnError = "skip-session"  # what a failed request does to the run
    session_header: str | None = None  # HTTP header carrying the session identity
    session_id_scope: SessionIdScope = "tree"  # a subagent's identity: its root's
    # More than one routing header (None: session_header alone, if any).
    session_routing: SessionRouting | None = None
    # agent-native: whose headers (None: the trace's source, an imported log's).
    agent_native: AgentNative | None = None
    # Output lengths: the trace's scaled, then capped (before ignore_eos/min_tokens).
    output_scale: float = 1.0
    max_output_tokens: int | None = None
    # Requests whose prompt + output pass max_model_len: sent as they are ("off"),
    # or their output shortened to fit ("clamp").
    fit_context: FitContext = "off"
    # The server's context length as its /v1/models listed it at the start (the
    # engine model's in virtual time); None: not reported. Filled by the launcher.
    max_model_len: int | None = None
    # Carry the model's real replies into the history (chat) instead of the
    # recorded ones: prompts then drift from the trace (reported per request).
    live_assistant: bool = False
    # Replay in virtual time against this engine model (an ENGINE.json path, or
    # "sim": the built-in simulator's settings) instead of a server.
    virtual: str | None = None
    # How the trace's Mooncake session rows are read (traces.mooncake).
    mooncake_rows: MooncakeRows = "auto"

    def __post_init__(self) -> None:
        if self.session_header is not None:
            check_header_name(self.session_header, "--session-header")
        if self.session_routing is not None and self.session_header is not None:
            raise ConfigError(
                f"--session-routing {self.session_routing} names its headers: "
                "drop --session-header"
            )
        if self.mooncake_rows not in MOONCAKE_ROWS:
            raise ConfigError(
                f"mooncake rows must be one of {', '.join(MOONCAKE_ROWS)} "
                f"(got {self.mooncake_rows!r})"
            )
        if not 0 < self.output_scale < math.inf:
            raise ConfigError(
                f"output scale must be a finite number > 0 (got {self.output_scale})"
            )
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ConfigError(
                f"max output tokens must be >= 1 (got {self.max_output_tokens})"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max model len must be >= 1 (got {self.max_model_len})")
        if self.start_ratio is not None:
            lo, hi = self.start_ratio
            if not 0 <= lo <= hi <= 1:
                raise ConfigError(
                    f"start ratio must satisfy 0 <= MIN <= MAX <= 1 (got {lo}-{hi})"
                )
            if not isinstance(self.schedule, Lanes):
                raise ConfigError("mid-session starts need --concurrency (lanes)")
        if self.cache_warmup_s < 0:
            raise ConfigError(
                f"cache warm-up must be >= 0 s (got {self.cache_warmup_s})"
            )
        if self.live_assistant and self.endpoint.api != "chat":
            raise ConfigError(
                "--live-assistant carries replies as messages: it needs --api chat"
            )
        if self.idle_skip_s is not None and self.idle_skip_s < 0:
            raise ConfigError(f"idle skip must be >= 0 s (got {self.idle_skip_s})")
        if self.think_scale < 0:
            raise ConfigError(f"think scale must be >= 0 (got {self.think_scale})")
        if self.think_cap_s is not None and self.think_cap_s < 0:
            raise ConfigError(f"think cap must be >= 0 s (got {self.think_cap_s})")
        if not 0 <= self.tool_scale < math.inf:
            raise ConfigError(f"tool scale must be >= 0 (got {self.tool_scale})")
        if self.warmup_s < 0:
            raise ConfigError(f"warm-up must be >= 0 s (got {self.warmup_s})")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"duration must be > 0 s (got {self.duration_s})")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ConfigError(f"max in-flight must be >= 1 (got {self.max_inflight})")
        if self.loop and self.duration_s is None:
            raise ConfigError("--loop needs --duration (it would never end)")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1 (got {self.workers})")
        if self.ray_workers is not None and self.ray_workers < 1:
            raise ConfigError(f"Ray workers must be >= 1 (got {self.ray_workers})")

    def as_metadata(self) -> dict[str, Any]:
        """The effective config, JSON-ready, without secrets."""
        d = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("endpoint", "prompt", "schedule", "sim_args")
        }
        d["schedule"] = {"kind": schedule_kind(self.schedule), **asdict(self.schedule)}
        d["endpoint"] = self.endpoint.as_metadata()
        d["prompt"] = asdict(self.prompt)
        d["sim_args"] = list(self.sim_args)
        d["start_ratio"] = None if self.start_ratio is None else list(self.start_ratio)
        return d

    @classmethod
    def from_metadata(cls, obj: Mapping[str, Any]) -> ReplayConfig:
        """The config :meth:`as_metadata` recorded, read back (keys this version does
        not know are ignored; missing ones take their defaults). The API key is not
        recorded, so it comes back as None. Raises ConfigError on a value that does
        not make a config."""
        try:
            kw = _known(cls, obj, ("endpoint", "prompt", "schedule"))
            endpoint = obj.get("endpoint") or {}
            prompt = obj.get("prompt") or {}
            schedule = dict(obj.get("schedule") or {})
            if not all(isinstance(x, Mapping) for x in (endpoint, prompt, schedule)):
                raise TypeError("endpoint, prompt and schedule must be objects")
            kind = schedule.pop("kind", "concurrency")
            sched_type = _SCHEDULES.get(kind)
            if sched_type is None:
                raise ConfigError(f"unknown schedule kind {kind!r}")
            if "sim_args" in kw:
                kw["sim_args"] = tuple(kw["sim_args"])
            if kw.get("start_ratio") is not None:
                lo, hi = kw["start_ratio"]
                kw["start_ratio"] = (float(lo), float(hi))
            return cls(
                endpoint=EndpointConfig(
                    **_known(EndpointConfig, endpoint, ("api_key",))
                ),
                prompt=PromptConfig(**_known(PromptConfig, prompt, ())),
                schedule=sched_type(**_known(sched_type, schedule, ())),
                **kw,
            )
        except (TypeError, ValueError, ConfigError) as exc:
            raise ConfigError(f"recorded config: {exc}") from None

    def output_tokens(self, trace_output_tokens: int) -> int:
        """``max_tokens`` for a trace output length: scaled by ``output_scale``,
        capped at ``max_output_tokens``, at least 1."""
        n = max(1, round(trace_output_tokens * self.output_scale))
        cap = self.max_output_tokens
        return n if cap is None else min(n, cap)

    @property
    def gap_rule(self) -> GapRule:
        """The gap before each request: think and tool time scaled apart."""
        return GapRule(self.think_scale, self.think_cap_s, self.tool_scale)

    @property
    def phased(self) -> bool:
        """Whether the run has a warm-up phase before its measured window (primers
        or a cache-pressure warm-up); --duration then counts from its end."""
        return self.start_ratio is not None or self.cache_warmup_s > 0
