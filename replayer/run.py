"""replay_trace(): wires clock, client, recorder, scraper and the scheduler, and writes
the run directory (requests/part-*.parquet, server_metrics.parquet, run.json).

Scheduling modes: ``concurrency`` (N live session trees; a lane frees when its whole
tree has drained), ``session_rate`` (Poisson or gamma arrivals of trees) and
``timestamps`` (each session at its trace arrival time / speedup).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from replayer import __version__
from replayer.client import Client
from replayer.clock import Clock, MonotonicClock, wall_clock_ns
from replayer.config import ReplayConfig
from replayer.errors import EndpointError, RecorderError
from replayer.recorder import ParquetRecorder
from replayer.scrape import MetricsScraper
from replayer.session import RunState, play_tree
from traces.materialize import Materializer
from traces.model import Session, Trace
from traces.stats import ideal_cached_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What a finished (or interrupted) run did."""

    run_dir: Path
    run_id: str
    requests: int
    ok: int
    failed: int
    skipped: int
    duration_s: float
    interrupted: bool
    p90_ttft_ms: float | None
    output_tok_s: float
    counts: dict[str, int] = field(default_factory=dict)

    def one_line(self) -> str:
        ttft = "-" if self.p90_ttft_ms is None else f"{self.p90_ttft_ms:,.1f} ms"
        return (
            f"{self.requests:,} requests ({self.ok:,} ok, {self.failed:,} failed, "
            f"{self.skipped:,} skipped) in {self.duration_s:,.1f} s; "
            f"P90 TTFT {ttft}; {self.output_tok_s:,.0f} output tok/s → {self.run_dir}"
        )


def new_run_id() -> str:
    """Sortable and unique: UTC time plus 4 random bytes."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def trace_content_hash(path: Path) -> str:
    """sha256 over the bytes of the trace's files (sorted), hex."""
    h = hashlib.sha256()
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    )
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _trees(trace: Trace, config: ReplayConfig) -> Iterator[tuple[Session, int]]:
    """Session trees in trace order, looping (with a new replay index) if asked."""
    for replay in itertools.count() if config.loop else (0,):
        for s in trace.sessions:
            yield s, replay


def _shard(trace: Trace, config: ReplayConfig) -> Trace:
    if config.workers <= 1:
        return trace
    mine = tuple(
        s
        for i, s in enumerate(trace.sessions)
        if i % config.workers == config.worker_id
    )
    return Trace(sessions=mine, source_format=trace.source_format)


async def _schedule(
    state: RunState, trace: Trace, tasks: set[asyncio.Task[None]]
) -> None:
    cfg = state.config
    clock = state.clock
    async with asyncio.TaskGroup() as tg:

        def start(root: Session, replay: int, at_abs: int) -> asyncio.Task[None]:
            task = tg.create_task(
                play_tree(state, root, replay=replay, start_abs_ns=at_abs),
                name=f"session-{root.session_id}#{replay}",
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return task

        trees = _trees(trace, cfg)
        if cfg.mode == "concurrency":
            lock = asyncio.Lock()

            async def lane() -> None:
                while not state.stopping:
                    async with lock:
                        nxt = next(trees, None)
                    if nxt is None or state.past_stop(clock.now_ns()):
                        return
                    # A lane frees only when its whole tree (subagents too) drains.
                    await start(nxt[0], nxt[1], clock.now_ns())

            async with asyncio.TaskGroup() as lanes:
                for k in range(cfg.concurrency):
                    lanes.create_task(lane(), name=f"lane-{k}")
            return
        if cfg.mode == "session_rate":
            rng = np.random.default_rng(cfg.seed)
            rate = float(cfg.session_rate or 1.0)
            offset_s = 0.0
            for root, replay in trees:
                at = state.t0_ns + int(offset_s * 1e9)
                if state.past_stop(at):
                    return
                await clock.sleep_until(at)
                start(root, replay, at)
                if cfg.arrival == "gamma":
                    # vLLM's convention: shape = burstiness, mean gap = 1 / rate.
                    gap = rng.gamma(cfg.burstiness, 1.0 / (rate * cfg.burstiness))
                else:
                    gap = rng.exponential(1.0 / rate)
                offset_s += float(gap)
            return
        # timestamps: each session at its own trace arrival time.
        starts = [s.start_s or 0.0 for s in trace.sessions]
        base = min(starts) if starts else 0.0
        loop_len = (max(starts) - base) if starts else 0.0
        for root, replay in trees:
            off = (
                (root.start_s or 0.0) - base + replay * (loop_len + 1.0)
            ) / cfg.speedup
            at = state.t0_ns + int(off * 1e9)
            if state.past_stop(at):
                return
            await clock.sleep_until(at)
            start(root, replay, at)


class _Progress:
    """A live status line on stderr (each second on a terminal, else every 10 s)."""

    def __init__(self, state: RunState, total: int, stream: TextIO) -> None:
        self.state = state
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()

    def line(self) -> str:
        s = self.state
        elapsed = (s.clock.now_ns() - s.t0_ns) / 1e9
        p90 = (
            f"{np.percentile(s.ttfts_ns[-5000:], 90) / 1e6:,.0f} ms"
            if s.ttfts_ns
            else "-"
        )
        rate = s.output_tokens / elapsed if elapsed > 0 else 0.0
        return (
            f"[{elapsed:7.1f}s] done {s.done:,}/{self.total:,}  in flight {s.inflight}"
            f"  lanes {s.lanes}  failed {s.failed}  skipped {s.skipped}"
            f"  P90 TTFT {p90}  {rate:,.0f} out tok/s"
        )

    async def run(self, stop: asyncio.Event) -> None:
        interval = 1.0 if self.tty else 10.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
            if self.tty:
                self.stream.write("\r\x1b[2K" + self.line())
            elif not stop.is_set():
                self.stream.write(self.line() + "\n")
            self.stream.flush()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


async def replay_trace(
    trace: Trace,
    config: ReplayConfig,
    run_dir: Path,
    *,
    trace_path: Path | None = None,
    clock: Clock | None = None,
    run_id: str | None = None,
    progress: TextIO | None = None,
    extra_metadata: dict[str, Any] | None = None,
    t0_ns: int | None = None,
    run_json_name: str = "run.json",
) -> RunSummary:
    """Replay ``trace`` per ``config``; write the run directory ``run_dir``."""
    clock = clock or MonotonicClock()
    run_id = run_id or new_run_id()
    trace = _shard(trace, config)
    ideal = ideal_cached_tokens(trace)
    total_input = sum(
        r.input_tokens for s, _ in trace.all_sessions() for r in s.requests
    )
    ideal_rate = sum(ideal.values()) / total_input if total_input else None
    block_sizes = sorted({s.block_size for s, _ in trace.all_sessions()})
    total_requests = trace.request_count()
    materializer = Materializer(config.prompt)
    content_hash = (
        None
        if trace_path is None
        else await asyncio.to_thread(trace_content_hash, trace_path)
    )
    meta: dict[str, Any] = {
        "run_id": run_id,
        "tool": "agentic-trace-replayer",
        "tool_version": __version__,
        "python": sys.version.split()[0],
        "trace": {
            "path": None if trace_path is None else str(Path.cwd() / trace_path),
            "content_hash": content_hash,
            "format": trace.source_format,
            "sessions": len(trace.sessions),
            "requests": total_requests,
            "ideal_cache_hit_rate": ideal_rate,
            "block_size": block_sizes[0] if block_sizes else None,
        },
        "endpoint": config.endpoint.base_url,
        "model": config.endpoint.model,
        "api": config.endpoint.api,
        "mode": {
            "kind": config.mode,
            "concurrency": config.concurrency if config.mode == "concurrency" else None,
            "session_rate": config.session_rate
            if config.mode == "session_rate"
            else None,
            "speedup": config.speedup if config.mode == "timestamps" else None,
        },
        "warmup_s": config.warmup_s,
        "duration_limit_s": config.duration_s,
        "labels": dict(config.labels),
        "seed": config.seed,
        "salt": config.prompt.salt,
        "block_tokens": config.prompt.block_tokens,
        "worker_id": config.worker_id,
        "workers": config.workers,
        "config": config.as_metadata(),
        "simulated": False,
        "sim": None,
        **(extra_metadata or {}),
    }
    limit = config.max_inflight or 10_000
    interrupted = False
    async with (
        ParquetRecorder(
            run_dir,
            worker_id=config.worker_id,
            flush_interval_s=config.flush_interval_s,
            metadata=meta,
        ) as recorder,
        Client(config.endpoint, clock, limit=limit) as client,
    ):
        models = await client.check()
        if models and config.endpoint.model not in models:
            raise EndpointError(
                f"{config.endpoint.base_url} does not serve model "
                f"{config.endpoint.model!r} (it serves: {', '.join(models[:5])})"
            )
        head = b'{"model":' + json.dumps(config.endpoint.model).encode() + b","
        now = clock.now_ns()
        t0 = t0_ns if t0_ns is not None else now
        meta["start_unix_ns"] = wall_clock_ns() - (now - t0)
        meta["measure_start_ns"] = int(config.warmup_s * 1e9)
        state = RunState(
            config=config,
            clock=clock,
            client=client,
            recorder=recorder,
            materializer=materializer,
            run_id=run_id,
            t0_ns=t0,
            ideal_tokens=ideal,
            body_head=head,
            stop_at_ns=None
            if config.duration_s is None
            else t0 + int(config.duration_s * 1e9),
            admission=asyncio.Semaphore(config.max_inflight)
            if config.max_inflight
            else None,
        )
        _write_run_json(run_dir / run_json_name, meta)
        await clock.sleep_until(t0)  # workers share a zero slightly in the future
        scraper = MetricsScraper(config.endpoint, client.session, clock, t0)
        side_stop = asyncio.Event()
        tree_tasks: set[asyncio.Task[None]] = set()
        try:
            async with asyncio.TaskGroup() as side:
                if config.scrape_interval_s > 0:
                    side.create_task(
                        scraper.run(side_stop, config.scrape_interval_s), name="scraper"
                    )
                if progress is not None:
                    side.create_task(
                        _Progress(state, total_requests, progress).run(side_stop),
                        name="progress",
                    )
                if state.stop_at_ns is not None:
                    side.create_task(
                        _stop_at(state, tree_tasks, side_stop), name="duration"
                    )
                try:
                    await _schedule(state, trace, tree_tasks)
                finally:
                    side_stop.set()
        except asyncio.CancelledError:
            interrupted = True
            raise
        finally:
            end = clock.now_ns()
            meta["end_unix_ns"] = meta["start_unix_ns"] + (end - t0)
            meta["duration_s"] = (end - t0) / 1e9
            meta["interrupted"] = interrupted
            meta["counts"] = {
                "requests": state.done + state.failed + state.skipped,
                "ok": state.done,
                "failed": state.failed,
                "skipped": state.skipped,
                "trace_requests": total_requests,
            }
            meta["recorder"] = {"max_queue_depth": recorder.max_pending}
            meta["materializer"] = {
                "block_cache_hits": materializer.hits,
                "block_cache_misses": materializer.misses,
            }
            recorder.set_metadata(meta)
            with contextlib.suppress(RecorderError):
                await asyncio.shield(asyncio.to_thread(scraper.write, run_dir))
            _write_run_json(run_dir / run_json_name, meta)
    duration = meta["duration_s"]
    p90 = float(np.percentile(state.ttfts_ns, 90)) / 1e6 if state.ttfts_ns else None
    return RunSummary(
        run_dir=run_dir,
        run_id=run_id,
        requests=meta["counts"]["requests"],
        ok=state.done,
        failed=state.failed,
        skipped=state.skipped,
        duration_s=duration,
        interrupted=interrupted,
        p90_ttft_ms=p90,
        output_tok_s=state.output_tokens / duration if duration > 0 else 0.0,
        counts=meta["counts"],
    )


async def _stop_at(
    state: RunState, tree_tasks: set[asyncio.Task[None]], done: asyncio.Event
) -> None:
    assert state.stop_at_ns is not None
    waiter = asyncio.ensure_future(done.wait())
    try:
        sleeper = asyncio.ensure_future(state.clock.sleep_until(state.stop_at_ns))
        finished, _ = await asyncio.wait(
            {waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED
        )
        for t in (waiter, sleeper):
            if t not in finished:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        if sleeper in finished:
            state.stopping = True
            if state.config.drain == "cancel":
                for task in list(tree_tasks):
                    task.cancel()
    finally:
        if not waiter.done():
            waiter.cancel()


def _write_run_json(path: Path, meta: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise RecorderError(f"{path}: cannot write: {exc.strerror or exc}") from exc
