"""Keep freed memory in the process instead of handing it back to the OS.

glibc serves blocks over its mmap threshold (at most 32 MB by default) with fresh mappings and unmaps
them when freed, so every tensor of that size is page-faulted in again, zero-filled page by page. Draft
training allocates such tensors (logits over the draft vocabulary for thousands of positions) dozens of
times a step: a step took about twice as long (docs/measurements/distill.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
LARGEST = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and never trim it, so freed tensors' pages are reused; whether the
    C library took it (only glibc's mallopt does)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGEST) and mallopt(M_TRIM_THRESHOLD, LARGEST))
