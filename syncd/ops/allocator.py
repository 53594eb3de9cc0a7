"""glibc's allocator, set for a daemon that moves 256 KiB frames.

glibc maps a block past its mmap threshold (128 KiB at first) with mmap() and unmaps it when
freed. paho-mqtt builds each received message by appending and slicing it several times, so
every 256 KiB chunk of a catch-up cost some fresh mappings: pages faulted in, zeroed and
unmapped again, 0.5 ms per chunk on the reference machine (`python -m bench.bench_frames`),
half the standby's CPU at 100 MB/s. Served from the heap, and the heap not trimmed back after
every free, the same work costs 0.06 ms. What the heap keeps is bounded by TRIM_THRESHOLD.

Environment variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) set by an operator win.
Elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 16 << 20  # chunk_bytes is at most 16 MiB: every frame comes from the heap
TRIM_THRESHOLD = 32 << 20  # free memory at the top of the heap kept for the next frames


def tune() -> bool:
    """Set the thresholds; whether they were set (False: not glibc, or set by environment)."""
    if any(v in os.environ for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
