"""Processes of the tests: the real `replayer` CLI run as a subprocess, and what a
test run left behind (the live descendants of a process, read from /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPLAYER = [sys.executable, "-m", "replayer"]


def run_cli(
    *args: str,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``replayer ARGS...`` to its end, output captured (``env`` adds to this
    process's environment)."""
    return subprocess.run(
        [*REPLAYER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        check=False,
    )


def descendants(pid: int) -> dict[int, str]:
    """``pid``'s children, their children and so on that still run (zombies, which
    hold no resources, are left out): pid → command line."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may hold spaces and parentheses: split after the last.
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(stat.parent.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found[child] = _command_line(child)
        todo.extend(children.get(child, []))
    return found


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"
