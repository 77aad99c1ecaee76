"""The typed parts of a run's summary (:class:`analysis.summary.Summary`); each
``as_dict()`` is its piece of the ``analyze --json`` contract (docs/metrics.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from replayer.records import ClientCheck, ModeInfo, SteadyRecord

# A field that the JSON leaves out when None (and has otherwise).
OMIT_NONE = {"omit_none": True}


def as_json(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses by their ``as_dict``, tuples as
    lists (NaN is left as NaN: the writers print null)."""
    if is_dataclass(value) and not isinstance(value, type):
        as_dict = getattr(value, "as_dict", None)
        return as_dict() if as_dict is not None else _fields_json(value)
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def _fields_json(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.metadata.get("omit_none"):
            continue
        out[f.name] = as_json(value)
    return out


class _Json:
    """``as_dict()``: the fields in order, :data:`OMIT_NONE` ones left out when None."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency(_Json):
    """A latency's figures (ms; or any other unit the field names): NaN when no
    row counts."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo(_Json):
    """Which run, and whether it ended on its own."""

    path: str
    name: str
    run_id: str | None
    model: str | None
    endpoint: str | None
    api: str | None
    simulated: bool | None  # None: a run without any metadata
    mode: ModeInfo | None
    labels: dict[str, Any] | None  # free-form run labels
    duration_s: float | None
    complete: bool  # ended on its own, having played what it was meant to
    incomplete_reason: str | None
    problems: tuple[str, ...] = ()
    # The engine model a virtual-time run replayed on ("sim" or an ENGINE.json);
    # None: a live run, measured.
    virtual: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts(_Json):
    """Rows by outcome (top-level keys of ``analyze --json``)."""

    requests: int
    ok: int
    errors: dict[str, int]  # status -> rows, every status but ok
    warmup: int
    measured_ok: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval(_Json):
    """A percentile's confidence interval per quantile: (low, high)."""

    p50: tuple[float, float]
    p90: tuple[float, float]
    p99: tuple[float, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyFigure(_Json):
    """A latency over the steady-state window, with CIs."""

    p50: float
    p90: float
    p99: float
    count: int
    ci: Interval


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates(_Json):
    """Token rates, tok/s."""

    input: float
    output: float
    total: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyThroughput(_Json):
    """Throughput over the steady-state window, tok/s (requests: req/s)."""

    input: float
    output: float
    total: float
    requests: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyState(_Json):
    """The steady-state window and the figures over it (``analysis.steady``)."""

    window: SteadyRecord
    requests: int
    confidence: float
    ttft_ms: SteadyFigure
    queued_ttft_ms: SteadyFigure
    tpot_ms: SteadyFigure
    e2e_ms: SteadyFigure
    queued_e2e_ms: SteadyFigure
    throughput_tok_s: SteadyThroughput


@dataclass(frozen=True, slots=True, kw_only=True)
class Interactivity(_Json):
    """Tokens per second per user: 1000 / TPOT (p90: the slow end)."""

    p50: float
    p90: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput(_Json):
    """Token throughput over the measured window (``metrics.throughput_tok_s``)."""

    input: float
    output: float
    total: float
    requests: float  # req/s
    window_s: float
    per_gpu: Rates | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchLag(_Json):
    """How late the replayer sent requests, ms."""

    mean: float
    p50: float
    p99: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LruEstimate:
    """The LRU hit-rate estimate at a KV capacity."""

    hit_rate: float
    capacity_tokens: int
    host_capacity_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRates:
    """Prefix-cache hit rates in [0, 1] (NaN: unavailable)."""

    server: float
    ideal: float
    prometheus: float
    provider: float | None = None  # an imported agent log's own provider
    lru: LruEstimate | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "server": self.server,
            "ideal": self.ideal,
            "prometheus": self.prometheus,
        }
        if self.provider is not None:
            out["provider"] = self.provider
        if self.lru is not None:
            out["lru"] = self.lru.hit_rate
            out["lru_capacity_tokens"] = self.lru.capacity_tokens
            out["lru_host_capacity_tokens"] = self.lru.host_capacity_tokens
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheMisses(_Json):
    """Requests that missed their ideal hit, and the TTFT they explain
    (``analysis.cache.miss_impact``)."""

    tolerance_tokens: int
    requests_reporting: int
    requests_with_miss: int | None
    missed_tokens: float | None
    ttft_p90_ms: float
    ttft_p90_ms_full_hit: float
    ttft_p90_ms_with_miss: float
    slow_with_miss_fraction: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionTrees(_Json):
    """Session trees: wall time, critical path, time parents waited on joins."""

    trees: int
    measured_trees: int
    wall_ms: Latency
    critical_path_ttft_ms: Latency
    join_wait_ms: Latency
    join_wait_share: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PositionRow(_Json):
    """One turn bucket or subagent depth (``analysis.depth``)."""

    group: str
    requests: int
    ttft_ms_p50: float
    ttft_ms_p90: float
    e2e_ms_p50: float
    e2e_ms_p90: float
    prompt_tokens_mean: float
    hit_rate_server: float
    hit_rate_ideal: float
    hit_rate_lru: float | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput(_Json):
    """Requests meeting every objective (``metrics.goodput``)."""

    slo: dict[str, float]  # objective -> target, ms (Slo.as_dict)
    requests: int
    attempted: int
    fraction: float
    requests_s: float
    output_tok_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunClientCheck:
    """run.json's self-check with the connection waits of the rows (ms)."""

    recorded: ClientCheck | None
    pool_wait_ms: Latency
    slot_wait_ms: Latency
    connect_ms: Latency
    # Each wait's largest value (ms): the rows' when they have the column, else
    # the recorded self-check's; a figure with neither has no ``max`` key.
    maxima: dict[str, float] = field(default_factory=dict)

    @property
    def limited(self) -> bool | None:
        return None if self.recorded is None else self.recorded.limited

    @property
    def reasons(self) -> tuple[str, ...]:
        return () if self.recorded is None else self.recorded.reasons

    @property
    def server_notes(self) -> tuple[str, ...]:
        return () if self.recorded is None else self.recorded.server_notes

    def figure(self, name: str) -> dict[str, float]:
        """A recorded figure (``loop_lag_ms``, ``loop_cpu_share`` ...) by stat."""
        return {} if self.recorded is None else dict(getattr(self.recorded, name))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"limited": None, "reasons": [], "server_notes": []}
            if self.recorded is None
            else self.recorded.as_dict()
        )
        out.pop("workers", None)
        for name in ("pool_wait_ms", "slot_wait_ms", "connect_ms"):
            figures = getattr(self, name).as_dict()
            if name in self.maxima:
                figures["max"] = self.maxima[name]
            out[name] = figures
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidityWindow(_Json):
    """The AgentX measured window, s from the run's start."""

    start_s: float
    end_s: float
    length_s: float
    coverage: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Gates(_Json):
    """The figures the AgentX gates judged."""

    context_overflow_rate: float
    window_s: float
    metric_coverage: float
    error_rate: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveDrift(_Json):
    """How far --live-assistant prompts drifted from the trace's."""

    requests: int
    mean_tokens: float
    p90_abs_tokens: float
    share: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Validity:
    """The AgentX verdict (``analysis.validity``)."""

    valid: bool
    invalid_reasons: tuple[str, ...]
    window: ValidityWindow
    live_drift: LiveDrift | None
    gates: Gates
    block_ideal: float  # ideal hit counted in whole server blocks
