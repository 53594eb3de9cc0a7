"""glibc's allocator, set for a daemon that moves 256 KiB frames.

glibc maps a block past its mmap threshold (128 KiB at first) with mmap() and unmaps it when
freed. paho-mqtt builds each received message by appending and slicing it several times, so
every 256 KiB chunk of a catch-up cost some fresh mappings: pages faulted in, zeroed and
unmapped again, 0.5 ms per chunk on the reference machine (`python -m bench.bench_frames`),
half the standby's CPU at 100 MB/s. Served from the heap, and the heap not trimmed back after
every free, the same work costs 0.06 ms. What the heap keeps is bounded by TRIM_THRESHOLD.

Environment variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_ARENA_MAX) set
by an operator win. Elsewhere than glibc nothing changes.

One arena (ARENA_MAX): every thread allocates from the main heap. By default glibc gives each
thread that meets a locked arena one of its own (up to 8 per core), and with the thresholds
above each keeps up to TRIM_THRESHOLD free at its top: the reads, hashes and status replies
made off the loop (asyncio.to_thread) left 12 such arenas holding 8-18 MiB per victim under
the hostile chaos mode, growing through the run, beside a main heap with tens of MiB free.
syncd's threads hold the GIL while they allocate, so sharing one arena costs no contention
that matters (docs/peer-limits.md).

What the heap keeps free is given back every TRIM_INTERVAL seconds (`keep_trimmed`:
malloc_trim(0), which also releases the free pages inside the heap, not only at its top).
Frames of many sizes leave holes that the top-only trim never returns: under the hostile
chaos mode (tests/support/hostile_chaos.py, 800 frames) a victim's heap held 18 MiB in use
and 27 MiB free, all of it resident. docs/peer-limits.md has the figures.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENA_MAX = 1
MMAP_THRESHOLD = 16 << 20  # chunk_bytes is at most 16 MiB: every frame comes from the heap
TRIM_THRESHOLD = 32 << 20  # free memory at the top of the heap kept for the next frames
# (8 MiB made a 256 MB catch-up about 10 % slower: every frame grew the heap again)
# Between two trims the heap may keep what one second of frames freed; a trim of a 50 MiB
# heap costs about a millisecond, and the pages it gives back are faulted in again only
# when used.
TRIM_INTERVAL = 1.0


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
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(M_ARENA_MAX, ARENA_MAX)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # Once: ctypes.util.find_library runs `ldconfig -p` in a subprocess.
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def trim() -> bool:
    """Give the heap's free pages back to the system (glibc's malloc_trim(0)); whether any
    were. False elsewhere than glibc."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return bool(fn(0))


def worth_trimming(free: int | None) -> bool:
    """Whether the heap's free bytes (mallinfo2's fordblks; None: unknown) are worth a trim:
    past TRIM_THRESHOLD. A trim walks the heap (5-13 ms with 100 MiB free, on the loop), so a
    quiet heap is not walked every second."""
    return free is None or free > TRIM_THRESHOLD


async def keep_trimmed(interval: float = TRIM_INTERVAL) -> None:
    """Trim the heap every `interval` seconds while it holds more than TRIM_THRESHOLD free,
    for as long as the daemon runs."""
    libc = _libc()
    if getattr(libc, "malloc_trim", None) is None:
        return
    while True:
        await asyncio.sleep(interval)
        if worth_trimming(heap().get("fordblks")):
            trim()


MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
             "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]


def heap() -> dict[str, int]:
    """glibc's mallinfo2(): bytes of the heap in use (uordblks), free in it (fordblks), free
    at its top (keepcost), mapped apart (hblkhd). Empty elsewhere than glibc >= 2.33."""
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is None:
        return {}
    fn.restype = _MallInfo2
    got = fn()
    return {f: int(getattr(got, f)) for f in MALLINFO2}
