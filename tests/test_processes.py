"""The leftover-process check of the session fixture (tests/conftest.py) sees a
child the test run started, and its children, by command line."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.processes import descendants


def test_descendants_lists_a_running_child_and_grandchild() -> None:
    # `sh` forks `sleep` (a command list is not exec'd in place).
    proc = subprocess.Popen(["sh", "-c", "sleep 61.5; exit 0"], start_new_session=True)
    try:
        found: dict[int, str] = {}
        for _ in range(200):  # until sh has forked its sleep
            found = descendants(os.getpid())
            if "sleep 61.5" in found.values():
                break
            time.sleep(0.05)
        assert found[proc.pid] == "sh -c sleep 61.5; exit 0"
        assert "sleep 61.5" in found.values()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.pid not in descendants(os.getpid())
