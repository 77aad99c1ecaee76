"""run.json: the typed run metadata (:class:`RunMeta` and its parts) and the
steady-state window recorded in it. See docs/run-directory.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replayer.records.rows import FAILED_STATUSES


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
    # The self-check (replayer.play.selfcheck.ClientCheck): did the client limit
    # the run?
    client_check: dict[str, Any] | None = None
    # The AgentX protocol's resolved settings and what the run did with them:
    # profile, start ratio, cache warm-up, window, idle skipped, duplication factor,
    # on-error policy, session header (None: a run without any of it).
    protocol: dict[str, Any] | None = None
    # A replay in virtual time (``--virtual``): the engine model it ran on (its
    # source and terms) and what the engine did (steps, preemptions, wall time).
    virtual: dict[str, Any] | None = None
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
