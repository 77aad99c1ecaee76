"""The client's self-check: whether the replayer, not the server, limited a run (the
status line, and ``run.json`` ``client_check``). See
docs/scale-out.md#client-self-check."""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from replayer.clock import Clock, process_cpu_ns, thread_cpu_ns
from replayer.records.meta import ClientCheck
from traces.stats import percentiles

if TYPE_CHECKING:
    from replayer.play.progress import RunCounters

_TICK_NS = 10_000_000  # the lag probe's period
_WINDOW_NS = 1_000_000_000  # CPU shares and the live verdict, per window
_LIVE_WINDOWS = 3  # the status line flags a limit crossed in any of the latest
# Per-request figures are judged over at least this many requests: a P99 of a few
# is their worst one (the first connection of a lane, say).
_MIN_REQUESTS = 100
# A process using less CPU than this (cores) whose loop still lags was kept waiting
# by other processes: more workers would not help, other cores would.
_STARVED_CORES = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class SelfCheckLimits:
    """Past these, the client is what limits the run."""

    # A loop this late delays every chunk stamp and every send by as much.
    loop_lag_p99_ms: float = 50.0
    # Median 1-s window of the loop thread's CPU, of one core: a loop this busy has
    # no slack left, whatever its lag so far.
    loop_cpu_share: float = 0.9
    # Requests queued this long for a free slot under the client's own cap (the
    # connector's limit, --max-inflight): the client, not the server.
    slot_wait_p99_ms: float = 10.0
    # New connections this slow to open: the server is slow to accept (its listen
    # backlog full, SYNs held or dropped). Said, not flagged: the server's time.
    connect_p99_ms: float = 10.0
    # Requests sent this late after their due time (start_ns - scheduled_ns): an
    # open-loop schedule the client cannot keep up with.
    dispatch_lag_p99_ms: float = 50.0


def _stats(values: Any, qs: tuple[int, ...], scale: float) -> dict[str, float]:
    if not len(values):
        return {}
    got = percentiles(values, list(qs))
    out = {f"p{q}": float(v) / scale for q, v in zip(qs, got, strict=True)}
    out["max"] = float(max(values)) / scale
    return out


def _p99_ms(values: Any, least: int = 1) -> float | None:
    return percentiles(values, [99])[0] / 1e6 if len(values) >= least else None


def _reasons(
    lag_p99_ms: float | None,
    cpu_p50: float | None,
    slot_p99_ms: float | None,
    dispatch_p99_ms: float | None,
    limits: SelfCheckLimits,
    process_cores: float | None = None,
    dispatch_parts: dict[str, float] | None = None,
) -> list[str]:
    reasons = []
    if lag_p99_ms is not None and lag_p99_ms > limits.loop_lag_p99_ms:
        why = f"event-loop lag P99 {lag_p99_ms:,.0f} ms > {limits.loop_lag_p99_ms:g} ms"
        if process_cores is not None and process_cores < _STARVED_CORES:
            # Late without being busy: the loop was ready and not scheduled.
            why += (
                f" with this process at {process_cores:.0%} of a core: other "
                "processes held this machine's CPUs (a server on the same cores?)"
            )
        reasons.append(why)
    if cpu_p50 is not None and cpu_p50 >= limits.loop_cpu_share:
        reasons.append(
            f"event-loop thread at {cpu_p50:.0%} of a core "
            f"(>= {limits.loop_cpu_share:.0%})"
        )
    if slot_p99_ms is not None and slot_p99_ms > limits.slot_wait_p99_ms:
        reasons.append(
            f"connection-slot wait P99 {slot_p99_ms:,.1f} ms "
            f"> {limits.slot_wait_p99_ms:g} ms (the client's own connection cap)"
        )
    if dispatch_p99_ms is not None and dispatch_p99_ms > limits.dispatch_lag_p99_ms:
        why = (
            f"requests sent late: dispatch lag P99 {dispatch_p99_ms:,.0f} ms "
            f"> {limits.dispatch_lag_p99_ms:g} ms"
        )
        if dispatch_parts:
            why += _slowest_part(dispatch_parts, lag_p99_ms, limits, process_cores)
        reasons.append(why)
    return reasons


# The parts of a send's lateness, as the reason names them.
_PARTS = {
    "build": "building prompts (with the wait for the build thread)",
    "wake": "the event loop waking up late",
    "rest": "after the prompt was built (the --max-inflight cap, headers)",
}


def _slowest_part(
    parts: dict[str, float],
    lag_p99_ms: float | None,
    limits: SelfCheckLimits,
    process_cores: float | None,
) -> str:
    """Which part of the dispatch lag (``_PARTS``: P99s in ms) was the slowest, and
    the others' P99s. Late wake-ups with a loop its probe found on time were sends
    due together (lanes starting at once), each after the sends before it; with a
    late loop in a process that barely ran, other processes held the CPUs."""
    worst = max(parts, key=parts.__getitem__)
    others = ", ".join(f"{k} P99 {v:,.1f} ms" for k, v in parts.items() if k != worst)
    why = f", most of it {_PARTS[worst]}: P99 {parts[worst]:,.1f} ms ({others})"
    if worst != "wake" or lag_p99_ms is None:
        return why
    if lag_p99_ms <= limits.loop_lag_p99_ms:
        return why + (
            f" while the loop's own lag P99 was {lag_p99_ms:,.1f} ms: many sends "
            "due at the same moment (lanes starting together), each sent after the "
            "ones before it"
        )
    if process_cores is not None and process_cores < _STARVED_CORES:
        why += (
            f" with this process at {process_cores:.0%} of a core: other "
            "processes held this machine's CPUs"
        )
    return why


def dispatch_parts(
    lags: Any, wakes: Any, builds: Any, least: int = _MIN_REQUESTS
) -> dict[str, float]:
    """P99 (ms) of each part of the dispatch lag (``_PARTS``) over the same requests:
    empty when the parts were not stamped for every one or are too few."""
    n = len(lags)
    if n < least or len(wakes) != n or len(builds) != n:
        return {}
    lag, wake, build = (np.frombuffer(a, dtype=np.int64) for a in (lags, wakes, builds))
    rest = np.maximum(lag - wake - build, 0)
    named = (("build", build), ("wake", wake), ("rest", rest))
    return {k: _p99_ms(v) or 0.0 for k, v in named}


def _server_notes(connect_p99_ms: float | None, limits: SelfCheckLimits) -> list[str]:
    if connect_p99_ms is not None and connect_p99_ms > limits.connect_p99_ms:
        return [
            f"server slow to accept connections: connect P99 {connect_p99_ms:,.1f} ms "
            f"> {limits.connect_p99_ms:g} ms (the server's time, not the client's)"
        ]
    return []


class LoopMonitor:
    """Probes the loop it runs on; owned by that loop (no locks).

    Each process (one process, a ``--workers`` worker, a Ray actor) measures while it
    replays: its event loop's lag (a timer's actual wake-up minus its scheduled one:
    every stamp the loop takes is late by as much), the CPU its loop thread uses (of one
    core: a loop cannot use more), each request's wait for a free connection slot under
    the client's own cap (``slot_wait_ns``) and how late it was sent (``start_ns -
    scheduled_ns``). Past a limit, the status line says so while the run goes on, and
    ``run.json`` ``client_check`` says so after: ``limited`` and one plain reason per
    limit crossed. The time a new connection takes to open (``connect_ns``: the server's
    accept) is the server's: reported in ``server_notes`` when slow, never a reason.
    """

    def __init__(
        self,
        clock: Clock,
        counters: RunCounters,
        limits: SelfCheckLimits | None = None,
        *,
        warmup_s: float = 0.0,
    ) -> None:
        self.clock = clock
        self.counters = counters
        self.warmup_ns = int(warmup_s * 1e9)  # probes before it are not judged
        self.limits = limits or SelfCheckLimits()
        self.lags_ns = array.array("q")  # 8 bytes per 10 ms: 2.9 MB per hour
        self.loop_cpu = array.array("d")  # per window, share of one core
        self.process_cpu = array.array("d")  # per window, cores
        self._live: collections.deque[list[str]] = collections.deque(
            maxlen=_LIVE_WINDOWS
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop`` is set."""
        clock = self.clock
        window_start = clock.now_ns()
        measured_from = window_start + self.warmup_ns
        c = self.counters
        lag_from, sent_from = 0, len(c.dispatch_lags_ns)
        slot_from = len(c.slot_waits_ns)
        cpu0, proc0 = thread_cpu_ns(), process_cpu_ns()
        due = window_start + _TICK_NS
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0, due - clock.now_ns()) / 1e9):
                    await stop.wait()
            now = clock.now_ns()
            if now >= measured_from:
                self.lags_ns.append(max(0, now - due))
            due = now + _TICK_NS
            if now - window_start >= _WINDOW_NS:
                cpu1, proc1 = thread_cpu_ns(), process_cpu_ns()
                wall = now - window_start
                cpu = (cpu1 - cpu0) / wall
                if window_start >= measured_from:
                    self.loop_cpu.append(cpu)
                    self.process_cpu.append((proc1 - proc0) / wall)
                self._live.append(
                    _reasons(
                        _p99_ms(self.lags_ns[lag_from:]),
                        cpu,
                        _p99_ms(c.slot_waits_ns[slot_from:], _MIN_REQUESTS),
                        _p99_ms(c.dispatch_lags_ns[sent_from:], _MIN_REQUESTS),
                        self.limits,
                        (proc1 - proc0) / wall,
                        dispatch_parts(
                            c.dispatch_lags_ns[sent_from:],
                            c.wake_lags_ns[sent_from:],
                            c.build_waits_ns[sent_from:],
                        ),
                    )
                )
                self.counters.client_limit = next(
                    (r[0] for r in reversed(self._live) if r), None
                )
                window_start, cpu0, proc0 = now, cpu1, proc1
                lag_from, sent_from = len(self.lags_ns), len(c.dispatch_lags_ns)
                slot_from = len(c.slot_waits_ns)

    def check(self) -> ClientCheck:
        """The verdict over the whole run so far."""
        lag = _stats(self.lags_ns, (50, 99), 1e6)
        cpu = _stats(self.loop_cpu, (50, 90), 1.0)
        c = self.counters
        process = _stats(self.process_cpu, (50,), 1.0)
        reasons = _reasons(
            lag.get("p99"),
            cpu.get("p50"),
            _p99_ms(c.slot_waits_ns, _MIN_REQUESTS),
            _p99_ms(c.dispatch_lags_ns, _MIN_REQUESTS),
            self.limits,
            process.get("p50"),
            dispatch_parts(c.dispatch_lags_ns, c.wake_lags_ns, c.build_waits_ns),
        )
        return ClientCheck(
            limited=bool(reasons),
            reasons=tuple(reasons),
            loop_lag_ms=lag,
            loop_cpu_share=cpu,
            process_cpu_cores=process,
            pool_wait_ms=_stats(c.pool_waits_ns, (50, 99), 1e6),
            slot_wait_ms=_stats(c.slot_waits_ns, (50, 99), 1e6),
            connect_ms=_stats(c.connects_ns, (50, 99), 1e6),
            dispatch_lag_ms=_stats(c.dispatch_lags_ns, (50, 99), 1e6),
            limits=asdict(self.limits),
            server_notes=tuple(
                _server_notes(_p99_ms(c.connects_ns, _MIN_REQUESTS), self.limits)
            ),
        )


def merge_checks(checks: dict[int, ClientCheck]) -> ClientCheck | None:
    """Several processes' ``client_check`` as one: limited when any was, each
    reason and server note naming its worker, every figure the worst worker's; the
    workers' own under ``workers``."""
    if not checks:
        return None
    ordered = sorted(checks.items())

    def named(notes: str) -> tuple[str, ...]:
        return tuple(f"worker {k}: {r}" for k, c in ordered for r in getattr(c, notes))

    def worst(figure: str) -> dict[str, float]:
        stats: dict[str, float] = {}
        for c in checks.values():
            for stat, value in getattr(c, figure).items():
                stats[stat] = max(stats.get(stat, value), value)
        return stats

    return ClientCheck(
        limited=any(c.limited for c in checks.values()),
        reasons=named("reasons"),
        server_notes=named("server_notes"),
        loop_lag_ms=worst("loop_lag_ms"),
        loop_cpu_share=worst("loop_cpu_share"),
        process_cpu_cores=worst("process_cpu_cores"),
        pool_wait_ms=worst("pool_wait_ms"),
        slot_wait_ms=worst("slot_wait_ms"),
        connect_ms=worst("connect_ms"),
        dispatch_lag_ms=worst("dispatch_lag_ms"),
        limits=dict(next(iter(checks.values())).limits),
        workers={str(k): c for k, c in ordered},
    )
