"""`replayer ARGS` in a child process, measured: wall time, CPU time and the child's
own peak RSS (its ``VmHWM``, read as it exits). Not ``ru_maxrss`` from ``wait4``: the
kernel starts a child's at its parent's resident size at the fork and keeps it through
exec, so a child could only ever show at least its parent's size.

    from childpeak import run_replayer
    got = run_replayer(["generate", "--preset", "agentx", "--out", "x.parquet"])
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# Runs `python -m replayer ARGS` (the same __main__) and, as the interpreter exits
# (a click command ends with SystemExit), writes VmHWM (KiB) to the file named first.
_SHIM = """\
import atexit, runpy, sys
out = sys.argv[1]
def _peak():
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('VmHWM:'):
                with open(out, 'w') as f:
                    f.write(line.split()[1])
atexit.register(_peak)
sys.argv = ['replayer', *sys.argv[2:]]
runpy.run_module('replayer', run_name='__main__', alter_sys=True)
"""


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float  # user + sys of the child and of any children it waited for
    # The child's own VmHWM (not its children's); NaN when it did not reach its
    # exit hook (killed, or os._exit), which also ends with a nonzero returncode.
    peak_mib: float
    returncode: int


def run_replayer(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: IO[Any] | int | None = subprocess.DEVNULL,
    stderr: IO[Any] | int | None = None,
    pin: Sequence[str] = (),
) -> Measured:
    """``replayer ARGS`` (``pin``: a prefix such as ``taskset -c 1``), measured."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "vmhwm"
        cmd = [*pin, sys.executable, "-c", _SHIM, str(peak_file), *args]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here
        try:
            peak = int(peak_file.read_text()) / 1024
        except (OSError, ValueError):
            peak = float("nan")
    return Measured(wall, usage.ru_utime + usage.ru_stime, peak, code)
