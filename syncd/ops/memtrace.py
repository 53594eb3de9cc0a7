"""For diagnosing memory: SYNCD_TRACEMALLOC=<dir> traces allocations, SIGUSR2 writes a snapshot.

Off unless the variable is set (tracing costs a daemon 2-3x its CPU and a good share of its
memory). Each SIGUSR2 writes <dir>/syncd-<pid>-<n>.snap (tracemalloc.Snapshot.dump), so two
points of a run can be compared offline, grouped by traceback:

    a, b = (tracemalloc.Snapshot.load(p) for p in (first, second))
    for stat in b.compare_to(a, "traceback")[:20]: ...

SYNCD_TRACEMALLOC_FRAMES sets how many frames each traceback keeps (default 12; 0: no tracing,
only the allocator's figures, <dir>/syncd-<pid>-<n>.heap.json, as with tracing).
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import os
import signal
import sys
import tracemalloc
from pathlib import Path

from syncd.ops import allocator

ENV = "SYNCD_TRACEMALLOC"


def install() -> Path | None:
    """Start tracing and snapshot on SIGUSR2 when SYNCD_TRACEMALLOC is set; the directory."""
    where = os.environ.get(ENV)
    if not where:
        return None
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    depth = int(os.environ.get(f"{ENV}_FRAMES", "12"))
    if depth > 0:  # 0: the allocator's figures only, at no cost
        tracemalloc.start(depth)
    counter = itertools.count(1)

    def snapshot() -> None:
        path = folder / f"syncd-{os.getpid()}-{next(counter)}.snap"
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(path) + ".tmp")
            os.rename(str(path) + ".tmp", path)  # the reader sees only whole snapshots
        # And the allocator's view: Python objects are only part of what RSS holds.
        (folder / f"{path.stem}.heap.json").write_text(json.dumps(allocator.heap()))
        _pymalloc_stats(folder / f"{path.stem}.pymalloc.txt")

    # A plain handler, not loop.add_signal_handler: a busy loop's wakeup pipe can be full, and
    # then the signal is lost. It runs in the main thread between two bytecodes: for
    # diagnosis only.
    signal.signal(signal.SIGUSR2, lambda signum, frame: snapshot())
    return folder


def _pymalloc_stats(path: Path) -> None:
    """pymalloc's arenas (sys._debugmallocstats, written to fd 2 by C code: redirected) and
    the live objects by type (gc-tracked ones, and the strings, bytes and ints they hold).
    Python's small objects live in 1 MiB arenas that mallinfo does not see."""
    with open(path, "w") as out:
        out.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        objs = gc.get_objects()
        size: collections.Counter[str] = collections.Counter()
        count: collections.Counter[str] = collections.Counter()
        seen = {id(o) for o in objs}
        for o in objs:
            name = type(o).__name__
            size[name] += sys.getsizeof(o)
            count[name] += 1
            for r in gc.get_referents(o):
                if id(r) not in seen and not gc.is_tracked(r):
                    seen.add(id(r))
                    name = f"({type(r).__name__})"
                    size[name] += sys.getsizeof(r)
                    count[name] += 1
        del objs, seen
        out.write(f"\nlive objects: {sum(size.values())} bytes\n")
        for name, n in size.most_common(40):
            out.write(f"{n:12d} {count[name]:8d} {name}\n")
