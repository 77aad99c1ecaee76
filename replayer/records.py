"""The run-directory contract, shared by the engine (writes) and ``analysis`` (reads):

* ``requests/part-*.parquet``: one row per request, :class:`RequestRecord` /
  ``RECORD_SCHEMA`` (field name = column name), the run metadata under
  ``RUN_METADATA_KEY`` in each file's key-value metadata;
* ``server_metrics.parquet``: Prometheus samples, ``SERVER_METRICS_SCHEMA``;
* ``run.json``: :class:`RunMeta`.

Times are int64 nanoseconds on the perf counter, as offsets from the run's start
(``run.json`` holds the wall-clock anchor). A count the server did not report is null,
never 0. Import-light: pyarrow only, no aiohttp.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Status = Literal["ok", "http_error", "timeout", "client_error", "cancelled", "skipped"]
STATUSES: tuple[str, ...] = get_args(Status)


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """What happened to one trace request during a run."""

    run_id: str
    worker_id: int = 0
    session_id: str  # the (sub)session this request belongs to
    root_session_id: str  # the root of its session tree
    parent_session_id: str | None = None  # None for a root session
    agent_depth: int = 0  # 0 root, 1 subagent, 2 subagent of a subagent ...
    request_index: int  # position within its session
    scheduled_ns: int  # when the trace wanted it sent (run-relative)
    start_ns: int | None = None  # when its bytes were sent; None if never sent
    first_token_ns: int | None = None  # first chunk carrying content (or reasoning)
    end_ns: int | None = None  # last byte of the response / the failure
    ttft_ns: int | None = None  # first_token_ns - start_ns
    e2e_ns: int | None = None  # end_ns - start_ns
    tpot_ns: int | None = None  # see tpot_ns(); None if < 2 tokens or not ok
    chunk_times_ns: list[int] = field(
        default_factory=list
    )  # content chunk arrivals, from start_ns
    trace_input_tokens: int  # the trace's `in`
    prompt_tokens: int  # tokens we sent (after --block-tokens / --max-input-tokens)
    dropped_input_tokens: int = 0  # trimmed by --max-input-tokens
    server_prompt_tokens: int | None = None  # usage.prompt_tokens
    trace_output_tokens: int  # the trace's `out`
    requested_output_tokens: int  # max_tokens sent
    output_tokens: int | None = None  # received: usage.completion_tokens, else chunks
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    ideal_cached_tokens: int  # infinite-prefix-cache hit the trace allows (sent tokens)
    status: Status = "ok"
    http_status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    retries: int = 0  # connection attempts retried before any byte was sent
    # Getting a connection, = slot_wait_ns + connect_ns; None: not sent.
    pool_wait_ns: int | None = None
    # Its parts (None: not sent, or a client that does not measure them): queued
    # for a free slot under the client's own cap, and opening a new connection
    # (the server's accept: a slow-accepting server shows here, not above).
    slot_wait_ns: int | None = None
    connect_ns: int | None = None
    inflight_at_send: int = 0  # requests in flight (all workers' view of this one)
    lanes_at_send: int = 0  # live session trees when it was sent
    warmup: bool = False  # started inside the warm-up window
    primer: bool = False  # a max_tokens=1 request priming a mid-session start
    replay_index: int = 0  # which replay of its tree (the cache-bust marker's)
    # --live-assistant: prompt tokens sent minus those the recorded replies would
    # have taken (None: the history was the trace's).
    live_drift_tokens: int | None = None


RECORD_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("worker_id", pa.int32()),
        ("session_id", pa.string()),
        ("root_session_id", pa.string()),
        ("parent_session_id", pa.string()),
        ("agent_depth", pa.int32()),
        ("request_index", pa.int32()),
        ("scheduled_ns", pa.int64()),
        ("start_ns", pa.int64()),
        ("first_token_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("ttft_ns", pa.int64()),
        ("e2e_ns", pa.int64()),
        ("tpot_ns", pa.int64()),
        ("chunk_times_ns", pa.list_(pa.int64())),
        ("trace_input_tokens", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("dropped_input_tokens", pa.int64()),
        ("server_prompt_tokens", pa.int64()),
        ("trace_output_tokens", pa.int64()),
        ("requested_output_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("ideal_cached_tokens", pa.int64()),
        ("status", pa.string()),
        ("http_status", pa.int32()),
        ("error_type", pa.string()),
        ("error_message", pa.string()),
        ("retries", pa.int32()),
        ("pool_wait_ns", pa.int64()),
        ("slot_wait_ns", pa.int64()),
        ("connect_ns", pa.int64()),
        ("inflight_at_send", pa.int32()),
        ("lanes_at_send", pa.int32()),
        ("warmup", pa.bool_()),
        ("primer", pa.bool_()),
        ("replay_index", pa.int32()),
        ("live_drift_tokens", pa.int64()),
    ]
)

RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
FAILED_STATUSES = ("http_error", "timeout", "client_error")  # sent, and failed

SERVER_METRICS_SCHEMA = pa.schema(
    [
        ("scrape_ns", pa.int64()),  # run-relative perf-counter ns
        ("metric", pa.string()),  # sample name, e.g. vllm:prefix_cache_hits_total
        ("labels", pa.string()),  # JSON object
        ("value", pa.float64()),
    ]
)

RUN_METADATA_KEY = b"replayer.run"  # Parquet key-value metadata: RunMeta as JSON

# While a run goes on, scrapes land raw in ``server_metrics/raw-<worker>-<seq>.parquet``
# every flush interval (a kill -9 loses at most the last interval); the run's end
# parses them into ``server_metrics.parquet`` and removes the folder.
SERVER_METRICS_RAW_DIR = "server_metrics"
SERVER_METRICS_RAW_SCHEMA = pa.schema(
    [
        ("scrape_ns", pa.int64()),  # run-relative perf-counter ns
        ("body", pa.string()),  # the /metrics response, Prometheus text format
    ]
)


def parse_metrics(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels JSON, value) for every sample in a Prometheus text body.

    Raises:
        ValueError: not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = json.dumps(dict(sorted(sample.labels.items())))
            out.append((sample.name, labels, float(sample.value)))
    return out


def server_metrics_table(raw: pa.Table) -> tuple[pa.Table, int]:
    """Raw scrapes (SERVER_METRICS_RAW_SCHEMA) → samples (SERVER_METRICS_SCHEMA), and
    how many bodies could not be parsed."""
    stamps: list[int] = []
    names: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    bad = 0
    for now, body in zip(
        raw.column("scrape_ns").to_pylist(), raw.column("body").to_pylist(), strict=True
    ):
        try:
            samples = parse_metrics(body or "")
        except ValueError:
            bad += 1
            continue
        stamps.extend([now] * len(samples))
        for name, label, value in samples:
            names.append(name)
            labels.append(label)
            values.append(value)
    columns = (stamps, names, labels, values)
    arrays = [
        pa.array(c, type=f.type)
        for c, f in zip(columns, SERVER_METRICS_SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SERVER_METRICS_SCHEMA), bad


def tpot_ns(e2e_ns: int, ttft_ns: int, output_tokens: int) -> int:
    """Time per output token after the first: (E2E - TTFT) / (output_tokens - 1).

    The project's one TPOT definition (vLLM's, SGLang's and AIPerf's): the engine
    fills the ``tpot_ns`` column with it and analysis reads that column. Needs
    ``output_tokens >= 2``.
    """
    return (e2e_ns - ttft_ns) // (output_tokens - 1)


def records_to_table(records: list[RequestRecord]) -> pa.Table:
    """Rows → an Arrow table with RECORD_SCHEMA."""
    columns = {name: [getattr(r, name) for r in records] for name in RECORD_FIELDS}
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)


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
_MIN_STEADY_ROWS = 20


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "start_s": self.start_ns / 1e9,
            "end_s": self.end_ns / 1e9,
            "length_s": (self.end_ns - self.start_ns) / 1e9,
            "head_excluded_s": self.head_s,
            "tail_excluded_s": self.tail_s,
            "bins": self.bins,
            "method": self.method,
        }


def steady_window(
    start_ns: npt.ArrayLike, end_ns: npt.ArrayLike
) -> SteadyWindow | None:
    """The steady-state window of requests sent at ``start_ns`` and ended at
    ``end_ns`` (run-relative; rows with either missing are ignored; None: none left).

    The span from the first send to the last end is cut into bins (5 per 10
    requests, between 50 and 500, a multiple of 5), and the load is the number of
    requests in flight at each bin's middle: it climbs while lanes fill (or while a
    queue builds) and falls while the run drains. The head and the tail cut are
    chosen together (:func:`_mser_cuts`): MSER-5 over every (head, tail) pair that
    cuts at most half the bins, then each cut moved out to where the load first
    (last) reaches the steady level's band. One minimum over all pairs, no
    alternation: two one-sided cuts made in turn settled, on the README's Weka
    run, on the whole drain kept and 18 s of steady load dropped. Completions per
    bin, the other obvious signal, were tried and left out: being a count of
    random events, their noise drew MSER to spurious late cuts.
    Fewer than 20 requests: the whole span, ``bins`` 0.
    """
    s = np.asarray(start_ns, dtype=np.float64)
    e = np.asarray(end_ns, dtype=np.float64)
    keep = ~(np.isnan(s) | np.isnan(e))
    s, e = s[keep], e[keep]
    if s.size == 0:
        return None
    lo, hi = int(s.min()), int(e.max())
    if s.size < _MIN_STEADY_ROWS or hi <= lo:
        return SteadyWindow(
            start_ns=lo, end_ns=max(lo, hi), run_start_ns=lo, run_end_ns=hi, bins=0
        )
    nb = min(500, max(50, s.size // 10 * 5)) // 5 * 5
    edges = np.linspace(lo, hi, nb + 1)
    # Sent minus ended before each bin's middle: cumulative counts over bins that
    # end at the middles (uniform bins: histograms in O(n), no sort).
    w = (hi - lo) / nb
    span = (lo - w / 2, hi - w / 2)
    inflight = (
        np.cumsum(np.histogram(s, bins=nb, range=span)[0])
        - np.cumsum(np.histogram(e, bins=nb, range=span)[0])
    ).astype(np.float64)
    head, tail = _mser_cuts(inflight)
    return SteadyWindow(
        start_ns=int(edges[head]),
        end_ns=int(edges[nb - tail]),
        run_start_ns=lo,
        run_end_ns=hi,
        bins=nb,
    )


def _mser_cuts(y: npt.NDArray[np.float64], batch: int = 5) -> tuple[int, int]:
    """(head, tail): how many leading and trailing points of ``y`` to cut, jointly.

    ``y`` (a multiple of ``batch`` points long) is cut into means of ``batch``
    points Z_1..Z_k. For every head d and tail t with d + t ≤ k/2
    (MSER's customary bound, over both ends: more than half the run cut is not a
    transient but the run),

        MSER(d, t) = Σ_{d<j≤k-t} (Z_j - mean(Z_{d+1..k-t}))² / (k - d - t)²

    and the pair with the least statistic wins; among pairs within round-off of
    it, the one cutting least, then the one with the shorter head. Then each cut
    shrinks to the band step below. Fewer than two batches: nothing is cut.
    """
    k = y.size // batch
    if k < 2:
        return 0, 0
    z = y[: k * batch].reshape(k, batch).mean(axis=1)
    c1 = np.r_[0.0, np.cumsum(z)]
    c2 = np.r_[0.0, np.cumsum(z * z)]
    d, t = np.meshgrid(np.arange(k // 2 + 1), np.arange(k // 2 + 1), indexing="ij")
    ok = d + t <= k // 2
    d, t = d[ok], t[ok]
    hi = k - t
    m = hi - d
    s1 = c1[hi] - c1[d]
    sse = np.maximum(c2[hi] - c2[d] - s1 * s1 / m, 0.0)
    mser = sse / (m * m)
    # Round-off in the prefix sums makes equal MSERs (a flat series) differ in the
    # last bits: values within 1e-10 of the series' own scale tie.
    tol = 1e-10 * float(c2[-1]) / (k * k)
    tied = np.flatnonzero(mser <= float(mser.min()) + tol)
    best = tied[np.lexsort((d[tied], (d + t)[tied]))[0]]
    head, tail = int(d[best]), int(t[best])
    # MSER over-cuts a noisy plateau (dropping a stretch of it lowers the squared
    # deviations more than it costs in points), so its window only measures the
    # steady level: the ramp ends where the load first reaches that level's band
    # (mean - 2 standard deviations of the window's batches), the drain starts
    # after it last leaves it. Dips inside the run are load, not transients, and
    # so is load above the band (subagent bursts early in sessions): a ramp and a
    # drain lie below the steady level, and the MSER cut alone dropped such
    # bursts as a transient.
    kept = z[head : k - tail]
    inside = np.flatnonzero(z >= kept.mean() - 2 * kept.std())
    head = min(head, int(inside[0]))
    tail = min(tail, k - 1 - int(inside[-1]))
    return head * batch, tail * batch


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
    config: dict[str, Any] = field(default_factory=dict)  # the effective config
    simulated: bool = False  # replayed against the built-in simulated endpoint
    sim: dict[str, Any] | None = None  # its settings when simulated
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
    recorder: dict[str, Any] | None = None  # queue depth, flush errors
    # The scraper's account: {"url", "available", "scrapes", "errors"} (None: not
    # scraped, or the run did not finish).
    server_metrics: dict[str, Any] | None = None
    materializer: dict[str, Any] | None = None  # block cache statistics
    # SteadyWindow.as_dict() of the finished run (None: not finished, or no request
    # ended); ``analyze`` recomputes it from the rows by the same function.
    steady_state: dict[str, Any] | None = None
    # The self-check (replayer.selfcheck.ClientCheck): did the client limit the run?
    client_check: dict[str, Any] | None = None
    # The AgentX protocol's resolved settings and what the run did with them:
    # profile, start ratio, cache warm-up, window, idle skipped, duplication factor,
    # on-error policy, session header (None: a run without any of it).
    protocol: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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
        aborted = (self.protocol or {}).get("aborted")
        if aborted:
            return f"stopped: {aborted}"
        if self.interrupted:
            return "interrupted (Ctrl-C or SIGTERM)"
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; the keys are the run.json contract."""
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}

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
        for name in ("labels", "config"):
            if not isinstance(kw.get(name, {}), dict):
                kw.pop(name)
        kw["extra"] = {k: v for k, v in obj.items() if k not in known}
        return cls(**kw)
