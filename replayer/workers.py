"""``--workers N``: one asyncio process per core, sessions sharded round-robin, part
files per worker in one run directory, and one shared zero (``perf_counter_ns`` is
system-wide on Linux).

Each worker prepares everything slow (reading the trace, ideal hits, the model check,
opening its files) before a two-round start barrier; one of them then sets the zero
slightly in the future. The parent watches, never waits blindly: it polls each
worker's result pipe and process sentinel, so a worker that dies (a crash, SIGKILL,
an error of any type) stops the run within seconds, with a one-line error that names
it and its exit code, while the other workers flush what they recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from replayer.config import Lanes, RateArrivals, ReplayConfig
from replayer.errors import ConfigError, ReplayerError
from replayer.progress import RunSummary, summarize_run
from replayer.records import RunCounts, RunMeta
from replayer.rundir import read_run_json, write_run_json
from replayer.selfcheck import merge_checks

_START_DELAY_NS = 200_000_000  # after the barrier, so every worker waits at t0
_BARRIER_TIMEOUT_S = 3600.0  # a worker still preparing after this is stuck
_POLL_S = 0.5  # how often the parent looks at its workers
_STOP_GRACE_S = 30.0  # SIGTERM'd workers flush within this, else SIGKILL
_SELF_STOP_S = 5.0  # after Ctrl-C: time for workers to stop before SIGTERM


class WorkerFailed(ReplayerError):
    """A worker process failed or died; the others were stopped."""


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
    barrier: Any,
    t0: Any,
    conn: mpc.Connection,
) -> None:
    from replayer.launch import replay_trace, run_async
    from traces.errors import TraceError
    from traces.io import read_trace

    async def gate() -> int:
        # Two rounds: all prepared; one sets the shared zero; all read it.
        if await asyncio.to_thread(barrier.wait, _BARRIER_TIMEOUT_S) == 0:
            t0.value = time.perf_counter_ns() + _START_DELAY_NS
        await asyncio.to_thread(barrier.wait, _BARRIER_TIMEOUT_S)
        return int(t0.value)

    try:
        trace = read_trace(trace_path)
        summary = run_async(
            lambda: replay_trace(
                trace,
                config,
                Path(run_dir),
                meta=meta,
                worker_id=worker_id,
                start_gate=gate,
                run_json_name=_worker_json(worker_id),
            )
        )
        conn.send(("ok", summary.duration_s))
    except (ReplayerError, TraceError) as exc:
        conn.send(("error", str(exc)))
    except threading.BrokenBarrierError:
        conn.send(("aborted", "stopped before the start: another worker failed"))
    except KeyboardInterrupt:
        conn.send(("interrupted", ""))
    finally:
        conn.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def replay_with_workers(
    trace_path: Path, config: ReplayConfig, run_dir: Path, *, meta: RunMeta
) -> RunSummary:
    """Run ``config.workers`` processes over shards of the trace; merge run.json."""
    ctx = mp.get_context("spawn")
    n = config.workers
    t0 = ctx.Value("q", 0)
    barrier = ctx.Barrier(n)
    procs: list[Any] = []
    conns: list[mpc.Connection] = []
    check_split(config)
    for k in range(n):
        cfg = worker_config(config, k)
        ours, theirs = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker_main,
            args=(str(trace_path), cfg, str(run_dir), meta, k, barrier, t0, theirs),
            name=f"replayer-worker-{k}",
        )
        p.start()
        theirs.close()
        procs.append(p)
        conns.append(ours)
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
            _watch(procs, conns, results, barrier)
        except KeyboardInterrupt:
            # Ctrl-C reached the workers too (one process group); SIGTERM was
            # forwarded. Whoever has not stopped after a grace period is told.
            interrupted = True
            _stop(procs, conns, results, barrier, signal_now=False)
    finally:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)
        for p in procs:
            p.join(timeout=_STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()
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
) -> RunSummary:
    """The end of a run of several workers: WorkerFailed (one line: ``failure``,
    ``lost``, where the rows are), KeyboardInterrupt, or the merged summary."""
    if failure is not None:
        raise WorkerFailed(
            f"{failure}; {lost}the rows recorded so far are in {run_dir}"
        )
    if interrupted:
        raise KeyboardInterrupt
    assert merged.counts is not None
    return summarize_run(
        run_dir,
        run_id=merged.run_id,
        counts=merged.counts,
        duration_s=merged.duration_s or 0.0,
        interrupted=False,
        client_check=merged.client_check,
    )


def _poll(
    procs: list[Any], conns: list[mpc.Connection], results: dict[int, tuple[str, Any]]
) -> None:
    """Collect what finished: a result sent, or a process that ended without one."""
    for k, (p, conn) in enumerate(zip(procs, conns, strict=True)):
        if k in results:
            continue
        try:
            if conn.poll():
                results[k] = conn.recv()
                continue
        except (EOFError, OSError):
            p.join(timeout=5.0)  # closed without a result: it is dying
        if not p.is_alive():
            results[k] = ("died", p.exitcode)


def _watch(
    procs: list[Any],
    conns: list[mpc.Connection],
    results: dict[int, tuple[str, Any]],
    barrier: Any,
) -> None:
    while len(results) < len(procs):
        waitables: list[Any] = [c for k, c in enumerate(conns) if k not in results]
        waitables += [p.sentinel for k, p in enumerate(procs) if k not in results]
        mpc.wait(waitables, timeout=_POLL_S)
        _poll(procs, conns, results)
        if any(status not in ("ok", "interrupted") for status, _ in results.values()):
            _stop(procs, conns, results, barrier, signal_now=True)
            return


def _signal_running(procs: list[Any], results: dict[int, tuple[str, Any]]) -> None:
    for k, p in enumerate(procs):
        if k not in results and p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)


def _stop(
    procs: list[Any],
    conns: list[mpc.Connection],
    results: dict[int, tuple[str, Any]],
    barrier: Any,
    *,
    signal_now: bool,
) -> None:
    """Stop the workers still running: SIGTERM (now, or after a grace period for
    those already stopping on their own); they cancel, flush and report."""
    barrier.abort()  # a worker waiting at the start gives up
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
        _poll(procs, conns, results)


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
    parts = sorted((run_dir / "requests").glob(f"part-{worker_id:03d}-*.parquet"))
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
    from replayer.launch import mode_info

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
        config=config.as_metadata(),
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
    if run_dir.is_dir():
        write_run_json(run_dir / "run.json", merged)
    return merged
