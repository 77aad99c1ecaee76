"""Fixtures shared by all test packages: where the real sample traces live, and the
session's check that no test left a process running."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The real traces sit beside the repository (../shared/data), never inside it.
SHARED_DATA = REPO / ".." / "shared" / "data"

# Children still exiting when the session ends (a SIGTERM'd server flushing) get
# this long before they count as left behind.
_LEFTOVER_GRACE_S = 10.0


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """At the end of the session, fail naming every process the tests started that
    still runs (and kill it, so that it does not outlive the run). Engines started
    by .ci/engines.sh are not pytest's children and do not count."""
    from tests.processes import descendants

    yield
    _stop_resource_tracker()
    deadline = time.monotonic() + _LEFTOVER_GRACE_S
    left = descendants(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = descendants(os.getpid())
    if not left:
        return
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    listed = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items()))
    pytest.fail(f"the tests left {len(left)} process(es) running:\n{listed}")


def _stop_resource_tracker() -> None:
    """End multiprocessing's resource tracker if a ``--workers`` test started it.

    The tracker belongs to this (pytest's) process, not to a test: spawn starts it once
    per process and it exits on EOF when its owner does. pytest's process outlives the
    check, so stop it here the way multiprocessing does at interpreter exit."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``<repo>/../shared/data``; skips the test when the sample data is absent."""
    if not (SHARED_DATA / "weka").is_dir():
        pytest.skip(f"real sample traces not found at {SHARED_DATA.resolve()}")
    return SHARED_DATA.resolve()


@pytest.fixture(scope="session")
def weka_dir(shared_data: Path) -> Path:
    """The folder of 30 real Weka/AgentX session files."""
    return shared_data / "weka"


@pytest.fixture(scope="session")
def mooncake_file(shared_data: Path) -> Path:
    """The real Mooncake conversation trace (JSONL, one request per line)."""
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"Mooncake sample not found at {path}")
    return path
