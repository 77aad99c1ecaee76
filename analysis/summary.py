"""``summarize(run) -> Summary``: the headline figures of one run, the ``replayer
analyze --json`` contract. Pure: the run (and, for the LRU estimate, its trace) come in
as arguments. See docs/metrics.md."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from analysis import metrics as m
from analysis import steady, tiers
from analysis.cache import lru_cached_tokens, miss_impact, request_cache
from analysis.depth import by_turn_and_depth
from analysis.errors import AnalysisError
from analysis.heap import release_free_memory
from analysis.load import Run, block_tokens_of, part_batches, stored_values
from analysis.results import (
    CacheMisses,
    CacheRates,
    Counts,
    DispatchLag,
    Goodput,
    Interactivity,
    Latency,
    LruEstimate,
    PositionRow,
    RunClientCheck,
    RunInfo,
    SessionTrees,
    SteadyState,
    Throughput,
    Validity,
    as_json,
)
from analysis.sessions import session_trees
from analysis.steady import with_run_figures
from analysis.validity import block_ideal_hit_rate, verdict
from replayer.records import RunMeta
from traces.model import Trace

# The request columns :func:`summarize` reads from the frame (``analyze`` loads
# only these). ``chunk_times_ns`` may be left out: the ITL figures then read it
# from the run's part files a batch at a time (:data:`ITL_COLUMNS`).
COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            *m.NUMERIC_COLUMNS,
            *steady.COLUMNS,
            "session_id",  # session trees, LRU estimate
            "root_session_id",
            "parent_session_id",
            "http_status",  # context overflows (validity)
            "error_message",
            "pool_wait_ns",  # client check
            "slot_wait_ns",
            "connect_ns",
            "live_drift_tokens",
            *tiers.COLUMNS,  # per-tier hits (null in runs of servers that do not say)
        )
    )
)
ITL_COLUMNS = ("chunk_times_ns",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Headline figures of one run; :meth:`as_dict` is the ``analyze --json`` object.

    Latencies in ms (mean/p50/p90/p99/count), rates in tok/s, hit rates in [0, 1];
    NaN means "unavailable" and becomes null in JSON.
    """

    run: RunInfo
    counts: Counts
    ttft_ms: Latency
    tpot_ms: Latency
    itl_ms: Latency
    itl_spread_ms: Latency  # each read's wait spread over its chunks
    itl_coalesced_share: float  # share of chunk gaps that are 0 ns
    e2e_ms: Latency
    # From scheduled_ns (when the session wanted to send): client queueing included.
    queued_ttft_ms: Latency
    queued_e2e_ms: Latency
    # The steady-state window and percentiles with CIs over it (analysis.steady).
    steady_state: SteadyState | None
    interactivity_tok_s: Interactivity
    e2e_norm_interactivity_tok_s: float
    throughput_tok_s: Throughput
    dispatch_lag_ms: DispatchLag
    cache_hit_rate: CacheRates
    cache_misses: CacheMisses
    session_trees: SessionTrees
    by_turn: tuple[PositionRow, ...]  # per turn bucket: latency and hit rates
    by_depth: tuple[PositionRow, ...]  # per subagent depth: the same
    goodput: Goodput | None = None
    gpus: int | None = None
    # The client's self-check (run.json), with connection waits from the rows.
    # None: not recorded.
    client_check: RunClientCheck | None = None
    # The AgentX verdict (analysis.validity).
    validity: Validity | None = None
    # Hits per tier (GPU, host); None when neither rows nor counters split them.
    cache_tiers: tiers.TierRates | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN left as NaN; ``cli.echo_json`` prints null)."""
        out: dict[str, Any] = {
            "run": self.run.as_dict(),
            **self.counts.as_dict(),
        }
        for name in (
            "ttft_ms",
            "tpot_ms",
            "itl_ms",
            "itl_spread_ms",
            "itl_coalesced_share",
            "e2e_ms",
            "queued_ttft_ms",
            "queued_e2e_ms",
            "steady_state",
            "interactivity_tok_s",
            "e2e_norm_interactivity_tok_s",
            "throughput_tok_s",
            "dispatch_lag_ms",
            "cache_hit_rate",
            "cache_misses",
            "session_trees",
            "by_turn",
            "by_depth",
            "gpus",
        ):
            out[name] = as_json(getattr(self, name))
        if self.goodput is not None:
            out["goodput"] = self.goodput.as_dict()
        out["client_check"] = as_json(self.client_check)
        if self.cache_tiers is not None:
            out["cache_tiers"] = self.cache_tiers.as_dict()
        if self.validity is not None:
            out.update(agentx_figures(self))
        return out


def agentx_figures(s: Summary) -> dict[str, Any]:
    """The AgentX verdict and headline, over the measured window: ``valid``,
    ``invalid_reasons``, ``window`` and ``agentx`` (E2E-normalized interactivity,
    interactivity, throughput per GPU, theoretical vs server prefix hit, labels)."""
    assert s.validity is not None
    v = s.validity
    return {
        "valid": v.valid,
        "invalid_reasons": list(v.invalid_reasons),
        "window": v.window.as_dict(),
        "agentx": {
            "e2e_norm_interactivity_tok_s": s.e2e_norm_interactivity_tok_s,
            "interactivity_tok_s": s.interactivity_tok_s.as_dict(),
            "throughput_per_gpu_tok_s": as_json(s.throughput_tok_s.per_gpu),
            "prefix_hit": {
                "theoretical": s.cache_hit_rate.ideal,
                "theoretical_server_blocks": v.block_ideal,
                "server": s.cache_hit_rate.server,
            },
            "gates": v.gates.as_dict(),
            "live_drift": as_json(v.live_drift),
            "labels": as_json(s.run.labels),
        },
    }


def _run_info(run: Run) -> RunInfo:
    meta = run.meta
    # A run without any metadata says null, not RunMeta's defaults (no made-up mode).
    known = meta != RunMeta()
    return RunInfo(
        path=str(run.path),
        name=run.name,
        run_id=meta.run_id or None,
        model=meta.model,
        endpoint=meta.endpoint,
        api=meta.api,
        simulated=meta.simulated if known else None,
        mode=meta.mode if known else None,
        labels=dict(meta.labels) if known else None,
        duration_s=meta.duration_s,
        # Ended on its own, having played what it was meant to; else why not.
        complete=meta.incomplete_reason is None,
        incomplete_reason=meta.incomplete_reason,
        problems=tuple(run.problems),
        virtual=None if meta.virtual is None else meta.virtual.source,
    )


def _client_check(run: Run) -> RunClientCheck | None:
    """run.json's self-check verdict, with the connection waits of the rows (ms):
    ``pool_wait_ms`` (both parts), ``slot_wait_ms`` and ``connect_ms``."""
    recorded = run.meta.client_check
    df = run.requests

    def waits_ms(name: str) -> m.FloatArray:
        if name not in df.columns:
            return np.array([])
        raw = m.plain_column(df, name)  # cast inside the division: one array
        if raw is None:
            return m.column(df, name) / 1e6
        out: m.FloatArray = np.true_divide(raw, 1e6, dtype=np.float64)
        return out

    pool = waits_ms("pool_wait_ns")
    if recorded is None and not np.isfinite(pool).any():
        return None
    maxima: dict[str, float] = {}

    def described(name: str, values: m.FloatArray) -> Latency:
        figure = f"{name[:-3]}_ms"
        # fmax skips NaNs without a copy; before describe reorders the array.
        top = float(np.fmax.reduce(values)) if values.size else math.nan
        if math.isfinite(top):
            maxima[figure] = top
        elif recorded is not None and "max" in getattr(recorded, figure):
            maxima[figure] = float(getattr(recorded, figure)["max"])
        return m.describe(values, scratch=True)

    # One column's waits at a time (each is the caller's to spend).
    pool_ms = described("pool_wait_ns", pool)
    del pool
    slot_ms = described("slot_wait_ns", waits_ms("slot_wait_ns"))
    connect_ms = described("connect_ns", waits_ms("connect_ns"))
    return RunClientCheck(
        recorded=recorded,
        pool_wait_ms=pool_ms,
        slot_wait_ms=slot_ms,
        connect_ms=connect_ms,
        maxima=maxima,
    )


def _per_s(ms: float) -> float:
    return 1000.0 / ms if ms > 0 and math.isfinite(ms) else math.nan


def _gpus(run: Run, gpus: int | None) -> int | None:
    if gpus is not None:
        return gpus
    label = run.meta.labels.get("gpus")
    return int(label) if isinstance(label, int | float) and label > 0 else None


def _batch_itl(
    chunks: pa.ChunkedArray, keep: npt.NDArray[np.bool_]
) -> tuple[m.FloatArray, m.FloatArray]:
    """(ITL, spread ITL) of one batch's rows (their chunk column) where ``keep``."""
    return m.itl_and_spread(*m.kept_gaps(chunks, keep))


def _streamed_itl(run: Run, df: pd.DataFrame) -> tuple[m.FloatArray, m.FloatArray]:
    """(ITL, spread ITL) of ``run``'s rows, their chunk column read from its part
    files a batch at a time (the frame's latency population says which rows count)
    into buffers sized from the footers (untouched pages of the spare room take no
    memory), so no batch is held twice. The batches' gaps are found on the cores
    side by side (a few batches ahead), copied in in order.

    Raises:
        AnalysisError: the part files no longer hold the frame's rows.
    """
    keep = m.measured_ok(df)
    cap = stored_values(run, "chunk_times_ns")
    itl: m.FloatArray = np.empty(cap)
    spread: m.FloatArray | None = None  # until a batch has a 0 ns gap
    n_itl = n_spread = 0

    def take(one: m.FloatArray, two: m.FloatArray) -> None:
        nonlocal spread, n_itl, n_spread
        itl[n_itl : n_itl + one.size] = one
        if two is not one and spread is None:
            spread = np.empty(cap)
            spread[:n_itl] = itl[:n_itl]  # the batches before: the same
            n_spread = n_itl
        n_itl += one.size
        if spread is not None:
            spread[n_spread : n_spread + two.size] = two
            n_spread += two.size

    workers = min(2, _cores())
    at = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque[Future[tuple[m.FloatArray, m.FloatArray]]] = deque()
        for batch in _ahead(part_batches(run, ITL_COLUMNS)):
            rows = batch.num_rows
            if at + rows > keep.size:
                break
            chunks = batch.column("chunk_times_ns")
            pending.append(pool.submit(_batch_itl, chunks, keep[at : at + rows]))
            at += rows
            del batch, chunks
            if len(pending) > workers:
                take(*pending.popleft().result())
        while pending:
            take(*pending.popleft().result())
    if at != keep.size:
        raise AnalysisError(
            f"{run.path}: its part files no longer hold the rows it loaded "
            f"({at:,} read again of {keep.size:,})"
        )
    itl = itl[:n_itl]
    return itl, itl if spread is None else spread[:n_spread]


def _itl(run: Run, df: pd.DataFrame) -> tuple[Latency, Latency, float]:
    """ITL figures, spread ITL figures and the share of 0 ns gaps: from the frame's
    chunk column, or without one from the run's part files a batch at a time (the
    gaps are a row's own: the batches' gaps, one after the other, are the run's)."""
    if "chunk_times_ns" in df.columns:
        itl, spread = m.itl_and_spread_ms(df)
    elif run.parts:
        itl, spread = _streamed_itl(run, df)
    else:  # no chunk times to read (no part written, or none readable): no gaps
        itl = spread = np.zeros(0)
    coalesced = m.itl_coalesced_share(df, itl)
    if spread is itl:
        figures = m.describe(itl, scratch=True)
        return figures, figures, coalesced
    # Each array is reordered in place by its own describe: no memory to add.
    one, two = run_within(
        [(0, lambda: m.describe(itl, scratch=True)),
         (0, lambda: m.describe(spread, scratch=True))],
        budget=0,
    )  # fmt: skip
    return one, two, coalesced


def _ahead(items: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``items``, the next one read on a thread (Arrow decodes without the GIL)
    while the caller works on this one: one more batch held."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        coming = pool.submit(next, items, None)
        while (item := coming.result()) is not None:
            coming = pool.submit(next, items, None)
            yield item


def _trees(df: pd.DataFrame) -> SessionTrees:
    trees = session_trees(df)
    measured = trees[~trees["warmup"].astype(bool)] if not trees.empty else trees
    wall = measured["wall_ms"].to_numpy(dtype=float)
    join = measured["join_wait_ms"].to_numpy(dtype=float)
    total_wall = float(np.nansum(wall))
    return SessionTrees(
        trees=len(trees),
        measured_trees=len(measured),
        wall_ms=m.describe(wall),
        critical_path_ttft_ms=m.describe(
            measured["critical_path_ttft_ms"].to_numpy(dtype=float)
        ),
        join_wait_ms=m.describe(join),
        join_wait_share=float(np.nansum(join)) / total_wall
        if total_wall > 0
        else math.nan,
    )


def summarize(
    run: Run,
    *,
    gpus: int | None = None,
    slo: m.Slo | None = None,
    kv_capacity_tokens: int | None = None,
    host_capacity_tokens: int | None = None,
    trace: Trace | None = None,
    server_block_tokens: int | None = None,
) -> Summary:
    """The headline figures of ``run`` (see each metric's population in ``metrics``).

    ``gpus`` overrides run.json's ``labels.gpus`` for per-GPU throughput. With
    ``kv_capacity_tokens`` the LRU estimate needs ``trace`` (the replayed trace).
    ``server_block_tokens`` is the server's KV block size (default: what its
    ``vllm:cache_config_info`` says); a request misses its ideal hit only when it
    falls short by more than one server block, since servers cache whole blocks.

    Raises:
        AnalysisError: an LRU estimate was asked for without the trace.
    """
    df = m.numeric_view(run.requests)
    gpus = _gpus(run, gpus)
    lru = None
    estimate: LruEstimate | None = None
    block = block_tokens_of(run, trace)
    # Servers cache whole blocks of their own size: a shortfall within one of them
    # is rounding, not a miss. Unknown server block: the replay's.
    tolerance = (
        server_block_tokens or m.server_block_tokens(run.server_metrics) or block
    )
    if kv_capacity_tokens is not None:
        if trace is None:
            raise AnalysisError(
                f"{run.path}: the LRU estimate (--kv-capacity-tokens) needs the trace"
            )
        lru = lru_cached_tokens(
            df,
            trace,
            block_size=block,
            capacity_tokens=kv_capacity_tokens,
            host_capacity_tokens=host_capacity_tokens,
        )
        estimate = LruEstimate(
            hit_rate=m.lru_hit_rate(df, lru),
            capacity_tokens=kv_capacity_tokens,
            host_capacity_tokens=host_capacity_tokens,
        )
    rates = CacheRates(
        server=math.nan,  # below, with the other parts
        ideal=math.nan,
        prometheus=m.prometheus_hit_rate(run.server_metrics, run.meta.measure_start_ns),
        # An imported agent log: what its own provider served from cache, beside
        # what this server did with the same traffic.
        provider=run.meta.trace.provider_cache_hit_rate,
        lru=estimate,
    )
    # The parts, two at a time on two cores (numpy and Arrow let go of the GIL
    # in their passes), as long as the working memory of those running fits
    # WORKING_BYTES a row beside the frame; each part's own is PART_BYTES.
    seed = run.meta.seed
    parts: dict[str, Callable[[], Any]] = {
        "itl": lambda: _itl(run, df),
        "depth": lambda: by_turn_and_depth(df, lru),
        "trees": lambda: _trees(df),
        # The steady state, the five latencies and the throughput: one part, as
        # the steady window's arrays are the run's when it holds every row.
        "latency": lambda: with_run_figures(df, seed=seed, gpus=gpus),
        "client": lambda: _client_check(run),
        "misses": lambda: miss_impact(
            request_cache(
                df,
                lru,
                reporting_only=True,
                columns=("ttft_ms", "cached_tokens", "missed_tokens"),
            ),
            tolerance_tokens=tolerance,
        ),
        "validity": lambda: verdict(df, run.meta, block_ideal=math.nan),
        "block_ideal": lambda: block_ideal_hit_rate(df, tolerance),
        "server_hit": lambda: m.server_hit_rate(df),
        "ideal_hit": lambda: m.ideal_hit_rate(df),
        "e2e_norm": lambda: m.e2e_norm_interactivity_tok_s(df),
        "lag": lambda: _lag(df),
        "counts": lambda: m.counts(df),
        "tiers": lambda: tiers.tier_rates(
            df, run.server_metrics, since_ns=run.meta.measure_start_ns, lru=lru
        ),
    }
    for name in _RELEASING:
        parts[name] = _releasing(parts[name])
    rows = len(df)
    # In PART_BYTES' order: the large parts first, each with room beside it.
    done = dict(
        zip(
            PART_BYTES,
            run_within(
                [(PART_BYTES[name] * rows, parts[name]) for name in PART_BYTES],
                budget=WORKING_BYTES * rows,
            ),
            strict=True,
        )
    )
    itl_figures, spread_figures, coalesced = done["itl"]
    turn, depth = done["depth"]
    steady_figures, latency, throughput = done["latency"]
    tpot = latency["tpot_ms"]
    validity = done["validity"]
    return Summary(
        run=_run_info(run),
        counts=done["counts"],
        ttft_ms=latency["ttft_ms"],
        tpot_ms=tpot,
        itl_ms=itl_figures,
        itl_spread_ms=spread_figures,
        itl_coalesced_share=coalesced,
        e2e_ms=latency["e2e_ms"],
        queued_ttft_ms=latency["queued_ttft_ms"],
        queued_e2e_ms=latency["queued_e2e_ms"],
        steady_state=steady_figures,
        # = m.interactivity_tok_s(df), from the TPOT percentiles already computed.
        interactivity_tok_s=Interactivity(p50=_per_s(tpot.p50), p90=_per_s(tpot.p90)),
        e2e_norm_interactivity_tok_s=done["e2e_norm"],
        throughput_tok_s=throughput,
        dispatch_lag_ms=done["lag"],
        cache_hit_rate=dataclasses.replace(
            rates, server=done["server_hit"], ideal=done["ideal_hit"]
        ),
        cache_misses=done["misses"],
        session_trees=done["trees"],
        by_turn=turn,
        by_depth=depth,
        goodput=m.goodput(df, slo) if slo is not None else None,
        gpus=gpus,
        client_check=done["client"],
        validity=dataclasses.replace(validity, block_ideal=done["block_ideal"]),
        cache_tiers=done["tiers"],
    )


# The parts whose room, once freed, is given back to the OS: the heap keeps
# freed memory for reuse (analysis.heap). The ITL part frees the most at once,
# just before two parts start side by side. Not the trees part: the depth part
# after it reuses its room (at 10M bench rows, summarize 4.58 s against 4.88 s
# with both released, peak RSS 1,802 against 1,820 MiB; medians of 9 runs each,
# alternated).
_RELEASING = ("itl",)


def _releasing(part: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return part()
        finally:
            release_free_memory()

    return run


def _lag(df: pd.DataFrame) -> DispatchLag:
    lag = m.dispatch_lag_ms(df)
    p50, p99 = m.percentiles(lag, [50, 99])
    return DispatchLag(
        mean=float(lag.mean()) if lag.size else math.nan, p50=p50, p99=p99
    )


# Peak working memory of each part of :func:`summarize` beside the frame, bytes a
# row (tracemalloc at 10M bench rows, rounded up), and what the parts running at
# once may hold together: with the ~105-byte-a-row compact frame and the
# interpreter, about 2 GiB at 10M rows.
PART_BYTES = {
    "itl": 72,  # = WORKING_BYTES: alone (its two describes run side by side)
    "trees": 36,  # beside the latency part or a smaller one
    "depth": 44,  # beside the parts up to 28
    "latency": 25,
    "misses": 34,
    "validity": 26,
    "block_ideal": 24,
    "server_hit": 25,
    "ideal_hit": 17,
    "client": 11,
    "e2e_norm": 16,
    "lag": 10,
    "counts": 9,
    "tiers": 48,  # nothing read when no row and no counter splits the hits
}
WORKING_BYTES = 72


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def run_within(
    jobs: Sequence[tuple[float, Callable[[], Any]]],
    *,
    budget: float,
    workers: int | None = None,
) -> list[Any]:
    """Each job's result, in order: ``jobs`` are (working memory, function), run
    on up to ``workers`` threads (default: two, or one on one core). A job starts
    only when its memory and that of the jobs running fit ``budget`` (alone it
    always runs); of those waiting, the first that fits goes next. The first
    error is raised once the jobs running have ended; no job starts after it."""
    workers = workers or min(2, _cores())
    results: list[Any] = [None] * len(jobs)
    waiting = list(range(len(jobs)))
    errors: list[BaseException] = []
    running = [0, 0.0]  # jobs, their memory
    turn = threading.Condition()

    def work() -> None:
        while True:
            with turn:
                while True:
                    if errors or not waiting:
                        return
                    pick = next(
                        (i for i in waiting
                         if not running[0] or running[1] + jobs[i][0] <= budget),
                        None,
                    )  # fmt: skip
                    if pick is not None:
                        break
                    turn.wait()
                waiting.remove(pick)
                running[0] += 1
                running[1] += jobs[pick][0]
            try:
                results[pick] = jobs[pick][1]()
            except BaseException as exc:  # raised below, once the others end
                with turn:
                    errors.append(exc)
            finally:
                with turn:
                    running[0] -= 1
                    running[1] -= jobs[pick][0]
                    turn.notify_all()

    helpers = [threading.Thread(target=work) for _ in range(workers - 1)]
    for t in helpers:
        t.start()
    try:
        work()
    except BaseException as exc:  # Ctrl-C while waiting: the helpers stop too
        with turn:
            errors.append(exc)
            turn.notify_all()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]
    return results
