"""Freed memory held for reuse in a one-shot analysis process."""

from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np


def test_hold_and_release_freed_memory_on_glibc_and_arrays_still_work() -> None:
    # In a child: the setting is process-wide.
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
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert out == str(glibc)


def test_page_arrays_hold_what_is_written() -> None:
    from analysis.heap import page_array

    for length, dtype in ((10, np.int8), (3_000_000, np.float32), (0, np.int64)):
        a = page_array(length, dtype)
        assert a.dtype == dtype
        assert a.shape == (length,)
        assert a.flags.writeable
        a[:] = np.arange(length) % 100
        assert np.array_equal(a, (np.arange(length) % 100).astype(dtype))
