"""run.json: the typed run metadata (:class:`RunMeta` and its parts) and the
steady-state window recorded in it. See docs/run-directory.md."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, TypeAlias

import numpy.typing as npt
import pyarrow as pa

from replayer.config import ReplayConfig
from replayer.errors import ConfigError, ReplayerError
from replayer.records.engine_model import EngineModel
from replayer.records.rows import FAILED_STATUSES
from replayer.sim.config import SimConfig
from traces.stats import steady_span

# A JSON value as read from run.json: what a part holds whose keys this version does
# not define (another version's keys; the config object as it was recorded).
Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceInfo:
    """The trace a run replayed (``run.json`` ``trace``)."""

    path: str | None = None  # absolute path when the run started
    content_hash: str | None = None  # sha256 over the trace's files
    format: str | None = None  # weka, mooncake, native, store ...
    sessions: int | None = None  # session trees
    requests: int | None = None  # requests in the trace (subagents included)
    ideal_cache_hit_rate: float | None = None
    block_size: int | None = None  # tokens per hash block in the trace
    # Σ provider_cached_tokens / Σ input over the requests of an imported agent log
    # that carry it: what the agent's own provider reported served from cache.
    provider_cache_hit_rate: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeInfo:
    """How session trees were started (``run.json`` ``mode``)."""

    kind: str = "concurrency"  # concurrency | session_rate | timestamps
    concurrency: int | None = None
    session_rate: float | None = None  # session trees per second
    speedup: float | None = None  # trace time / replay time


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCounts:
    """Rows by outcome (``run.json`` ``counts``)."""

    requests: int = 0  # rows written: ok + failed + skipped + cancelled
    ok: int = 0
    failed: int = 0  # http_error + timeout + client_error
    skipped: int = 0  # never sent: the rest of a session after a failure
    cancelled: int = 0  # cut by Ctrl-C, SIGTERM or --drain cancel
    trace_requests: int = 0  # requests in the (sharded) trace
    http_error: int = 0
    timeout: int = 0
    client_error: int = 0
    not_streamed: int = 0  # ok rows whose server ignored "stream": true
    short_output: int = 0  # ok rows with fewer output tokens than max_tokens

    @property
    def error_rate(self) -> float | None:
        """failed / (ok + failed): requests sent that ended (None: none did)."""
        ended = self.ok + self.failed
        return self.failed / ended if ended else None

    @classmethod
    def of(
        cls,
        by_status: dict[str, int],
        *,
        trace_requests: int,
        not_streamed: int = 0,
        short_output: int = 0,
    ) -> RunCounts:
        """Counts from rows per status."""
        failed = sum(by_status.get(s, 0) for s in FAILED_STATUSES)
        return cls(
            not_streamed=not_streamed,
            short_output=short_output,
            requests=sum(by_status.values()),
            ok=by_status.get("ok", 0),
            failed=failed,
            skipped=by_status.get("skipped", 0),
            cancelled=by_status.get("cancelled", 0),
            trace_requests=trace_requests,
            **{s: by_status.get(s, 0) for s in FAILED_STATUSES},
        )

    @classmethod
    def of_table(cls, rows: pa.Table, *, trace_requests: int = 0) -> RunCounts:
        """Counts of rows read back from part files (RECORD_SCHEMA columns
        ``status``, ``error_type``, ``output_tokens``, ``requested_output_tokens``):
        those of a worker that died before it could write its own."""
        import pyarrow.compute as pc

        by_status = {
            str(v["values"]): int(v["counts"])
            for v in pc.value_counts(rows["status"]).to_pylist()
        }
        ok = rows.filter(pc.equal(rows["status"], "ok"))
        short = pc.less(
            pc.fill_null(ok["output_tokens"], 0), ok["requested_output_tokens"]
        )
        return cls.of(
            by_status,
            trace_requests=trace_requests,
            not_streamed=int(
                pc.sum(
                    pc.fill_null(pc.equal(ok["error_type"], "not_streamed"), False)
                ).as_py()
                or 0
            ),
            short_output=int(pc.sum(short).as_py() or 0),
        )

    def __add__(self, other: RunCounts) -> RunCounts:
        """Counts of two workers' shards together."""
        return RunCounts(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in fields(self)
            }
        )


STEADY_METHOD = (
    "MSER-5 on the requests in flight at the middle of each bin: head and tail "
    "cut jointly (the pair with the least MSER statistic, at most half the bins "
    "cut in all), then moved out to where the load first and last reaches the "
    "kept window's band (mean - 2 SD of its batches)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyWindow:
    """A run's steady-state window (``run.json`` ``steady_state``): the ramp-up and
    the drain tail cut off, by :data:`STEADY_METHOD` (see :func:`steady_window`).
    Times are run-relative ns."""

    start_ns: int  # window start (= run_start_ns when no ramp-up was found)
    end_ns: int  # window end (= run_end_ns when no drain tail was found)
    run_start_ns: int  # first request sent
    run_end_ns: int  # last request ended
    bins: int  # bins the span was cut into (0: too few requests, whole span kept)
    method: str = STEADY_METHOD

    @property
    def head_s(self) -> float:
        """Ramp-up cut off, s."""
        return (self.start_ns - self.run_start_ns) / 1e9

    @property
    def tail_s(self) -> float:
        """Drain tail cut off, s."""
        return (self.run_end_ns - self.end_ns) / 1e9

    def record(self) -> SteadyRecord:
        """The window in seconds, as run.json and the summaries say it."""
        return SteadyRecord(
            start_s=self.start_ns / 1e9,
            end_s=self.end_ns / 1e9,
            length_s=(self.end_ns - self.start_ns) / 1e9,
            head_excluded_s=self.head_s,
            tail_excluded_s=self.tail_s,
            bins=self.bins,
            method=self.method,
        )

    def as_dict(self) -> dict[str, Any]:
        return self.record().as_dict()


def steady_window(
    start_ns: npt.ArrayLike, end_ns: npt.ArrayLike
) -> SteadyWindow | None:
    """The steady-state window of requests sent at ``start_ns`` and ended at
    ``end_ns`` (run-relative; rows with either missing are ignored; None: none left),
    by :func:`traces.stats.steady_span` (its docstring says how)."""
    span = steady_span(start_ns, end_ns)
    if span is None:
        return None
    return SteadyWindow(
        start_ns=span.start,
        end_ns=span.end,
        run_start_ns=span.run_start,
        run_end_ns=span.run_end,
        bins=span.bins,
    )


def _known(cls: type, obj: Any) -> dict[str, Any]:
    """The keys of ``obj`` (a JSON object, else nothing) that name fields of ``cls``."""
    if not isinstance(obj, dict):
        return {}
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in obj.items() if k in names}


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list | tuple) else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyRecord:
    """The steady-state window as run.json and the summaries say it (seconds,
    run-relative; :meth:`SteadyWindow.record`)."""

    start_s: float
    end_s: float
    length_s: float
    head_excluded_s: float
    tail_excluded_s: float
    bins: int
    method: str = STEADY_METHOD

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> SteadyRecord | None:
        """None: not a window (another version's or a damaged file's)."""
        try:
            return cls(**_known(cls, obj))
        except TypeError:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecorderStats:
    """The recorder's account (``run.json`` ``recorder``)."""

    max_queue_depth: int = 0  # rows waiting to be written, at most
    flush_errors: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> RecorderStats:
        return cls(**_known(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class MaterializerStats:
    """The prompt materializer's block cache (``run.json`` ``materializer``)."""

    block_cache_hits: int = 0
    block_cache_misses: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> MaterializerStats:
        return cls(**_known(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeAccount:
    """The server-metrics scraper's account (``run.json`` ``server_metrics``)."""

    url: str | None = None  # the /metrics URL, credentials removed
    available: bool | None = None  # the server answered with metrics at least once
    scrapes: int = 0
    errors: int = 0
    unparsed: int = 0  # lines the Prometheus parser could not read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> ScrapeAccount:
        return cls(**_known(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCheck:
    """The client self-check's verdict (``run.json`` ``client_check``): did the
    replayer, not the server, limit the run? Percentile maps: p50/p90/p99/max."""

    limited: bool | None = None
    reasons: tuple[str, ...] = ()  # one plain sentence per limit crossed
    loop_lag_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max
    loop_cpu_share: dict[str, float] = field(default_factory=dict)  # p50, p90, max
    process_cpu_cores: dict[str, float] = field(default_factory=dict)  # p50, max
    # Getting a connection (p50, p99, max): both parts together, then each.
    pool_wait_ms: dict[str, float] = field(default_factory=dict)
    slot_wait_ms: dict[str, float] = field(default_factory=dict)
    connect_ms: dict[str, float] = field(default_factory=dict)
    dispatch_lag_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max
    limits: dict[str, float] = field(default_factory=dict)
    # What the server did that a reader could take for the client: one sentence
    # each (a server slow to accept connections). Never makes the run ``limited``.
    server_notes: tuple[str, ...] = ()
    # Merged over workers (--workers, --ray): each worker's own, by worker id.
    workers: dict[str, ClientCheck] | None = None

    def as_dict(self) -> dict[str, Any]:
        """run.json's form: one process's check ends with its server notes; a
        merged one says them beside its reasons and ends with its workers'."""
        d: dict[str, Any] = {"limited": self.limited, "reasons": list(self.reasons)}
        if self.workers is not None:
            d["server_notes"] = list(self.server_notes)
        for name in _CHECK_FIGURES:
            d[name] = dict(getattr(self, name))
        if self.workers is None:
            d["server_notes"] = list(self.server_notes)
        else:
            d["workers"] = {k: c.as_dict() for k, c in self.workers.items()}
        return d

    @classmethod
    def from_dict(cls, obj: Any) -> ClientCheck:
        kw = _known(cls, obj)
        for name in ("reasons", "server_notes"):
            kw[name] = _tuple(kw.get(name))
        for name in _CHECK_FIGURES:
            if not isinstance(kw.get(name, {}), dict):
                kw.pop(name)
        workers = kw.pop("workers", None)
        if isinstance(workers, dict):
            kw["workers"] = {str(k): cls.from_dict(c) for k, c in workers.items()}
        return cls(**kw)


_CHECK_FIGURES = (
    "loop_lag_ms",
    "loop_cpu_share",
    "process_cpu_cores",
    "pool_wait_ms",
    "slot_wait_ms",
    "connect_ms",
    "dispatch_lag_ms",
    "limits",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolOutcome:
    """What a run did with its protocol (written at its end)."""

    measure_start_ns: int = 0  # run-relative start of the measured window
    idle_skipped_s: float | None = None  # whole-system idle skipped (None: off)
    aborted: str | None = None  # why the run was aborted (--on-error abort-run)
    # Requests that echoed a --session-token-header (None: no such header; not
    # written then).
    session_tokens_echoed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolInfo:
    """The AgentX protocol's resolved settings (``run.json`` ``protocol``) and, once
    the run ended, what it did with them."""

    profile: str | None = None
    start_ratio: tuple[float, float] | None = None
    cache_warmup_s: float = 0.0
    window_s: float | None = None
    idle_skip_s: float | None = None
    recycle: bool = False
    replay_markers: bool = True
    on_error: str = "skip-session"
    session_header: str | None = None
    session_id_scope: str = "tree"
    live_assistant: bool = False
    distinct_trees: int = 0
    duplication_factor: float | None = None
    outcome: ProtocolOutcome | None = None  # None: the run has not ended

    @property
    def aborted(self) -> str | None:
        return None if self.outcome is None else self.outcome.aborted

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.pop("outcome")
        if self.start_ratio is not None:
            d["start_ratio"] = list(self.start_ratio)
        if self.outcome is not None:
            d.update(asdict(self.outcome))
            if self.outcome.session_tokens_echoed is None:
                del d["session_tokens_echoed"]
        return d

    @classmethod
    def from_dict(cls, obj: Any) -> ProtocolInfo:
        kw = _known(cls, obj)
        kw.pop("outcome", None)
        ratio = kw.get("start_ratio")
        kw["start_ratio"] = (
            (ratio[0], ratio[1])
            if isinstance(ratio, list | tuple) and len(ratio) == 2
            else None
        )
        done = _known(ProtocolOutcome, obj)
        if done:
            kw["outcome"] = ProtocolOutcome(**done)
        return cls(**kw)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRecord:
    """The built-in simulator a run was replayed against (``run.json`` ``sim``): its
    command-line arguments and effective settings."""

    args: str = ""
    settings: SimConfig = field(default_factory=SimConfig)

    def as_dict(self) -> dict[str, Any]:
        return {"args": self.args, **_but_new_defaults(asdict(self.settings))}

    @classmethod
    def from_dict(cls, obj: Any) -> SimRecord:
        args = obj.get("args") if isinstance(obj, dict) else None
        try:
            settings = SimConfig(**_known(SimConfig, obj))
        except (TypeError, ValueError, ReplayerError):
            settings = SimConfig()
        return cls(args=args if isinstance(args, str) else "", settings=settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualRecord:
    """A replay in virtual time (``run.json`` ``virtual``): the engine model it ran
    on and, once it ended, what the engine did."""

    source: str  # "sim" or the ENGINE.json path given
    engine_model: EngineModel
    sim_args: str = ""
    engine: VirtualEngineStats | None = None  # None: the run has not ended

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "source": self.source,
            "engine_model": self.engine_model.as_dict(),
            "sim_args": self.sim_args,
        }
        if self.engine is not None:
            d.update(_but_new_defaults(asdict(self.engine)))
        return d

    @classmethod
    def from_dict(cls, obj: Any) -> VirtualRecord | None:
        """None: not a virtual record this version reads."""
        if not isinstance(obj, dict):
            return None
        try:
            model = EngineModel.from_dict(obj.get("engine_model"))
        except ReplayerError:
            return None
        stats = _known(VirtualEngineStats, obj)
        return cls(
            source=str(obj.get("source")),
            engine_model=model,
            sim_args=str(obj.get("sim_args") or ""),
            engine=VirtualEngineStats(**stats) if stats else None,
        )


# Keys newer than the run.json files already written: left out at their default, so
# that a run.json read and written back is unchanged (a reader takes the default).
_NEW_AT_DEFAULT: dict[str, Any] = {
    "host_bytes_per_token": 0.0,
    "host_bandwidth_gbs": 0.0,
    "host_dialect": "vllm",
    "prefix_cache_host_hits_tokens": 0,
}


def _but_new_defaults(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in d.items()
        if k not in _NEW_AT_DEFAULT or v != _NEW_AT_DEFAULT[k]
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualEngineStats:
    """What the virtual engine did over a run."""

    wall_s: float = 0.0  # the replay's own wall time
    steps: int = 0
    busy_s: float = 0.0  # modeled time the engine was stepping
    preemptions: int = 0
    prefix_cache_queries_tokens: int = 0
    prefix_cache_hits_tokens: int = 0
    prefix_cache_host_hits_tokens: int = 0  # of the hits, loaded from the host tier


@dataclass(frozen=True, slots=True, kw_only=True)
class RayActor:
    """One Ray actor of a ``--ray`` run."""

    worker_id: int
    node_id: str
    ip: str
    clock_offset_ns: int  # the actor's clock minus the driver's
    rtt_ns: int  # the round trip that offset was measured over


@dataclass(frozen=True, slots=True, kw_only=True)
class RayLost:
    """An actor that did not finish, and its shard's session trees without all
    their rows."""

    worker_id: int
    status: str
    wrote_its_end: bool
    unfinished_sessions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RayInfo:
    """A ``--ray`` run's cluster (``run.json`` ``ray``)."""

    address: str | None = None
    actors: tuple[RayActor, ...] = ()
    lost: tuple[RayLost, ...] | None = None  # None: not yet known

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "address": self.address,
            "actors": [asdict(a) for a in self.actors],
        }
        if self.lost is not None:
            d["lost"] = [
                {**asdict(x), "unfinished_sessions": list(x.unfinished_sessions)}
                for x in self.lost
            ]
        return d

    @classmethod
    def from_dict(cls, obj: Any) -> RayInfo | None:
        if not isinstance(obj, dict):
            return None
        try:
            lost = obj.get("lost")
            return cls(
                address=obj.get("address"),
                actors=tuple(RayActor(**_known(RayActor, a)) for a in obj["actors"]),
                lost=None
                if lost is None
                else tuple(
                    RayLost(
                        **{
                            **_known(RayLost, x),
                            "unfinished_sessions": _tuple(x.get("unfinished_sessions")),
                        }
                    )
                    for x in lost
                ),
            )
        except (TypeError, KeyError, AttributeError):
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedConfig:
    """The effective config of a run (``run.json`` ``config``): the typed
    :class:`ReplayConfig` it ran with (less its API key) for readers, and the JSON
    object as recorded, which is what is written back (another version's keys kept).

    ``replay`` is None when the recorded object does not make a config (another
    version's, hand-edited).
    """

    replay: ReplayConfig | None = None
    api_key_set: bool = False  # an API key was sent (never the key itself)
    recorded: dict[str, Json] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, config: ReplayConfig) -> RecordedConfig:
        """The record of a config about to run."""
        api_key_set = config.endpoint.api_key is not None
        d = config.as_metadata()
        d["endpoint"]["api_key_set"] = api_key_set
        return cls(replay=config, api_key_set=api_key_set, recorded=d)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RecordedConfig:
        """Read back what :meth:`as_dict` wrote (or another version did)."""
        if not obj:
            return cls()
        try:
            replay = ReplayConfig.from_metadata(obj)
        except ConfigError:
            replay = None
        endpoint = obj.get("endpoint")
        key_set = isinstance(endpoint, dict) and bool(endpoint.get("api_key_set"))
        return cls(replay=replay, api_key_set=key_set, recorded=copy.deepcopy(obj))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: as recorded."""
        return copy.deepcopy(self.recorded)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeta:
    """``run.json``, and the same JSON in every part file's metadata.

    Written by the engine at the start of a run and again at its end (the end fields
    are None in between, so a crashed run shows as incomplete); read back as a type by
    ``analysis``. Never holds an API key or URL credentials. Keys a newer version
    wrote and this one does not know are kept in ``extra``.
    """

    run_id: str = ""
    tool: str = "agentic-trace-replayer"
    tool_version: str = ""
    python: str = ""
    trace: TraceInfo = field(default_factory=TraceInfo)
    endpoint: str | None = None  # base URL, credentials removed
    model: str | None = None
    api: str | None = None  # completions | chat
    mode: ModeInfo = field(default_factory=ModeInfo)
    warmup_s: float = 0.0
    duration_limit_s: float | None = None
    labels: dict[str, Any] = field(default_factory=dict)  # engine, tp, gpus ...
    seed: int = 0
    salt: str = ""
    block_tokens: int | None = None  # tokens per materialized block (None: trace's)
    worker_id: int | None = 0  # None in the merged run.json of a --workers run
    workers: int = 1
    # The effective config (a --config file's keys).
    config: RecordedConfig = field(default_factory=RecordedConfig)
    simulated: bool = False  # replayed against the built-in simulated endpoint
    sim: SimRecord | None = None  # its settings when simulated
    start_unix_ns: int | None = None  # wall clock at run-relative 0
    # Run-relative time this process finished preparing (reading the trace, ideal
    # hits, the model check): negative, or the shared zero did not hold.
    ready_ns: int | None = None
    measure_start_ns: int = 0  # run-relative end of warm-up
    end_unix_ns: int | None = None  # None: the run has not finished (or crashed)
    duration_s: float | None = None
    interrupted: bool | None = None
    error: str | None = None  # why the run stopped early (a worker that died ...)
    warnings: list[str] = field(default_factory=list)  # said before the run started
    counts: RunCounts | None = None
    recorder: RecorderStats | None = None
    # The scraper's account (None: not scraped, or the run did not finish).
    server_metrics: ScrapeAccount | None = None
    materializer: MaterializerStats | None = None
    # The finished run's steady-state window (None: not finished, or no request
    # ended); ``analyze`` recomputes it from the rows by the same function.
    steady_state: SteadyRecord | None = None
    # The self-check (replayer.play.selfcheck): did the client limit the run?
    client_check: ClientCheck | None = None
    # The AgentX protocol's resolved settings and what the run did with them
    # (None: a run without any of it).
    protocol: ProtocolInfo | None = None
    # A replay in virtual time (``--virtual``).
    virtual: VirtualRecord | None = None
    ray: RayInfo | None = None  # a --ray run's cluster (written first in run.json)
    # Keys a newer version wrote that this one does not know (free-form).
    extra: dict[str, Json] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """False for a run that stopped without writing its end (a crash)."""
        return self.end_unix_ns is not None

    @property
    def incomplete_reason(self) -> str | None:
        """Why the run did not play what it was meant to, in a few words (None: it
        ended on its own): no end written, an error or an abort, Ctrl-C/SIGTERM."""
        if self.end_unix_ns is None:
            return "no end time: the run crashed or was killed"
        if self.error:
            return f"stopped by an error: {self.error}"
        aborted = None if self.protocol is None else self.protocol.aborted
        if aborted:
            return f"stopped: {aborted}"
        if self.interrupted:
            return "interrupted (Ctrl-C or SIGTERM)"
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; the keys are the run.json contract."""
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("extra", "ray"):
                continue
            if hasattr(value, "as_dict"):
                value = value.as_dict()
            elif is_dataclass(value) and not isinstance(value, type):
                value = asdict(value)
            else:
                value = copy.deepcopy(value)
            d[f.name] = value
        ray = {} if self.ray is None else {"ray": self.ray.as_dict()}
        return {**copy.deepcopy(self.extra), **ray, **d}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RunMeta:
        """Read run.json as written by this or another version (missing keys take
        their defaults; unknown keys go to ``extra``; nested values of the wrong
        type are dropped)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        kw: dict[str, Any] = {k: v for k, v in obj.items() if k in known}
        for name, sub in (
            ("trace", TraceInfo),
            ("mode", ModeInfo),
            ("counts", RunCounts),
        ):
            value = kw.get(name)
            if isinstance(value, dict):
                names = {f.name for f in fields(sub)}
                kw[name] = sub(**{k: v for k, v in value.items() if k in names})
            elif value is not None or name != "counts":
                kw.pop(name, None)
        if not isinstance(kw.get("labels", {}), dict):
            kw.pop("labels")
        for name, parse in _PARTS.items():
            value = kw.get(name)
            kw[name] = parse(value) if isinstance(value, dict) else None
        if kw["config"] is None:
            kw["config"] = RecordedConfig()
        kw["extra"] = {k: v for k, v in obj.items() if k not in known}
        return cls(**kw)


_PARTS: dict[str, Any] = {
    "config": RecordedConfig.from_dict,
    "sim": SimRecord.from_dict,
    "recorder": RecorderStats.from_dict,
    "server_metrics": ScrapeAccount.from_dict,
    "materializer": MaterializerStats.from_dict,
    "steady_state": SteadyRecord.from_dict,
    "client_check": ClientCheck.from_dict,
    "protocol": ProtocolInfo.from_dict,
    "virtual": VirtualRecord.from_dict,
    "ray": RayInfo.from_dict,
}
