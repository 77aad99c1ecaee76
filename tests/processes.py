"""The processes a test run left behind: the live descendants of a process, read
from /proc (each process's parent id), with their command lines."""

from __future__ import annotations

from pathlib import Path


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
