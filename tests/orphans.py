"""kill -9 of a replayer mid-run, and the check that nothing it started outlives it:
the process tree recorded from /proc while the run is alive, then polled after the
kill (a zombie, or a pid reused by another process, counts as gone)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from tests.builders import growing_session, trace_of
from traces.io import write_trace

REPLAYER = [sys.executable, "-m", "replayer"]
GONE_WITHIN_S = 5.0


def long_trace(path: Path) -> Path:
    """Four sessions of 40 growing turns, 50 output tokens each: a minute or more
    against the sim at speed 1."""
    trace = trace_of(
        *(
            growing_session(
                f"s{k}", 40, think=0.05, out=50, block_size=64, extra_tokens=5
            )
            for k in range(4)
        )
    )
    return write_trace(trace, path)


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of ``pid``; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> its start time."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        info = _stat(int(stat.parent.name))
        if info is not None:
            parent[int(stat.parent.name)] = info[0]
    found: set[int] = set()
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in found | {root}} - found
        grew = bool(more)
        found |= more
    return started_at(sorted(found))


def started_at(pids: list[int]) -> dict[int, int]:
    """pid -> start time, for those of ``pids`` that are alive."""
    out = {}
    for pid in pids:
        info = _stat(pid)
        if info is not None:
            out[pid] = info[2]
    return out


def alive(pids: dict[int, int]) -> list[int]:
    """Those of ``pids`` still running (not a zombie, not a reused pid)."""
    left = []
    for pid, started in pids.items():
        info = _stat(pid)
        if info is not None and info[1] != "Z" and info[2] == started:
            left.append(pid)
    return sorted(left)


def command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return "?"


@contextlib.contextmanager
def started(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """The replayer with ``args`` in its own process group, stderr kept for a
    failure message; whatever of the group is left is SIGKILLed on the way out."""
    proc = subprocess.Popen(
        [*REPLAYER, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def kill_9_mid_run(
    args: list[str],
    out: Path,
    *,
    expect: Callable[[dict[int, int]], bool],
    also: Callable[[], dict[int, int]] = dict,
) -> tuple[dict[int, int], list[str]]:
    """Start the replayer, let it write a part file and start what ``expect`` wants
    (its process tree, plus ``also()``), kill -9 it alone, and return the recorded
    processes and those still alive ``GONE_WITHIN_S`` later ("pid: command"). Each
    part file written opens with pyarrow."""
    seen: dict[int, int] = {}
    with started(args) as proc:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= descendants(proc.pid) | also()
            parts = list(out.glob("**/requests/part-*.parquet"))
            if parts and expect(seen):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        seen |= descendants(proc.pid) | also()
        assert expect(seen), [command(p) for p in seen]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while alive(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = alive(seen)
        described = [f"{pid}: {command(pid)}" for pid in left]
    for part in out.glob("**/requests/part-*.parquet"):
        assert pq.read_table(part).num_rows > 0, part
    return seen, described
