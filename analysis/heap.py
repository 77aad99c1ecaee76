"""Freed memory kept for reuse in a one-shot analysis process (glibc): fresh pages
cost the kernel's zeroing, seconds of a 10M-row analysis."""

from __future__ import annotations

import ctypes
import platform
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# Free room at the heap's top past this goes back to the OS, which keeps the peak
# RSS near that of the arrays alive at once (at 10M bench rows 1,846-1,893 MiB in
# 3 runs; 1,860-2,036 MiB in 4 with no trim at all).
_TRIM_BYTES = 128 << 20


def hold_freed_memory() -> bool:
    """Make glibc serve large arrays from one heap and keep what is freed there
    for the next (no mmap per array, one arena for every thread, the top trimmed
    past ``_TRIM_BYTES``), so most pages are zeroed once, not once per array.
    For processes that end after their analysis (``analyze``, the benchmark).
    False where the C library is not glibc (nothing changed)."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a glibc without it
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_MAX, 0),
            (_M_TRIM_THRESHOLD, 2147483647),
        )
    )
