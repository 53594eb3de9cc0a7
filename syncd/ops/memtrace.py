"""For diagnosing memory: SYNCD_TRACEMALLOC=<dir> traces allocations, SIGUSR2 writes a snapshot.

Off unless the variable is set (tracing costs a daemon 2-3x its CPU and a good share of its
memory). Each SIGUSR2 writes <dir>/syncd-<pid>-<n>.snap (tracemalloc.Snapshot.dump), so two
points of a run can be compared offline, grouped by traceback:

    a, b = (tracemalloc.Snapshot.load(p) for p in (first, second))
    for stat in b.compare_to(a, "traceback")[:20]: ...

SYNCD_TRACEMALLOC_FRAMES sets how many frames each traceback keeps (default 12; 0: no tracing,
only the allocator's figures, <dir>/syncd-<pid>-<n>.heap.json, as with tracing).

Each snapshot also writes <dir>/syncd-<pid>-<n>.pymalloc.txt: pymalloc's arenas (which
mallinfo does not see), the live objects by type, and what the host's parts hold (deep sizes).
It walks every object: about a second, and tens of MiB while it runs.
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import os
import signal
import sys
import time
import tracemalloc
import types
from pathlib import Path
from typing import TextIO

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
        hosts = [o for o in objs if type(o).__name__ == "Host"]
        del objs, seen
        out.write(f"\nlive objects: {sum(size.values())} bytes\n")
        for name, n in size.most_common(40):
            out.write(f"{n:12d} {count[name]:8d} {name}\n")
        for host in hosts:
            try:
                _owners(host, out)
            except Exception as e:  # a diagnosis must not take the daemon down
                out.write(f"\nowners not walked: {e!r}\n")


_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
           types.CodeType, types.FrameType)


def _owners(host: object, out: TextIO) -> None:
    """What the host's attributes hold (bytes reachable from each, each object counted once,
    in the order of the attributes; classes, modules and functions not followed), and the
    same for the attributes of its file tasks and resource machines, summed over all."""
    seen = {id(host), id(vars(host)), id(getattr(host, "config", None))}

    def deep(root: object) -> int:
        total, stack = 0, [root]
        while stack:
            o = stack.pop()
            if id(o) in seen or isinstance(o, _OPAQUE):
                continue
            seen.add(id(o))
            total += sys.getsizeof(o)
            stack.extend(gc.get_referents(o))
        return total

    groups: list[tuple[str, list[object]]] = [
        ("task", list(getattr(host, "replicas", {}).values())),
        ("machine", [t.machine for t in getattr(host, "replicas", {}).values()]),
    ]
    files = list(getattr(getattr(host, "resources", None), "files", {}).values())
    groups += [("resources", files), ("resources.machine", [r.machine for r in files])]
    for _, items in groups:
        seen.update(id(i) for i in items)
        seen.update(id(vars(i)) for i in items if hasattr(i, "__dict__"))
    for label, items in groups:
        sums: collections.Counter[str] = collections.Counter()
        for i in items:
            for attr in getattr(i, "__dict__", {}) or {}:
                sums[attr] += deep(getattr(i, attr))
        out.write(f"\n{label} ({len(items)}), attributes summed\n")
        for attr, n in sums.most_common(15):
            out.write(f"{n:12d} {label}.{attr}\n")
    sums = collections.Counter({attr: deep(v) for attr, v in vars(host).items()})
    out.write("\nhost, the rest\n")
    for attr, n in sums.most_common(20):
        out.write(f"{n:12d} host.{attr}\n")


MEMLOG = "SYNCD_MEMLOG"


def log_memory(host: object, path: Path, every: float = 0.2) -> None:
    """SYNCD_MEMLOG=<file>: a thread writes, every `every` seconds, a line of what memory the
    daemon holds and where it waits: wall time, VmRSS, glibc's heap (in use, free, mapped
    apart), pymalloc's allocated blocks, bytes unacknowledged by the broker, paho's unwritten
    packets (count, bytes), items batched in the outbox (count, bytes) and what each peer's
    frames hold (Holdings). Cheap (no object walk): for a per-second trace of a long run, to
    see when RSS peaks and what is queued then (docs/peer-limits.md)."""
    import threading

    def figures() -> str:
        with open("/proc/self/status") as f:
            rss = next((line.split()[1] for line in f if line.startswith("VmRSS:")), "0")
        h = allocator.heap()
        link = getattr(host, "link", None)
        session = getattr(link, "_session", None)
        client = getattr(session, "_client", None)
        out = list(getattr(client, "_out_packet", ()) or ())
        unwritten = sum(int(p.get("to_process", 0)) for p in out)
        outbox = getattr(getattr(host, "outbound", None), "outbox", None)
        queued = list(getattr(outbox, "_queued", {}).values())
        items = [i for _, batch in queued for i in list(batch)]
        held = dict(getattr(getattr(host, "holdings", None), "held", {}))
        return (f"{time.time():.2f} rss={rss} used={h.get('uordblks', 0) >> 10} "
                f"free={h.get('fordblks', 0) >> 10} mapped={h.get('hblkhd', 0) >> 10} "
                f"blocks={sys.getallocatedblocks()} acked_wait={getattr(link, 'queued', 0) >> 10} "
                f"paho={len(out)}/{unwritten >> 10} outbox={len(items)}/"
                f"{sum(i.size for i in items) >> 10} held="
                + ",".join(f"{p}:{n >> 10}" for p, n in sorted(held.items())) + "\n")

    def run() -> None:
        with open(path, "a") as f:
            while True:
                try:
                    f.write(figures())
                    f.flush()
                except Exception as e:  # a diagnosis must not take the daemon down
                    f.write(f"{time.time():.2f} error {e!r}\n")
                time.sleep(every)

    threading.Thread(target=run, name="memlog", daemon=True).start()


TURNPEAK = "SYNCD_TURNPEAK"


def trace_turn_peaks(path: Path, threshold: int = 2 << 20, snaps: int = 0,
                     depth: int = 1) -> None:
    """SYNCD_TURNPEAK=<file>: which loop callbacks allocate the heap's swings. Traces Python's
    allocations (tracemalloc, `depth` frames) and writes a line for every loop callback during
    which the traced memory rose more than `threshold` above what it was at the callback's
    start (its peak, `reset_peak` at each start): time, the rise at the peak, what was still
    held at the end, the callback. Threads allocate into the same figure: a line can be a
    thread's. For diagnosis only (docs/peer-limits.md): it costs the daemon about 2x CPU.

    With `snaps` > 0 (SYNCD_TURNPEAK_SNAPS), read turns of the link are snapshotted at their
    start and whenever a message leaves them holding another MiB more than at the last
    snapshot; for each of the first `snaps` turns that rose 3 x `threshold`, what its last
    snapshot held more than its start is written (<file>.snap<n>.txt, by traceback): what a
    turn holds at once. (At most 20 x `snaps` turns are snapshotted: each snapshot is slow.)"""
    import asyncio.events
    import importlib

    tracemalloc.start(depth)
    out = open(path, "a", buffering=1)  # noqa: SIM115 (the daemon's lifetime)
    plain = asyncio.events.Handle._run
    turn: dict[str, object] = {"start": 0, "first": None, "mid": None, "at": 0}
    taken = itertools.count(1)
    left = [snaps, 20 * snaps]
    reader = importlib.import_module("syncd.net.link").Session._readable if snaps else None

    def run(handle: asyncio.events.Handle) -> None:
        armed = (left[0] > 0 and left[1] > 0
                 and getattr(getattr(handle, "_callback", None), "__func__", None) is reader)
        if armed:
            left[1] -= 1
        turn["first"] = tracemalloc.take_snapshot() if armed else None
        turn["mid"] = None
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        turn["start"] = turn["at"] = before
        t0 = time.monotonic()
        try:
            plain(handle)
        finally:
            now, peak = tracemalloc.get_traced_memory()
            if peak - before > threshold:
                cb = getattr(handle, "_callback", None)
                what = repr(getattr(cb, "__self__", cb))[:300]
                out.write(f"{time.time():.2f} peak=+{(peak - before) >> 10} "
                          f"kept={(now - before) >> 10} base={before >> 10} "
                          f"ms={(time.monotonic() - t0) * 1000:.0f} {what}\n")
            first, mid = turn["first"], turn["mid"]
            turn["first"] = turn["mid"] = None
            if (isinstance(first, tracemalloc.Snapshot) and isinstance(mid, tracemalloc.Snapshot)
                    and peak - before > 3 * threshold):
                left[0] -= 1
                n = next(taken)
                with open(f"{path}.snap{n}.txt", "w") as f:
                    f.write(f"start {before >> 10} KiB, last snapshot {turn['at_kib']} KiB, "
                            f"peak {peak >> 10}, end {now >> 10}\n")
                    for stat in mid.compare_to(first, "traceback")[:40]:
                        f.write(f"{stat.size_diff >> 10:8d} KiB {stat.count_diff:7d} blocks\n")
                        for line in stat.traceback.format():
                            f.write(f"    {line}\n")

    asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]
    if os.environ.get(f"{TURNPEAK}_MESSAGES"):
        _message_peaks(out, threshold)
    if snaps <= 0:
        return
    link = importlib.import_module("syncd.net.link").Link
    handle_one = link._handle

    def handle(self: object, topic: str, payload: bytes) -> None:
        handle_one(self, topic, payload)
        if turn["first"] is not None:
            now, _ = tracemalloc.get_traced_memory()
            at = turn["at"]
            assert isinstance(at, int)
            if now - at > 1 << 20:
                turn["at"], turn["at_kib"] = now, now >> 10
                turn["mid"] = tracemalloc.take_snapshot()

    link._handle = handle


def _message_peaks(out: TextIO, threshold: int) -> None:
    """SYNCD_TURNPEAK_MESSAGES=1: a line for every message of the link whose handling rose
    the traced memory by more than `threshold` at its peak: its topic, size and first item
    kinds. (The callback's own peak then counts from its last message only.)"""
    import importlib
    import re

    link = importlib.import_module("syncd.net.link").Link
    handle_one = link._handle
    kinds = re.compile(rb'"k":"(\w+)"')

    def handle(self: object, topic: str, payload: bytes) -> None:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        handle_one(self, topic, payload)
        now, peak = tracemalloc.get_traced_memory()
        if peak - before > threshold:
            seen = b",".join(kinds.findall(payload[:8192])[:4]).decode("ascii", "replace")
            out.write(f"{time.time():.2f} message peak=+{(peak - before) >> 10} "
                      f"kept={(now - before) >> 10} size={len(payload) >> 10} {topic} "
                      f"kinds={seen}\n")

    link._handle = handle
