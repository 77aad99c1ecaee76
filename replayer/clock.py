"""The request path's time: the Clock every row stamp comes from (perf_counter_ns, or
virtual time), the run's one wall-clock anchor, CPU-time readers. Supervisors, Ray's
clock offsets and the sim read time themselves, off the request path."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int: ...

    async def sleep_until(self, deadline_ns: int) -> None: ...


class MonotonicClock:
    """perf_counter_ns; sleeps against absolute deadlines, never accumulating drift."""

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    async def sleep_until(self, deadline_ns: int) -> None:
        delay_ns = deadline_ns - time.perf_counter_ns()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / 1e9)
        else:
            await asyncio.sleep(0)


def wall_clock_ns() -> int:
    """Unix time in ns: the run's one wall-clock anchor."""
    return time.time_ns()


def thread_cpu_ns() -> int:
    """CPU time of the calling thread (the event loop's, when called on it)."""
    return time.thread_time_ns()


def process_cpu_ns() -> int:
    """CPU time of the whole process, every thread."""
    return time.process_time_ns()
