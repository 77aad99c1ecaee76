"""An asyncio event loop on virtual time: when nothing is ready, time jumps to the next
timer or engine event instead of sleeping, so the replayer's own request path runs a
whole trace in seconds. See docs/engine-model.md."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import selectors
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

from replayer.errors import ReplayerError

T = TypeVar("T")

# How long the loop waits for real while a worker thread runs (virtual time holds
# still meanwhile, so a thread's work takes no virtual time and the run stays exact).
_THREAD_POLL_S = 0.05
_STALL_S = 30.0


class VirtualDriver(Protocol):
    """The simulated engine's side of the loop."""

    def advance(self, limit_ns: int | None) -> int | None:
        """Run the engine until its next client-visible event at or before
        ``limit_ns`` (None: no limit) and deliver it; its time, or None when the
        engine has nothing to show by then (it is then stepped no further than
        steps starting before ``limit_ns``)."""
        ...


class VirtualStall(ReplayerError):
    """Nothing is scheduled and the engine is idle, yet the run has not ended."""


class _Selector(selectors.BaseSelector):
    """The loop's selector: real sockets and the self-pipe are still polled (without
    waiting); where the loop would block, virtual time moves instead."""

    def __init__(self, loop: VirtualLoop, inner: selectors.BaseSelector) -> None:
        self._loop = loop
        self._inner = inner

    def register(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> Any:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[Any]:
        events = self._inner.select(0)
        if events or timeout == 0:
            return events
        loop = self._loop
        if loop.threads_running:
            wait = _THREAD_POLL_S if timeout is None else min(timeout, _THREAD_POLL_S)
            return self._inner.select(wait)
        limit = (
            None if timeout is None else loop.now_ns + max(1, math.ceil(timeout * 1e9))
        )
        sleepers = loop.sleepers
        while sleepers and sleepers[0][2].done():  # cancelled sleeps
            heapq.heappop(sleepers)
        if sleepers and (limit is None or sleepers[0][0] <= limit):
            limit = sleepers[0][0]  # exact: a clock sleep ends on its nanosecond
        driver = loop.driver
        event_ns = driver.advance(limit) if driver is not None else None
        if event_ns is not None:
            loop.now_ns = max(loop.now_ns, event_ns)
            return []
        if limit is not None:
            loop.now_ns = limit
            while sleepers and sleepers[0][0] <= limit:
                future = heapq.heappop(sleepers)[2]
                if not future.done():
                    future.set_result(None)
            return []
        # Nothing virtual is due: only a thread of asyncio's own (an executor's
        # shutdown) can still wake the loop. Wait for it for real, within reason.
        events = self._inner.select(_STALL_S)
        if not events:
            raise VirtualStall(
                f"virtual run stalled: nothing was due for {_STALL_S:.0f} s "
                "(no timer set, the simulated engine idle)"
            )
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` is virtual (``now_ns``, exact integer nanoseconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.now_ns = 0
        self.driver: VirtualDriver | None = None
        self.threads_running = 0
        # VirtualClock sleeps, on exact integer deadlines: (deadline_ns, seq, future).
        self.sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sleep_seq = 0
        self._selector = _Selector(self, self._selector)  # type: ignore[has-type]

    def time(self) -> float:
        return self.now_ns / 1e9

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_running += 1
        future.add_done_callback(self._thread_done)
        return future

    def next_sleep_seq(self) -> int:
        self._sleep_seq += 1
        return self._sleep_seq

    def _thread_done(self, _future: asyncio.Future[Any]) -> None:
        self.threads_running -= 1


class VirtualClock:
    """The replayer's Clock on a VirtualLoop's time."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop

    def now_ns(self) -> int:
        return self._loop.now_ns

    async def sleep_until(self, deadline_ns: int) -> None:
        loop = self._loop
        if deadline_ns <= loop.now_ns:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(loop.sleepers, (deadline_ns, loop.next_sleep_seq(), future))
        await future


def run_virtual(
    factory: Callable[[VirtualLoop], Awaitable[T]],
) -> T:
    """Run ``factory(loop)`` to completion on a fresh VirtualLoop. Ctrl-C or SIGTERM
    cancel it, as ``run_async`` does a live run: every ``finally`` flushes (the rows
    recorded so far, run.json's end), then KeyboardInterrupt comes out."""
    loop = VirtualLoop()
    signals: list[int] = []
    try:
        asyncio.set_event_loop(loop)
        task: asyncio.Future[T] = asyncio.ensure_future(factory(loop), loop=loop)

        def stop(signum: int) -> None:
            signals.append(signum)
            task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, stop, signum)
        try:
            result = loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        if signals:  # it came as the work ended: still a request to stop
            raise KeyboardInterrupt
        return result
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
