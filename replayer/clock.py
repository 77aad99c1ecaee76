"""The only module that reads time: one perf-counter clock for intervals, one
wall-clock anchor per run."""

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
