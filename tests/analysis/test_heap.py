"""Freed memory held for reuse in a one-shot analysis process."""

from __future__ import annotations

import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from replayer.records import RequestRecord

_GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"

# Prints glibc's arenas at exit (malloc_stats writes "Arena N:" lines to stderr).
_ARENAS_AT_EXIT = (
    "import atexit, ctypes, sys\n"
    "atexit.register(lambda: (sys.stderr.flush(), ctypes.CDLL(None).malloc_stats()))\n"
)


def _arenas(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Arena ")]


def _child(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter (the heap settings are process-wide)."""
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )


def test_hold_and_release_freed_memory_on_glibc_and_arrays_still_work() -> None:
    code = (
        "import numpy as np\n"
        "from analysis.heap import hold_freed_memory, release_free_memory\n"
        "print(hold_freed_memory())\n"
        "for _ in range(3):\n"
        "    a = np.arange(20_000_000, dtype=np.float64)\n"
        "    assert a.sum() == (20_000_000 - 1) * 20_000_000 / 2\n"
        "    del a\n"
        "    release_free_memory()\n"
    )
    assert _child(code).stdout.strip() == str(_GLIBC)


def test_page_arrays_hold_what_is_written() -> None:
    from analysis.heap import page_array

    for length, dtype in ((10, np.int8), (3_000_000, np.float32), (0, np.int64)):
        a = page_array(length, dtype)
        assert a.dtype == dtype
        assert a.shape == (length,)
        assert a.flags.writeable
        a[:] = np.arange(length) % 100
        assert np.array_equal(a, (np.arange(length) % 100).astype(dtype))


@pytest.mark.skipif(not _GLIBC, reason="glibc's heap")
def test_held_memory_is_one_heap_for_every_thread_after_arrow_starts() -> None:
    # Arrow starts a thread at import, and glibc fixes how many heaps (arenas)
    # its threads get at that thread's first allocation: hold_freed_memory must
    # come first, so its one heap holds, and importing analysis.heap (the
    # package) must not import pandas or Arrow.
    code = _ARENAS_AT_EXIT + (
        "from analysis.heap import hold_freed_memory\n"
        "assert 'pyarrow' not in sys.modules and 'pandas' not in sys.modules\n"
        "hold_freed_memory()\n"
        "import threading\n"
        "import numpy as np\n"
        "import pandas, pyarrow\n"
        "def work():\n"
        "    for _ in range(3):\n"
        "        a = np.ones(10_000_000)\n"
        "        del a\n"
        "threads = [threading.Thread(target=work) for _ in range(4)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
    )
    assert _arenas(_child(code).stderr) == ["Arena 0:"]


@pytest.mark.skipif(not _GLIBC, reason="glibc's heap")
def test_analyze_holds_one_heap(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    records = [
        rec(session_id=f"s{i // 5}", request_index=i % 5, start_ns=i * 1_000_000)
        for i in range(200)
    ]
    run = make_run_dir(tmp_path / "run", records, parts=3)
    code = _ARENAS_AT_EXIT + (
        "from replayer.cli import main\n"
        # --slo is parsed before the command's body: it must not import pandas.
        f"main(['analyze', {str(run)!r}, '--json', '--slo', 'ttft=2s'])\n"
    )
    assert _arenas(_child(code).stderr) == ["Arena 0:"]


@pytest.mark.skipif(not _GLIBC, reason="glibc's heap")
def test_held_memory_is_on_plain_pages() -> None:
    # numpy stops asking the kernel for huge pages for its arrays.
    code = (
        "import numpy as np\n"
        "from analysis.heap import hold_freed_memory\n"
        "multiarray = np._core.multiarray\n"
        "hold_freed_memory()\n"
        "print(multiarray._get_madvise_hugepage())\n"
    )
    assert _child(code).stdout.strip() == "False"
