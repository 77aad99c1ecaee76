"""Freed memory kept for reuse in a one-shot analysis process (glibc): fresh pages
cost the kernel's zeroing, seconds of a 10M-row analysis. See docs/benchmarks.md."""

from __future__ import annotations

import ctypes
import platform
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# No trim of the heap's top as arrays are freed (the largest value mallopt takes):
# summarize gives the free pages back after its largest parts instead
# (:func:`release_free_memory`), which keeps the peak RSS near that of the arrays
# alive at once (at 10M bench rows 1,835-1,914 MiB in 3 runs; 1,951-1,992 MiB with
# no release, 1,824-1,949 MiB with a 128 MiB trim threshold beside the release).
_TRIM_BYTES = 2**31 - 1


def hold_freed_memory() -> bool:
    """Make glibc serve large arrays from one heap and keep what is freed there
    for the next (no mmap per array, one arena for every thread, no trim), so
    most pages are zeroed once, not once per array.
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
            (_M_TRIM_THRESHOLD, _TRIM_BYTES),
        )
    )


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``): between
    the parts of an analysis, so the room one part freed does not add to the
    peak beside the next. Nothing where the C library is not glibc."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # pragma: no cover - a glibc without it
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
