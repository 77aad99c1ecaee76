"""``--ray ADDRESS``: the ``--workers`` design on a Ray cluster, each worker a Ray actor
with its own event loop, pinned to a node. See docs/scale-out.md#ray."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from replayer.clock import MonotonicClock
from replayer.config import Lanes, ReplayConfig
from replayer.errors import ConfigError
from replayer.play.progress import PLAIN_INTERVAL_S, ReplayOutcome, RunCounters
from replayer.records import RayActor, RayInfo, RayLost, RunMeta
from replayer.records.parts import request_parts
from replayer.records.rundir import read_run_json, write_run_json
from replayer.runner.workers import (
    STALL_S,
    Reports,
    _merge,
    _worker_json,
    check_split,
    outcome,
    worker_config,
)

_START_DELAY_NS = 500_000_000  # after the offsets are measured: every actor waits
_READY_TIMEOUT_S = 3600.0  # an actor still preparing after this is stuck
_POLL_S = 0.5  # how often the driver looks at its actors
_STOP_GRACE_S = 30.0  # stopped actors flush within this
_OFFSET_ROUNDS = 5  # wall-clock samples per actor; the shortest round trip wins
_REPORT_S = 1.0  # how often the driver asks each actor for its counters
# An actor not asked for its counters this long stops its replay: a fallback for
# Ray's own stop of a dead owner's actors, long enough for a driver paused (Ctrl-Z)
# or busy for a while to find its run going on.
_DRIVER_SILENT_S = 60.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray: pip install 'agentic-trace-replayer[ray]'"
        ) from None
    return ray


class ReplayActor:
    """One worker on one node (a Ray async actor: methods share its event loop)."""

    def __init__(self) -> None:
        self._ready = asyncio.Event()
        self._start = asyncio.Event()
        self._start_unix_ns = 0
        self._task: asyncio.Task[Any] | None = None
        self._counters: RunCounters | None = None
        self._asked = asyncio.Event()  # the driver called status()

    def node(self) -> dict[str, str]:
        import ray

        node_id: str = ray.get_runtime_context().get_node_id()
        return {"node_id": node_id}

    def wall_ns(self) -> int:
        return time.time_ns()

    async def ready(self) -> None:
        await self._ready.wait()

    def start(self, start_unix_ns: int) -> None:
        """The shared start instant, in this actor's wall clock."""
        self._start_unix_ns = start_unix_ns
        self._start.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def status(self) -> dict[str, Any]:
        """The counters (taken on this actor's loop: a hung loop answers nothing)."""
        self._asked.set()
        c = self._counters
        return {} if c is None else c.snapshot()

    async def _watch_driver(self) -> None:
        """Stop the replay when the started driver stops asking (it died)."""
        await self._start.wait()
        while True:
            self._asked.clear()
            try:
                async with asyncio.timeout(_DRIVER_SILENT_S):
                    await self._asked.wait()
            except TimeoutError:
                break
        self.stop()

    async def run(
        self,
        trace_path: str,
        config: ReplayConfig,
        run_dir: str,
        meta: RunMeta,
        worker_id: int,
    ) -> tuple[str, str]:
        """("ok" | "interrupted" | "error", detail)."""
        from replayer.errors import ReplayerError
        from replayer.runner.local import replay_trace
        from traces.errors import TraceError
        from traces.io import read_trace

        clock = MonotonicClock()
        self._task = asyncio.current_task()

        async def gate() -> int:
            self._ready.set()
            await self._start.wait()
            return clock.now_ns() + (self._start_unix_ns - time.time_ns())

        self._counters = RunCounters()
        try:
            trace = await asyncio.to_thread(
                read_trace, trace_path, mooncake_rows=config.mooncake_rows
            )
            # Owned and awaited here, not in a TaskGroup: the replay's errors
            # must come out as themselves, not in an ExceptionGroup.
            watch = asyncio.create_task(self._watch_driver(), name="driver-watch")
            try:
                await replay_trace(
                    trace,
                    config,
                    Path(run_dir),
                    meta=meta,
                    worker_id=worker_id,
                    clock=clock,
                    start_gate=gate,
                    run_json_name=_worker_json(worker_id),
                    counters=self._counters,
                )
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        except (ReplayerError, TraceError) as exc:
            self._ready.set()
            return "error", str(exc)
        except asyncio.CancelledError:
            return "interrupted", ""
        return "ok", ""


def actor_count(config: ReplayConfig, live_nodes: int) -> int:
    """How many actors run ``config``: ``ray_workers`` when given (a split that leaves
    one without a lane is refused later), else one per live node but no more than
    the lanes: an actor without a session tree would have nothing to replay."""
    if config.ray_workers is not None:
        return config.ray_workers
    if isinstance(config.schedule, Lanes):
        return min(live_nodes, config.schedule.concurrency)
    return live_nodes


def _clock_offset(ray: Any, actor: Any) -> tuple[int, int]:
    """(actor wall clock - driver wall clock, round trip) in ns: the sample with the
    shortest round trip, whose midpoint is the best estimate."""
    best: tuple[int, int] | None = None
    for _ in range(_OFFSET_ROUNDS):
        sent = time.time_ns()
        theirs = ray.get(actor.wall_ns.remote(), timeout=60)
        back = time.time_ns()
        rtt = back - sent
        sample = (theirs - (sent + back) // 2, rtt)
        if best is None or rtt < best[1]:
            best = sample
    assert best is not None
    return best


def replay_with_ray(
    trace_path: Path,
    config: ReplayConfig,
    run_dir: Path,
    *,
    meta: RunMeta,
    progress: TextIO | None = None,
) -> ReplayOutcome:
    """Run the replay as Ray actors on the cluster at ``config.ray_address``.

    ``--ray ADDRESS``: the ``--workers`` design on a Ray cluster. Each worker is a Ray
    actor with its own event loop, pinned to a node (round-robin over the cluster's live
    nodes; by default one per node, and no more than the lanes, so that ``--concurrency
    1`` on two nodes, a sweep's or a capacity search's first level, runs one actor);
    session trees are sharded so that a tree never spans actors, and the global
    concurrency or rate is split exactly
    (:func:`replayer.runner.workers.worker_config`).

    One start instant across machines: perf counters are per machine, so the driver
    measures each actor's wall-clock offset from its own (the sample with the shortest
    round trip of a few, NTP-style), then gives every actor the same wall-clock instant
    in that actor's clock; each turns it into its own perf-counter zero. The offsets and
    round trips are recorded in ``run.json`` ``ray``.

    Rows go to one run directory that every node sees (a shared file system, or one
    machine): part files per actor, flushed at the flush interval, so a lost node leaves
    what it flushed. The driver watches through ``ray.wait`` with a timeout: an actor
    that dies stops the run within seconds with one line naming it and its node, the
    others flush, and its unfinished session trees are listed in ``run.json``. Ray is an
    optional extra (``pip install 'agentic-trace-replayer[ray]'``); nothing here starts
    a dashboard or asks for a token unless the cluster was started so.

    The driver asks every actor for its counters each second (the status line, and an
    actor silent while its peers answer is named: stopped or hung). The actors are the
    driver's (Ray stops an owner's actors when the owner dies); an actor that hears
    nothing from a started driver for ``_DRIVER_SILENT_S`` also stops its replay itself.
    """
    # Actors run in Ray's own working directory: a relative path would name
    # another file there (or none).
    trace_path, run_dir = trace_path.absolute(), run_dir.absolute()
    ray = _ray()
    address = config.ray_address
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"cannot join the Ray cluster at {address}: {first}") from exc
    try:
        return _drive(ray, trace_path, config, run_dir, meta, progress)
    finally:
        ray.shutdown()


def _drive(
    ray: Any,
    trace_path: Path,
    config: ReplayConfig,
    run_dir: Path,
    meta: RunMeta,
    progress: TextIO | None,
) -> ReplayOutcome:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    n = actor_count(config, len(nodes))
    config = replace(config, workers=n)
    check_split(config, "--ray")
    remote = ray.remote(num_cpus=0, max_restarts=0)(ReplayActor)
    actors = []
    for k in range(n):
        node = nodes[k % len(nodes)]["NodeID"]
        actors.append(
            remote.options(
                name=None,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote()
        )
    ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in nodes}
    places = [
        {**p, "ip": ips.get(p["node_id"], "?")}
        for p in ray.get([a.node.remote() for a in actors], timeout=_READY_TIMEOUT_S)
    ]
    runs = [
        a.run.remote(str(trace_path), worker_config(config, k), str(run_dir), meta, k)
        for k, a in enumerate(actors)
    ]
    results: dict[int, tuple[str, str]] = {}
    info = RayInfo(address=config.ray_address)
    interrupted = False
    try:
        _until_ready(ray, actors, runs, results)
        if not results:
            offsets = [_clock_offset(ray, a) for a in actors]
            start = time.time_ns() + _START_DELAY_NS
            for a, (offset, _) in zip(actors, offsets, strict=True):
                a.start.remote(start + offset)
            info = replace(
                info,
                actors=tuple(
                    RayActor(
                        worker_id=k,
                        node_id=places[k]["node_id"],
                        ip=places[k]["ip"],
                        clock_offset_ns=o,
                        rtt_ns=r,
                    )
                    for k, (o, r) in enumerate(offsets)
                ),
            )
            t0 = MonotonicClock().now_ns() + (start - time.time_ns())
            reports = Reports(
                [f"Ray actor {k} on node {p['ip']}" for k, p in enumerate(places)],
                progress,
                stall_s=STALL_S,
                interval_s=PLAIN_INTERVAL_S,
            )
            total = 0
            if progress is not None:
                from traces.io import read_trace

                total = read_trace(
                    trace_path, mooncake_rows=config.mooncake_rows
                ).request_count()
            try:
                _watch(ray, actors, runs, results, (reports, t0, total))
            finally:
                reports.close()
    except KeyboardInterrupt:
        interrupted = True
        _stop(ray, actors, runs, results)
    failure = _failure(results, places)
    if failure is not None:
        _stop(ray, actors, runs, results)
    merged = _merge(run_dir, config, meta, interrupted=interrupted, error=failure)
    lost = _unfinished(run_dir, trace_path, config, results)
    info = replace(info, lost=tuple(lost))
    if run_dir.is_dir():
        write_run_json(run_dir / "run.json", replace(merged, ray=info))
    trees = sum(len(x.unfinished_sessions) for x in lost)
    return outcome(
        run_dir,
        merged,
        failure=failure,
        interrupted=interrupted,
        lost=f"{trees} session trees unfinished (listed in run.json); ",
    )


def _collect(
    ray: Any, runs: list[Any], results: dict[int, tuple[str, str]], done: list[Any]
) -> None:
    for ref in done:
        k = runs.index(ref)
        try:
            results[k] = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            results[k] = ("died", _first_line(exc))
        except ray.exceptions.RayError as exc:
            results[k] = ("error", _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _until_ready(
    ray: Any, actors: list[Any], runs: list[Any], results: dict[int, tuple[str, str]]
) -> None:
    """Wait for every actor to have prepared, or for one to fail first."""
    waiting = {a.ready.remote(): k for k, a in enumerate(actors)}
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while waiting and not results and time.monotonic() < deadline:
        done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=_POLL_S)
        for ref in done:
            del waiting[ref]
        finished, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
        _collect(ray, runs, results, finished)
    if waiting and not results:
        results[waiting[next(iter(waiting))]] = ("error", "never got ready")


def _watch(
    ray: Any,
    actors: list[Any],
    runs: list[Any],
    results: dict[int, tuple[str, str]],
    reporting: tuple[Reports, int, int],
) -> None:
    """Until every actor ended, or one failed: results, reports, the status line
    (``reporting``: the reports, the run's zero, the trace's request count)."""
    reports, t0, total = reporting
    asked: dict[Any, int] = {}  # status calls not answered yet -> actor
    last_ask = 0.0
    while len(results) < len(runs):
        pending = [r for k, r in enumerate(runs) if k not in results]
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
        _collect(ray, runs, results, done)
        if any(status not in ("ok", "interrupted") for status, _ in results.values()):
            return
        answered = (
            ray.wait(list(asked), num_returns=len(asked), timeout=0)[0] if asked else []
        )
        for ref in answered:
            k = asked.pop(ref)
            with contextlib.suppress(ray.exceptions.RayError):
                report = ray.get(ref)
                if report:
                    reports.add(k, {**report, "total": total})
        running = [k for k in range(len(actors)) if k not in results]
        if time.monotonic() - last_ask >= _REPORT_S:
            last_ask = time.monotonic()
            waiting = set(asked.values())
            for k in running:
                if k not in waiting:  # a silent actor is not asked twice
                    asked[actors[k].status.remote()] = k
        reports.tick(running, t0)


def _stop(
    ray: Any, actors: list[Any], runs: list[Any], results: dict[int, tuple[str, str]]
) -> None:
    """Stop the actors still running: they cancel, flush and report."""
    for k, a in enumerate(actors):
        if k not in results:
            with contextlib.suppress(ray.exceptions.RayError):
                a.stop.remote()
    deadline = time.monotonic() + _STOP_GRACE_S
    while len(results) < len(runs) and time.monotonic() < deadline:
        pending = [r for k, r in enumerate(runs) if k not in results]
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
        _collect(ray, runs, results, done)


def _failure(
    results: dict[int, tuple[str, str]], places: list[dict[str, Any]]
) -> str | None:
    for k in sorted(results):
        status, detail = results[k]
        if status == "died":
            where = places[k]
            return (
                f"Ray actor {k} on node {where['ip']} ({where['node_id'][:12]}) died"
                f": {detail}"
            )
    for k in sorted(results):
        status, detail = results[k]
        if status not in ("ok", "interrupted"):
            return f"Ray actor {k} on node {places[k]['ip']}: {detail}"
    return None


def _unfinished(
    run_dir: Path,
    trace_path: Path,
    config: ReplayConfig,
    results: dict[int, tuple[str, str]],
) -> list[RayLost]:
    """Per actor that did not finish: the session trees of its shard whose rows are
    not all in the run directory."""
    bad = [k for k, (status, _) in results.items() if status not in ("ok",)]
    if not bad:
        return []
    import pyarrow.dataset as ds

    from replayer.play.schedule import shard
    from traces.io import read_trace

    trace = read_trace(trace_path, mooncake_rows=config.mooncake_rows)
    parts = request_parts(run_dir)
    rows: dict[str, int] = {}
    if parts:
        table = ds.dataset(parts, format="parquet").to_table(
            columns=["root_session_id", "status"]
        )
        for root in table.column("root_session_id").to_pylist():
            rows[root] = rows.get(root, 0) + 1
    lost: list[RayLost] = []
    for k in sorted(bad):
        trees = shard(trace, k, config.workers).sessions
        unfinished = [
            s.session_id
            for s in trees
            if rows.get(s.session_id, 0) < sum(len(x.requests) for x, _ in s.walk())
        ]
        meta_path = run_dir / _worker_json(k)
        flushed = read_run_json(meta_path).complete if meta_path.is_file() else False
        lost.append(
            RayLost(
                worker_id=k,
                status=results[k][0],
                wrote_its_end=flushed,
                unfinished_sessions=tuple(unfinished),
            )
        )
    return lost
