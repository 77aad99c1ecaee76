"""Freed memory kept for reuse in a one-shot analysis process (glibc): fresh pages
cost the kernel's zeroing, seconds of a 10M-row analysis. See docs/benchmarks.md."""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
from typing import Any

import numpy as np

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# No trim of the heap's top as arrays are freed (the largest value mallopt takes):
# summarize gives the free pages back after its largest part instead
# (:func:`release_free_memory`), which keeps the peak RSS near that of the arrays
# alive at once (at 10M bench rows 1,802 MiB median of 9 runs, 1,902 MiB at most;
# with no release 1,903-1,912 MiB in 4 runs).
_TRIM_BYTES = 2**31 - 1
# Arrays smaller than this come from numpy as usual.
_HUGE_BYTES = 2**21


def hold_freed_memory() -> bool:
    """Make glibc serve large arrays from one heap and keep what is freed there
    for the next (no mmap per array, one arena for every thread, no trim), so
    most pages are zeroed once, not once per array.
    For processes that end after their analysis (``analyze``, the benchmark).
    False where the C library is not glibc (nothing changed).

    Call it before pandas or Arrow is imported: Arrow starts a thread at import,
    whose first allocation gives it a second arena (glibc's default allows one
    per thread up to eight a core), and the threads that come later share that
    one. A heap of a second arena holds at most 64 MiB, so there an array of
    64 MiB or more gets a mapping of its own, unmapped when freed: at 10M rows,
    7.3 GB of pages mapped, zeroed and unmapped again in one ``summarize``.
    (``import analysis.heap`` imports neither.)

    numpy stops asking for huge pages for its arrays (:func:`_plain_pages`)."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    _plain_pages()
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


def _plain_pages() -> None:
    """numpy's large arrays on 4 KiB pages, not huge ones: a huge page costs the
    kernel a 2 MiB block to find and zero at its first write, and on a virtual
    machine that cost swings with the host's memory (0.1 to 3.7 s a GiB on the
    benchmark machine within the hour, against 0.53-0.77 s for 4 KiB pages). A
    10M-row analyze: 4.96 s against 5.50 s, medians of 9 runs each, alternated.
    Nothing where numpy lacks the switch (a private one, there since 1.20)."""
    multiarray = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(
        getattr(multiarray, "multiarray", None), "_set_madvise_hugepage", None
    )
    if switch is not None:
        switch(False)


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


def page_array(length: int, dtype: Any) -> np.ndarray:
    """An uninitialised array on anonymous pages of its own: for the loaded
    columns, which live through the whole analysis. These are 4 KiB pages: asked
    for huge pages, a 10M-row load spent 2.6-2.9 s in the kernel against 0.8-1.1 s
    (three runs each on the benchmark machine). The pages go back when the array
    is freed."""
    dtype = np.dtype(dtype)
    nbytes = length * dtype.itemsize
    if nbytes < _HUGE_BYTES:
        return np.empty(length, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=dtype)
