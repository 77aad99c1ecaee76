"""Run configuration: frozen dataclasses built once (by the CLI or a test) and passed
down. No global settings; the library never reads the environment."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from replayer.errors import ConfigError
from traces.materialize import Api, PromptConfig

Mode = Literal["concurrency", "session_rate", "timestamps"]
Arrival = Literal["poisson", "gamma"]
Drain = Literal["finish", "cancel"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """Where and how to talk to the server.

    EndpointConfig(base_url="http://127.0.0.1:8000", model="Qwen/Qwen3-8B")
    """

    base_url: str
    model: str
    api: Api = "completions"
    api_key: str | None = field(default=None, repr=False)  # never stored or printed
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # max gap between SSE chunks, not total request time
    total_timeout_s: float | None = None  # None: long generations are never cut
    vllm_extras: bool = True  # send ignore_eos/min_tokens (some servers reject them)
    keepalive: bool = True  # reuse connections (off: one connection per request)
    include_usage: bool = True  # stream_options.include_usage

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"endpoint must be an http(s) URL (got {self.base_url!r})"
            )
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("timeouts must be > 0 seconds")
        if self.total_timeout_s is not None and self.total_timeout_s <= 0:
            raise ConfigError(f"total timeout must be > 0 (got {self.total_timeout_s})")

    def url(self) -> str:
        """The POST URL for the chosen API."""
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + ("/chat/completions" if self.api == "chat" else "/completions")

    def as_metadata(self) -> dict[str, Any]:
        """JSON-ready, without the API key."""
        d = {k: v for k, v in asdict(self).items() if k != "api_key"}
        d["api_key_set"] = self.api_key is not None
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    """How a trace is replayed.

    ReplayConfig(endpoint=..., mode="concurrency", concurrency=8, think_scale=0.0)
    """

    endpoint: EndpointConfig
    prompt: PromptConfig = field(default_factory=PromptConfig)
    mode: Mode = "concurrency"
    concurrency: int = 1  # live session trees (concurrency mode)
    session_rate: float | None = None  # session trees per second (session_rate mode)
    arrival: Arrival = "poisson"
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson
    speedup: float = 1.0  # trace time / replay time (timestamps mode)
    think_scale: float = 1.0  # multiplies the trace's think gaps
    think_cap_s: float | None = None  # caps each (scaled) think gap
    warmup_s: float = 0.0  # rows started before this are flagged warmup
    duration_s: float | None = None  # stop starting work after this
    drain: Drain = "finish"  # at duration end: finish or cancel in-flight requests
    loop: bool = False  # start the trace over when exhausted (until duration_s)
    seed: int = 0  # arrivals and anything random
    flush_interval_s: float = 2.0  # Parquet part files at least this often
    scrape_interval_s: float = 1.0  # server /metrics; 0 disables
    max_inflight: int | None = None  # cap on requests in flight (None: no cap)
    labels: dict[str, Any] = field(default_factory=dict)  # engine, tp, gpus ...
    worker_id: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1 (got {self.concurrency})")
        if self.mode == "session_rate" and not (self.session_rate or 0) > 0:
            raise ConfigError("session rate must be > 0 sessions/s")
        if self.burstiness <= 0:
            raise ConfigError(f"burstiness must be > 0 (got {self.burstiness})")
        if self.speedup <= 0:
            raise ConfigError(f"speedup must be > 0 (got {self.speedup})")
        if self.think_scale < 0:
            raise ConfigError(f"think scale must be >= 0 (got {self.think_scale})")
        if self.think_cap_s is not None and self.think_cap_s < 0:
            raise ConfigError(f"think cap must be >= 0 s (got {self.think_cap_s})")
        if self.warmup_s < 0:
            raise ConfigError(f"warm-up must be >= 0 s (got {self.warmup_s})")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"duration must be > 0 s (got {self.duration_s})")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ConfigError(f"max in-flight must be >= 1 (got {self.max_inflight})")
        if self.loop and self.duration_s is None:
            raise ConfigError("--loop needs --duration (it would never end)")

    def as_metadata(self) -> dict[str, Any]:
        """The effective config, JSON-ready, without secrets."""
        d = {k: v for k, v in asdict(self).items() if k not in ("endpoint", "prompt")}
        d["endpoint"] = self.endpoint.as_metadata()
        d["prompt"] = asdict(self.prompt)
        return d
