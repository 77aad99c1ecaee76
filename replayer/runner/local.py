"""One process's replay (:func:`replay_trace`): everything slow before the start gate,
then the schedule with the scraper, the self-check and the status line beside it.
See docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TextIO, TypeVar

from replayer import __version__
from replayer.clock import Clock, MonotonicClock, wall_clock_ns
from replayer.config import (
    AgentNative,
    Lanes,
    RateArrivals,
    ReplayConfig,
    Schedule,
    TraceTimestamps,
    public_url,
    schedule_kind,
)
from replayer.errors import ConfigError, EndpointError, RecorderError
from replayer.play.agentx import check_duplication, protocol_meta
from replayer.play.client import ChatClient, Client, ServerWatch
from replayer.play.phase import IdleSkip, stop_control
from replayer.play.progress import Progress, ReplayOutcome, RunCounters, replay_outcome
from replayer.play.recorder import ParquetRecorder
from replayer.play.schedule import first_prompts, run_schedule, shard
from replayer.play.scrape import MetricsScraper
from replayer.play.selfcheck import LoopMonitor
from replayer.play.session import PromptBuilder, RunContext, request_body
from replayer.play.template import TemplateCost
from replayer.records import ModeInfo, RecordedConfig, RunMeta
from replayer.records.meta import (
    MaterializerStats,
    ProtocolInfo,
    ProtocolOutcome,
    RecorderStats,
)
from replayer.records.rundir import (
    new_run_id,
    write_run_json,
)
from traces.materialize import Materializer, largest_prompt
from traces.model import Trace
from traces.stats import ideal_hit_tokens
from traces.table import request_column, request_extras

T = TypeVar("T")
StartGate = Callable[[], Awaitable[int]]  # returns the shared zero (perf-counter ns)


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run`` with SIGTERM treated like Ctrl-C: the run is cancelled, every
    ``finally`` flushes, and KeyboardInterrupt comes out either way."""
    terms: list[int] = []

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            terms.append(signal.SIGTERM)
            # One stop: the parent-death signal comes again as each of a dead
            # parent's threads exits, and a second cancel would cut the flush short.
            if task is not None and len(terms) == 1:
                task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        return await factory()

    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    if terms:
        # The signal came as the work ended (its handler ran once the task was
        # done, while the loop shut down): cancelling did nothing, yet it still
        # asks the process to stop, not to report success.
        raise KeyboardInterrupt
    return result


def provider_cache_hit_rate(trace: Trace) -> float | None:
    """Σ ``provider_cached_tokens`` / Σ input over the requests that carry it (an
    imported agent log's own cache accounting); None when none does."""
    cached = total = 0
    for session, _ in trace.all_sessions():
        inputs = request_column(session.requests, "input_tokens")
        for i, extra in request_extras(session.requests):
            value = extra.get("provider_cached_tokens")
            if isinstance(value, int) and not isinstance(value, bool):
                cached += value
                total += int(inputs[i])
    return cached / total if total else None


def available_memory_bytes() -> int | None:
    """Memory this machine can still give (Linux MemAvailable, else its physical
    memory); None when neither is known."""
    try:
        with Path("/proc/meminfo").open(encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def check_prompt_memory(trace: Trace, config: ReplayConfig) -> None:
    """The largest prompt must be buildable in half the memory available: a
    ``--block-tokens`` far above the trace's block size multiplies every prompt."""
    big = largest_prompt(trace, config.prompt)
    room = available_memory_bytes()
    if big is None or room is None or big.peak_bytes <= room // 2:
        return
    gib = 1 << 30
    raise ConfigError(
        f"session {big.session_id} request {big.request_index}: its prompt would be "
        f"{big.tokens:,} tokens ({big.block_tokens:,} per block), ~"
        f"{big.peak_bytes / gib:,.1f} GiB to build, more than half the memory "
        f"available ({room / gib:,.1f} GiB); lower --block-tokens or cap prompts "
        "with --max-input-tokens"
    )


def mode_info(schedule: Schedule) -> ModeInfo:
    """run.json ``mode`` of a schedule."""
    return ModeInfo(
        kind=schedule_kind(schedule),
        concurrency=schedule.concurrency if isinstance(schedule, Lanes) else None,
        session_rate=schedule.session_rate
        if isinstance(schedule, RateArrivals)
        else None,
        speedup=schedule.speedup if isinstance(schedule, TraceTimestamps) else None,
    )


def _run_meta(
    template: RunMeta, trace: Trace, config: ReplayConfig, ideal_rate: float | None
) -> RunMeta:
    block_sizes = sorted({s.block_size for s, _ in trace.all_sessions()})
    return replace(
        template,
        trace=replace(
            template.trace,
            format=trace.source_format,
            sessions=len(trace.sessions),
            requests=trace.request_count(),
            ideal_cache_hit_rate=ideal_rate,
            block_size=block_sizes[0] if block_sizes else None,
            provider_cache_hit_rate=provider_cache_hit_rate(trace),
        ),
        endpoint=public_url(config.endpoint.base_url),
        model=config.endpoint.model,
        api=config.endpoint.api,
        mode=mode_info(config.schedule),
        warmup_s=config.warmup_s,
        duration_limit_s=config.duration_s,
        labels=dict(config.labels),
        seed=config.seed,
        salt=config.prompt.salt,
        block_tokens=config.prompt.block_tokens,
        workers=config.workers,
        config=RecordedConfig.of(config),
    )


async def replay_trace(
    trace: Trace,
    config: ReplayConfig,
    run_dir: Path,
    *,
    meta: RunMeta | None = None,
    worker_id: int = 0,
    clock: Clock | None = None,
    progress: TextIO | None = None,
    start_gate: StartGate | None = None,
    run_json_name: str = "run.json",
    client: ChatClient | None = None,
    counters: RunCounters | None = None,
    virtual: bool = False,
) -> ReplayOutcome:
    """One process's replay of ``trace`` (its shard of it, for worker ``worker_id``
    of ``config.workers``) into ``run_dir``. ``config.endpoint`` must name a URL and
    a model (:func:`running_endpoint` does that). ``start_gate`` returns the shared
    zero once every worker is ready (default: now). ``client`` replaces the HTTP
    client (then nothing is scraped). ``counters``: the run's counters, for a caller
    that reports them while it runs (a Ray actor). ``virtual``: the clock is a
    virtual-time loop's, where the client self-check has nothing to measure."""
    clock = clock or MonotonicClock()
    meta = meta or RunMeta(run_id=new_run_id(), tool_version=__version__)
    # Before t0: everything slow. The ideal hit is a property of the whole trace.
    per_session = await asyncio.to_thread(ideal_hit_tokens, trace)
    ideal = {s.session_id: hits for s, hits in per_session}
    hits = sum(int(h.sum()) for _, h in per_session)
    total_in = sum(
        int(request_column(s.requests, "input_tokens").sum()) for s, _ in per_session
    )
    meta = _run_meta(meta, trace, config, hits / total_in if total_in else None)
    check_duplication(trace, config)
    check_prompt_memory(trace, config)
    agent = native_agent(trace, config)
    meta = replace(meta, protocol=protocol_meta(trace, config))
    trace = shard(trace, worker_id, config.workers)
    trace_requests = trace.request_count()
    meta = replace(meta, worker_id=worker_id)
    materializer = Materializer(config.prompt)
    # In virtual time a thread buys nothing (the clock holds still while it runs)
    # and costs a hand-off of the interpreter each way: build every prompt inline.
    prompts = PromptBuilder(
        materializer,
        request_body(config.endpoint),
        inline_tokens=1 << 62 if virtual else 4096,
    )
    counters = counters if counters is not None else RunCounters()
    monitor = (
        None if virtual else LoopMonitor(clock, counters, warmup_s=config.warmup_s)
    )
    interrupted = False
    error: str | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            http: Client | None = None
            chat: ChatClient
            if client is None:
                limit = config.max_inflight or 10_000
                http = await stack.enter_async_context(
                    Client(config.endpoint, clock, limit=limit)
                )
                chat = http
            else:
                chat = client
            # The endpoint is checked before the run directory is made: a failed
            # start leaves nothing behind.
            await _check_model(chat, config)
            recorder = await stack.enter_async_context(
                ParquetRecorder(
                    run_dir,
                    worker_id=worker_id,
                    flush_interval_s=config.flush_interval_s,
                    metadata=meta,
                )
            )
            write_run_json(run_dir / run_json_name, meta)
            # The trace and everything loaded so far live to the end: out of the
            # cyclic collector's reach, a full collection no longer walks them all
            # (40 ms pauses of the loop with 30K requests in memory).
            gc.freeze()
            # The prompts sent the moment the run starts, built now: else the lanes'
            # first sends queue behind each other's builds.
            await prompts.prebuild(first_prompts(trace, config, worker_id))
            ready = clock.now_ns()
            t0 = await start_gate() if start_gate is not None else ready
            meta = replace(
                meta,
                ready_ns=ready - t0,
                start_unix_ns=wall_clock_ns() - (clock.now_ns() - t0),
                measure_start_ns=int(config.warmup_s * 1e9),
            )
            ctx = RunContext(
                config=config,
                clock=clock,
                client=chat,
                recorder=recorder,
                prompts=prompts,
                counters=counters,
                stop=stop_control(config, t0),
                run_id=meta.run_id,
                worker_id=worker_id,
                t0_ns=t0,
                ideal_tokens=ideal,
                admission=asyncio.Semaphore(config.max_inflight)
                if config.max_inflight
                else None,
                idle=None
                if config.idle_skip_s is None
                else IdleSkip(clock, int(config.idle_skip_s * 1e9)),
                watch=ServerWatch(silence_ns=int(config.endpoint.read_timeout_s * 1e9)),
                agent=agent,
                template=TemplateCost()
                if config.fit_context == "clamp"
                and config.max_model_len is not None
                and config.endpoint.api == "chat"
                else None,
            )
            await clock.sleep_until(t0)  # workers share a zero slightly in the future
            scraper = (
                MetricsScraper(
                    config.endpoint,
                    http.session,
                    clock,
                    t0,
                    run_dir=run_dir,
                    worker_id=worker_id,
                    flush_interval_s=config.flush_interval_s,
                )
                if http is not None and config.scrape_interval_s > 0
                else None
            )
            try:
                await _run(ctx, trace, scraper, progress, trace_requests, monitor)
            except asyncio.CancelledError:
                interrupted = True
                raise
            except Exception as exc:
                # A bug or a recorder that cannot write: the run says it did not end
                # well, whatever the traceback then says.
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                raise
            finally:
                end = clock.now_ns()
                meta = replace(
                    meta,
                    end_unix_ns=(meta.start_unix_ns or 0) + (end - t0),
                    duration_s=(end - t0) / 1e9,
                    interrupted=interrupted,
                    error=ctx.stop.error or error,
                    counts=counters.counts(trace_requests),
                    recorder=RecorderStats(
                        max_queue_depth=recorder.max_pending,
                        flush_errors=recorder.flush_errors,
                    ),
                    materializer=MaterializerStats(
                        block_cache_hits=materializer.hits,
                        block_cache_misses=materializer.misses,
                    ),
                    client_check=None if monitor is None else monitor.check(),
                )
                meta = _phases(ctx, meta)
                recorder.set_metadata(meta)
                # The counts first: the server's metrics take a while, and a second
                # stop meanwhile (SIGTERM again) must not cost the record its counts.
                write_run_json(run_dir / run_json_name, meta)
                if scraper is not None:
                    try:
                        # The server's metrics are a side dish: never worth rows.
                        with contextlib.suppress(RecorderError):
                            await asyncio.shield(scraper.flush())
                            await asyncio.shield(asyncio.to_thread(scraper.finish))
                    finally:
                        meta = replace(meta, server_metrics=scraper.account())
                        recorder.set_metadata(meta)
                        write_run_json(run_dir / run_json_name, meta)
    finally:
        gc.unfreeze()
        prompts.close()
    assert meta.counts is not None
    assert meta.duration_s is not None
    return replay_outcome(
        run_dir,
        run_id=meta.run_id,
        counts=meta.counts,
        duration_s=meta.duration_s,
        interrupted=interrupted,
        warnings=tuple(meta.warnings),
        client_check=meta.client_check,
        # Its own rows: in a run of several workers the others may still be
        # joining their parts (their driver sums every worker's at the end).
        worker_id=worker_id,
    )


def _phases(ctx: RunContext, meta: RunMeta) -> RunMeta:
    """``meta`` with what the run's phases came to: the window's real start (a
    warm-up phase ends when it ends), the idle skipped, an abort."""
    stop = ctx.stop
    if stop.measure_start_ns is None:  # stopped before the warm-up ended
        start = ctx.rel(ctx.clock.now_ns())
    else:
        start = max(ctx.rel(stop.measure_start_ns), meta.measure_start_ns)
    outcome = ProtocolOutcome(
        measure_start_ns=start,
        idle_skipped_s=None if ctx.idle is None else ctx.idle.skipped_ns / 1e9,
        aborted=stop.aborted,
        session_tokens_echoed=None
        if ctx.config.endpoint.session_token_header is None
        else ctx.counters.session_tokens_echoed,
    )
    protocol = replace(meta.protocol or ProtocolInfo(), outcome=outcome)
    return replace(meta, measure_start_ns=start, protocol=protocol)


# Imported agent logs (``imported_from`` / the trace's format) → agent-native headers.
_AGENTS: dict[str, AgentNative] = {"claude-code": "claude", "codex": "codex"}


def native_agent(trace: Trace, config: ReplayConfig) -> AgentNative | None:
    """Whose headers ``--session-routing agent-native`` stamps: ``--agent-native``,
    else the agent whose log the trace was imported from (its format, or its root
    sessions' ``imported_from``). ConfigError when neither says."""
    if config.session_routing != "agent-native":
        return None
    if config.agent_native is not None:
        return config.agent_native
    sources = {trace.source_format} | {
        str(s.extra.get("imported_from")) for s in trace.sessions
    }
    found = sorted({_AGENTS[k] for k in sources if k in _AGENTS})
    if len(found) != 1:
        raise ConfigError(
            f"--session-routing agent-native: the trace ({trace.source_format}) "
            + ("mixes Claude Code and Codex logs" if found else "is not an agent's log")
            + "; choose the headers with --agent-native claude|codex"
        )
    return found[0]


def context_misfits(trace: Trace, config: ReplayConfig) -> int:
    """Requests whose prompt (as sent) + output (after --output-scale and
    --max-output-tokens) pass ``config.max_model_len`` (0 when it is unknown)."""
    limit = config.max_model_len
    if limit is None:
        return 0
    materializer = Materializer(config.prompt)
    n = 0
    for session, _ in trace.all_sessions():
        for req in session.requests:
            sent, _ = materializer.sent_tokens(session, req)
            n += sent + config.output_tokens(req.output_tokens) > limit
    return n


def fit_warnings(trace: Trace, config: ReplayConfig) -> list[str]:
    """What ``run`` says at the start about requests that cannot fit the server's
    context (none: an empty list)."""
    if config.fit_context == "clamp" and config.max_model_len is None:
        return [
            "--fit-context clamp: the server does not report its max_model_len "
            "(in /v1/models), so no output is clamped"
        ]
    n = context_misfits(trace, config)
    if not n:
        return []
    total = trace.request_count()
    if config.fit_context == "clamp":
        what = "--fit-context clamp shortens their output to fit (per row: "
        what += "dropped_output_tokens)"
    else:
        what = "they are sent as they are (a 400 each, as a rule); "
        what += "--fit-context clamp shortens their output to fit"
    return [
        f"{n:,} of {total:,} requests cannot fit the server's context "
        f"(max_model_len {config.max_model_len:,}): prompt + output past it; {what}"
    ]


async def _check_model(client: ChatClient, config: ReplayConfig) -> None:
    models = await client.check()
    model = config.endpoint.model
    if models and model not in models:
        raise EndpointError(
            f"{public_url(config.endpoint.base_url)} does not serve model "
            f"{model!r} (it serves: {', '.join(models[:5])})"
        )


async def _run(
    ctx: RunContext,
    trace: Trace,
    scraper: MetricsScraper | None,
    progress: TextIO | None,
    total: int,
    monitor: LoopMonitor | None,
) -> None:
    """The schedule, with the scraper, the self-check and the status line beside
    it."""
    side_stop = asyncio.Event()
    async with asyncio.TaskGroup() as side:
        if monitor is not None:
            side.create_task(monitor.run(side_stop), name="self-check")
        if scraper is not None:
            side.create_task(
                scraper.run(side_stop, ctx.config.scrape_interval_s), name="scraper"
            )
        if progress is not None:
            line = Progress(
                ctx.counters,
                ctx.clock,
                ctx.t0_ns,
                total,
                progress,
                loop=ctx.config.loop,
            )
            side.create_task(line.run(side_stop), name="progress")
        try:
            await run_schedule(ctx, trace)
        finally:
            side_stop.set()
