"""Child processes that die with their parent, kill -9 included: Linux's parent-death
signal, and a pipe only the parent holds, watched by a thread (any POSIX; also a parent
that died before the signal was armed). See docs/scale-out.md#workers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
ENV = "REPLAYER_LIFELINE"  # "PARENT_PID:FD" for a `python -m replayer` child
GRACE_S = 3.0  # after the parent's death: time to flush before SIGKILL


def _parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the parent dies; whether it took. It fires
    when the parent *thread* that started this process exits: the callers start
    their children from the thread that waits for them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _end(signum: int | None, grace_s: float) -> None:
    """``signum`` to this process (it may flush and exit), then SIGKILL."""
    if signum is not None:
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), signum)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(fd: int | None, signum: int | None, grace_s: float) -> None:
    """Wait for EOF on ``fd`` (None: the parent is already gone), then end."""
    with contextlib.suppress(OSError):
        while fd is not None and os.read(fd, 4096):  # the parent never writes
            pass
    _end(signum, grace_s)


def hold(
    parent_pid: int,
    watch_fd: int | None = None,
    *,
    signum: int = signal.SIGTERM,
    grace_s: float = GRACE_S,
) -> None:
    """In a child: end this process (``signum``, then SIGKILL after ``grace_s``) when
    ``parent_pid`` dies, or when ``watch_fd`` (the read end of a pipe whose write end
    the parent holds) reaches EOF."""
    armed = _parent_death_signal(signum)
    if os.getppid() != parent_pid:  # it died before the signal was armed
        watch_fd = None
        armed = False
    elif watch_fd is None:
        return
    # With the kernel's signal armed, the pipe's EOF only brings the SIGKILL: a
    # second SIGTERM would cancel the flush that the first one started.
    threading.Thread(
        target=_watch,
        args=(watch_fd, None if armed else signum, grace_s),
        daemon=True,
        name="lifeline",
    ).start()


def hold_from_env() -> None:
    """:func:`hold` for a `python -m replayer` child whose parent set ``ENV``
    (removed, so that nothing this process starts inherits it)."""
    value = os.environ.pop(ENV, "")
    pid, _, fd = value.partition(":")
    if pid.isdigit():
        hold(int(pid), int(fd) if fd.isdigit() else None)
