"""``--workers N``: one asyncio process per core, sessions sharded round-robin, part
files per worker in one run directory, and one shared zero (``perf_counter_ns`` is
system-wide on Linux). See docs/scale-out.md#workers."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from replayer.clock import MonotonicClock
from replayer.config import Lanes, RateArrivals, ReplayConfig
from replayer.errors import ConfigError, ReplayerError
from replayer.lifeline import hold
from replayer.play.progress import (
    PLAIN_INTERVAL_S,
    ReplayOutcome,
    RunCounters,
    StatusLine,
    replay_outcome,
)
from replayer.play.selfcheck import merge_checks
from replayer.records import RecordedConfig, RunCounts, RunMeta
from replayer.records.parts import request_parts
from replayer.records.rundir import read_run_json, write_run_json

_START_DELAY_NS = 200_000_000  # after the start gate, so every worker waits at t0
_BARRIER_TIMEOUT_S = 3600.0  # a worker still preparing after this is stuck
_POLL_S = 0.5  # how often the parent looks at its workers
_STOP_GRACE_S = 30.0  # SIGTERM'd workers flush within this, else SIGKILL
_SELF_STOP_S = 5.0  # after Ctrl-C: time for workers to stop before SIGTERM
_REPORT_S = 1.0  # how often a worker reports its counters
STALL_S = 30.0  # a worker silent this long while its peers report is named


class WorkerFailed(ReplayerError):
    """A worker process failed or died; the others were stopped."""


class Silence:
    """When each worker last reported; names, once per silence, a worker that made
    no report for ``stall_s`` while a peer did (SIGSTOPped, or its loop hung)."""

    def __init__(
        self, names: list[str], stall_s: float, stream: TextIO, clock: MonotonicClock
    ) -> None:
        self.names = names
        self.stall_ns = int(stall_s * 1e9)
        self.stream = stream
        self.clock = clock
        self.heard: dict[int, int] = {}
        self.first: int | None = None  # the first report of anyone: the run began
        self.named: set[int] = set()

    def hear(self, k: int) -> None:
        self.heard[k] = now = self.clock.now_ns()
        self.first = self.first if self.first is not None else now
        self.named.discard(k)

    def check(self, running: list[int]) -> None:
        if self.first is None:
            return
        now = self.clock.now_ns()
        recent = {k for k in running if now - self.heard.get(k, 0) < self.stall_ns}
        for k in running:
            silent_ns = now - self.heard.get(k, self.first)
            if k in self.named or silent_ns < self.stall_ns or not recent - {k}:
                continue
            self.named.add(k)
            self.stream.write(
                f"warning: {self.names[k]} made no progress report for "
                f"{silent_ns / 1e9:.0f} s while the others did: stopped or hung?\n"
            )
            self.stream.flush()


class StartGate:
    """The shared zero, through one pipe to each worker: each says it is prepared;
    once all are, the parent sends them the zero, slightly in the future. Pipes, not
    a multiprocessing Barrier: a parent killed -9 leaves no named semaphore behind,
    and a worker waiting at the gate reads EOF when the parent dies."""

    def __init__(self, conns: list[mpc.Connection]) -> None:
        self.conns = conns  # the parent's write ends
        self.prepared: set[int] = set()
        self.t0_ns = 0  # 0: not started

    def prepared_by(self, k: int) -> None:
        self.prepared.add(k)
        if len(self.prepared) == len(self.conns) and not self.t0_ns:
            self.t0_ns = time.perf_counter_ns() + _START_DELAY_NS
            for conn in self.conns:
                with contextlib.suppress(OSError):  # a worker that died: _poll says
                    conn.send(self.t0_ns)

    def abort(self) -> None:
        """A worker still waiting at the gate gives up (it reads EOF)."""
        for conn in self.conns:
            conn.close()


def _wait_start(conn: mpc.Connection) -> int:
    """In a worker: the zero the parent sends; BrokenBarrierError when the gate is
    aborted, the parent died, or nothing came for _BARRIER_TIMEOUT_S."""
    try:
        if conn.poll(_BARRIER_TIMEOUT_S):
            return int(conn.recv())
    except (EOFError, OSError):
        pass
    raise threading.BrokenBarrierError


def _take(taken: Future[dict[str, Any]], counters: RunCounters) -> None:
    taken.set_result(counters.snapshot())


def _reporter(
    loop: asyncio.AbstractEventLoop,
    counters: RunCounters,
    fields: dict[str, Any],  # sent beside each snapshot: the trace's total, --loop
    send: Callable[[tuple[str, Any]], None],
    done: threading.Event,
) -> None:
    """Send the counters every ``_REPORT_S``, each snapshot taken on the event loop:
    a loop that hangs (or a process that is stopped) reports nothing."""
    while not done.wait(_REPORT_S):
        taken: Future[dict[str, Any]] = Future()
        try:
            loop.call_soon_threadsafe(_take, taken, counters)
        except RuntimeError:  # the loop is closed: the run is over
            return
        while not done.is_set():
            with contextlib.suppress(FutureTimeout):
                send(("progress", {**taken.result(_REPORT_S), **fields}))
                break


def check_split(config: ReplayConfig, where: str = "--workers") -> None:
    """Refuse a concurrency that leaves a worker without a lane."""
    schedule = config.schedule
    if isinstance(schedule, Lanes) and schedule.concurrency < config.workers:
        raise ConfigError(
            f"--concurrency {schedule.concurrency} over {config.workers} workers "
            f"leaves a worker without a session tree: use at most "
            f"{schedule.concurrency} {where} workers"
        )


def worker_config(config: ReplayConfig, worker_id: int) -> ReplayConfig:
    """Worker ``worker_id``'s part of ``config``: the global concurrency or session
    rate split exactly over ``config.workers`` (N lanes: N // W each, one more for
    the first N % W; R sessions/s: R / W each, and W independent Poisson processes
    of R / W are one of R), arrivals seeded per worker (else every worker would draw
    the same gaps), and the server's metrics scraped by worker 0 only (they are the
    same for everyone)."""
    n = config.workers
    schedule = config.schedule
    if isinstance(schedule, Lanes):
        extra = 1 if worker_id < schedule.concurrency % n else 0
        schedule = Lanes(concurrency=schedule.concurrency // n + extra)
    elif isinstance(schedule, RateArrivals):
        schedule = replace(schedule, session_rate=schedule.session_rate / n)
    return replace(
        config,
        schedule=schedule,
        seed=config.seed + worker_id,
        scrape_interval_s=config.scrape_interval_s if worker_id == 0 else 0,
    )


def _worker_json(worker_id: int) -> str:
    return f"run-worker-{worker_id:03d}.json"


def _worker_main(
    trace_path: str,
    config: ReplayConfig,
    run_dir: str,
    meta: RunMeta,
    worker_id: int,
    start: mpc.Connection,
    conn: mpc.Connection,
    parent: tuple[int, mpc.Connection],
) -> None:
    from replayer.runner.local import replay_trace, run_async
    from traces.errors import TraceError
    from traces.io import read_trace

    hold(parent[0], parent[1].fileno())  # die with the parent, kill -9 included
    sending = threading.Lock()  # the reporter and the end share the pipe
    reported = threading.Event()
    counters = RunCounters()
    total = 0

    def send(message: tuple[str, Any]) -> None:
        with sending, contextlib.suppress(OSError):  # a dead parent reads nothing
            conn.send(message)

    async def gate() -> int:
        send(("prepared", None))
        t0_ns = await asyncio.to_thread(_wait_start, start)
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=_reporter,
            args=(loop, counters, {"total": total, "loop": config.loop}, send,
                  reported),
            daemon=True, name="reporter",
        ).start()  # fmt: skip
        return t0_ns

    try:
        trace = read_trace(trace_path, mooncake_rows=config.mooncake_rows)
        total = trace.request_count()
        summary = run_async(
            lambda: replay_trace(
                trace,
                config,
                Path(run_dir),
                meta=meta,
                worker_id=worker_id,
                start_gate=gate,
                run_json_name=_worker_json(worker_id),
                counters=counters,
            )
        )
        result: tuple[str, Any] = ("ok", summary.duration_s)
    except (ReplayerError, TraceError) as exc:
        result = ("error", str(exc))
    except threading.BrokenBarrierError:
        result = ("aborted", "stopped before the start: another worker failed")
    except KeyboardInterrupt:
        result = ("interrupted", "")
    reported.set()
    send(result)
    conn.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Reports:
    """The workers' latest reports: the run's status line, and who fell silent."""

    def __init__(
        self,
        names: list[str],
        progress: TextIO | None,
        *,
        stall_s: float,
        interval_s: float,
    ) -> None:
        clock = MonotonicClock()
        self.latest: dict[int, dict[str, Any]] = {}
        self.silence = Silence(names, stall_s, progress or sys.stderr, clock)
        self.line = (
            None
            if progress is None
            else StatusLine(progress, clock, interval_s=interval_s)
        )

    def add(self, k: int, report: dict[str, Any]) -> None:
        self.latest[k] = report
        self.silence.hear(k)

    def tick(self, running: list[int], t0_ns: int) -> None:
        self.silence.check(running)
        if self.line is not None:
            total = max((r["total"] for r in self.latest.values()), default=0)
            loop = any(r.get("loop") for r in self.latest.values())
            self.line.tick(
                lambda: RunCounters.merged(self.latest), t0_ns, total, loop=loop
            )

    def close(self) -> None:
        if self.line is not None:
            self.line.close()


def replay_with_workers(
    trace_path: Path,
    config: ReplayConfig,
    run_dir: Path,
    *,
    meta: RunMeta,
    progress: TextIO | None = None,
    stall_s: float = STALL_S,
    status_interval_s: float = PLAIN_INTERVAL_S,
) -> ReplayOutcome:
    """Run ``config.workers`` processes over shards of the trace; merge run.json.
    ``progress``: the status line's stream (a silent worker is named there, else
    on stderr).

    Each worker prepares everything slow (reading the trace, ideal hits, the model
    check, opening its files) before the start gate (:class:`StartGate`); once all
    are prepared the parent sends them the zero, slightly in the future. The parent
    watches, never waits blindly: it polls
    each worker's result pipe and process sentinel, so a worker that dies (a crash,
    SIGKILL, an error of any type) stops the run within seconds, with a one-line error
    that names it and its exit code, while the other workers flush what they recorded.

    Workers die with the parent, kill -9 included (replayer/lifeline.py: the
    parent-death signal, and a pipe only the parent writes to). Each reports its
    counters from its event loop every second: the parent prints the run's status line
    from them and names a worker that fell silent while its peers went on (stopped or
    hung).
    """
    ctx = mp.get_context("spawn")
    n = config.workers
    procs: list[Any] = []
    conns: list[mpc.Connection] = []
    lifelines: list[mpc.Connection] = []  # a worker's watch reads EOF when we die
    starts: list[mpc.Connection] = []
    check_split(config)
    for k in range(n):
        cfg = worker_config(config, k)
        ours, theirs = ctx.Pipe(duplex=False)
        watch, life = ctx.Pipe(duplex=False)
        start, go = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker_main,
            args=(str(trace_path), cfg, str(run_dir), meta, k, start, theirs,
                  (os.getpid(), watch)),
            name=f"replayer-worker-{k}",
        )  # fmt: skip
        p.start()
        for end in (theirs, watch, start):
            end.close()
        procs.append(p)
        conns.append(ours)
        lifelines.append(life)
        starts.append(go)
    gate = StartGate(starts)
    reports = Reports(
        [f"worker {k} (pid {p.pid})" for k, p in enumerate(procs)],
        progress,
        stall_s=stall_s,
        interval_s=status_interval_s,
    )
    watch_t0 = (reports, lambda: gate.t0_ns)
    results: dict[int, tuple[str, Any]] = {}
    interrupted = False
    previous = signal.getsignal(signal.SIGTERM)

    def forward_sigterm(signum: int, frame: Any) -> None:
        _signal_running(procs, results)
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread: leave it
        signal.signal(signal.SIGTERM, forward_sigterm)
    try:
        try:
            _watch(procs, conns, results, gate, watch_t0)
        except KeyboardInterrupt:
            # Ctrl-C reached the workers too (one process group); SIGTERM was
            # forwarded. Whoever has not stopped after a grace period is told.
            interrupted = True
            _stop(procs, conns, results, gate, reports, signal_now=False)
    finally:
        reports.close()
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)
        for p in procs:
            p.join(timeout=_STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()
        gate.abort()
        for c in (*conns, *lifelines):
            c.close()
    failure = _failure(procs, results)
    merged = _merge(run_dir, config, meta, interrupted=interrupted, error=failure)
    return outcome(run_dir, merged, failure=failure, interrupted=interrupted)


def outcome(
    run_dir: Path,
    merged: RunMeta,
    *,
    failure: str | None,
    interrupted: bool,
    lost: str = "",
) -> ReplayOutcome:
    """The end of a run of several workers: WorkerFailed (one line: ``failure``,
    ``lost``, where the rows are), KeyboardInterrupt, or the merged summary."""
    if failure is not None:
        raise WorkerFailed(
            f"{failure}; {lost}the rows recorded so far are in {run_dir}"
        )
    if interrupted:
        raise KeyboardInterrupt
    assert merged.counts is not None
    return replay_outcome(
        run_dir,
        run_id=merged.run_id,
        counts=merged.counts,
        duration_s=merged.duration_s or 0.0,
        interrupted=False,
        client_check=merged.client_check,
    )


def _poll(
    procs: list[Any],
    conns: list[mpc.Connection],
    results: dict[int, tuple[str, Any]],
    reports: Reports,
    gate: StartGate,
) -> None:
    """Collect the reports and what finished: a result sent, or a process that
    ended without one."""
    for k, (p, conn) in enumerate(zip(procs, conns, strict=True)):
        try:
            while k not in results and conn.poll():
                status, detail = conn.recv()
                if status == "progress":
                    reports.add(k, detail)
                elif status == "prepared":
                    gate.prepared_by(k)
                else:
                    results[k] = (status, detail)
        except (EOFError, OSError):
            p.join(timeout=5.0)  # closed without a result: it is dying
        if k not in results and not p.is_alive():
            results[k] = ("died", p.exitcode)


def _watch(
    procs: list[Any],
    conns: list[mpc.Connection],
    results: dict[int, tuple[str, Any]],
    gate: StartGate,
    reporting: tuple[Reports, Callable[[], int]],
) -> None:
    reports, t0 = reporting
    while len(results) < len(procs):
        waitables: list[Any] = [c for k, c in enumerate(conns) if k not in results]
        waitables += [p.sentinel for k, p in enumerate(procs) if k not in results]
        mpc.wait(waitables, timeout=_POLL_S)
        _poll(procs, conns, results, reports, gate)
        if any(status not in ("ok", "interrupted") for status, _ in results.values()):
            _stop(procs, conns, results, gate, reports, signal_now=True)
            return
        reports.tick([k for k in range(len(procs)) if k not in results], t0())


def _signal_running(procs: list[Any], results: dict[int, tuple[str, Any]]) -> None:
    for k, p in enumerate(procs):
        if k not in results and p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)


def _stop(
    procs: list[Any],
    conns: list[mpc.Connection],
    results: dict[int, tuple[str, Any]],
    gate: StartGate,
    reports: Reports,
    *,
    signal_now: bool,
) -> None:
    """Stop the workers still running: SIGTERM (now, or after a grace period for
    those already stopping on their own); they cancel, flush and report."""
    gate.abort()  # a worker waiting at the start gives up
    if signal_now:
        _signal_running(procs, results)
    signalled = signal_now
    start = time.monotonic()
    while len(results) < len(procs) and time.monotonic() < start + _STOP_GRACE_S:
        if not signalled and time.monotonic() > start + _SELF_STOP_S:
            _signal_running(procs, results)
            signalled = True
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: keep stopping
            mpc.wait([p.sentinel for p in procs], timeout=_POLL_S)
        _poll(procs, conns, results, reports, gate)


def _failure(procs: list[Any], results: dict[int, tuple[str, Any]]) -> str | None:
    """The first failure, in one line: which worker, and how it ended."""
    for k in sorted(results):
        status, detail = results[k]
        if status == "died":
            return f"worker {k} (pid {procs[k].pid}) {_describe_exit(detail)}"
        if status == "error":
            return f"worker {k}: {detail}"
    for k in sorted(results):
        status, detail = results[k]
        if status not in ("ok", "interrupted"):
            return f"worker {k}: {detail}"
    return None


def _worker_counts(run_dir: Path, worker_id: int) -> RunCounts:
    """Worker ``worker_id``'s counts: from its run-worker file when it wrote its
    end, else (killed, or stopped before its end) from the rows it flushed."""
    import pyarrow.dataset as ds

    path = run_dir / _worker_json(worker_id)
    own = read_run_json(path).counts if path.is_file() else None
    if own is not None:
        return replace(own, trace_requests=0)
    parts = request_parts(run_dir, worker_id)
    if not parts:
        return RunCounts()
    columns = ["status", "error_type", "output_tokens", "requested_output_tokens"]
    table = ds.dataset(parts, format="parquet").to_table(columns=columns)
    return RunCounts.of_table(table)


def _merge(
    run_dir: Path,
    config: ReplayConfig,
    meta: RunMeta,
    *,
    interrupted: bool,
    error: str | None,
) -> RunMeta:
    """run.json for the whole run: the workers' counts added, the longest duration,
    the global schedule. A worker that did not get as far as writing its file is
    left out."""
    from replayer.runner.local import mode_info

    n = config.workers
    metas = [
        read_run_json(run_dir / _worker_json(k))
        for k in range(n)
        if (run_dir / _worker_json(k)).is_file()
    ]
    base = metas[0] if metas else meta
    counts = RunCounts()
    for k in range(n):
        counts += _worker_counts(run_dir, k)
    merged = replace(
        base,
        worker_id=None,
        workers=n,
        mode=mode_info(config.schedule),
        seed=config.seed,
        config=RecordedConfig.of(config),
        counts=replace(counts, trace_requests=base.trace.requests or 0),
        duration_s=max((m.duration_s or 0.0 for m in metas), default=0.0),
        end_unix_ns=max((m.end_unix_ns or 0 for m in metas), default=0) or None,
        interrupted=interrupted
        or error is not None
        or any(m.interrupted for m in metas),
        error=error or next((m.error for m in metas if m.error), None),
        client_check=merge_checks(
            {
                m.worker_id or 0: m.client_check
                for m in metas
                if m.client_check is not None
            }
        ),
    )
    echoed = [
        m.protocol.outcome.session_tokens_echoed
        for m in metas
        if m.protocol is not None
        and m.protocol.outcome is not None
        and m.protocol.outcome.session_tokens_echoed is not None
    ]
    done = None if merged.protocol is None else merged.protocol.outcome
    if echoed and merged.protocol is not None and done is not None:
        merged = replace(
            merged,
            protocol=replace(
                merged.protocol,
                outcome=replace(done, session_tokens_echoed=sum(echoed)),
            ),
        )
    if run_dir.is_dir():
        write_run_json(run_dir / "run.json", merged)
    return merged
