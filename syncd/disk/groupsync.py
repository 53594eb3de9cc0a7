"""Group commit: the files (and new directories) syncd wrote, made durable on one thread.

Every sync runs on one worker thread of ours: each file syncd appended to gets its own
fdatasync, each directory it created an entry in its own fsync, nothing else. Files that wait
at the same moment go in one batch, one after the other: the first fdatasync's journal commit
usually carries the others' too, so the rest return at once. Never syncfs(): it waits for
every dirty page of the filesystem, whoever wrote it, so that any process writing a lot (a
`dd`, a backup) made every replication wait for its data (issue #23: p50 9.7 ms -> 2.7 s).

The event loop never waits for a disk past a small bound: a lone small sync is handed to the
thread and waited for at most INLINE_WAIT (a thread hop back through the loop costs more CPU
than most such syncs take); past that, the loop goes on and the sync's result comes back
through it. The wait is not even tried while recent syncs were slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from syncd.disk import store

log = logging.getLogger("syncd.groupsync")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2  # start writing the dirty pages out; do not wait

SLOW_SYNC = 0.5  # seconds: a batch this slow is worth a warning
INLINE_WAIT = 0.002  # seconds the loop may wait for a lone small sync before going on
# The loop waits at all only while the average file sync is below this (fast disk).
INLINE_SYNC_NS = 1_000_000
_sync_ns = 0  # moving average (weight 1/8) of one file's fdatasync, measured by the worker


def disk_is_fast() -> bool:
    return _sync_ns < INLINE_SYNC_NS


def sync_dir(path: Path) -> None:
    """fsync a directory: the entries syncd created in it (a new file, a new folder)."""
    with contextlib.suppress(FileNotFoundError):
        store.sync_dir(path)


def start_writeback(paths: list[Path]) -> None:
    """Start writing out each file's dirty pages, without waiting (Linux): the blocks of
    every file of a batch are then allocated in the same journal transaction, and the first
    fdatasync's commit makes the others durable too, instead of one commit per file (which
    under another writer's load costs up to a second each)."""
    if _sync_file_range is None:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            fd = store.open_file(path)
            try:
                _sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)
            finally:
                os.close(fd)


def sync_files(paths: list[Path], dirs: Iterable[Path] = ()) -> dict[Path, OSError]:
    """fdatasync each file, then fsync each directory; the errors, by path."""
    global _sync_ns
    errors: dict[Path, OSError] = {}
    if len(paths) > 1:
        start_writeback(paths)
    for path in paths:
        started = time.monotonic_ns()
        try:
            store.sync(path)
        except OSError as e:
            errors[path] = e
        _sync_ns += (time.monotonic_ns() - started - _sync_ns) // 8
    for d in dirs:
        try:
            sync_dir(d)
        except OSError as e:
            errors[d] = e
    return errors


@dataclass
class Batch:
    loop: asyncio.AbstractEventLoop
    # file -> (futures waiting for it, directories that must be durable with it)
    files: dict[Path, tuple[list[asyncio.Future[None]], set[Path]]]
    done: threading.Event = field(default_factory=threading.Event)
    errors: dict[Path, OSError] = field(default_factory=dict)  # set by the worker
    handled: bool = False  # its futures are resolved (on the loop)


class GroupSync:
    """Syncs run in one worker thread of ours; those asked for while one runs go together
    next. (A plain executor hop per sync cost a Future chain, a context copy and a pool
    lookup each: ~8 % of a standby's CPU at 500 writes/s.)"""

    def __init__(self) -> None:
        self._waiting: dict[Path, tuple[list[asyncio.Future[None]], set[Path]]] = {}
        self._running = False  # a batch is in the worker
        self._requests: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._slow_logged = -60.0

    async def sync(self, path: Path, dirs: Iterable[Path] = (), inline: bool = False) -> None:
        """Make `path` durable, and `dirs` (where syncd created `path` or its folders).

        `inline`: a lone small sync; when the worker is idle and the disk fast, the loop waits
        for it up to INLINE_WAIT, and only then goes on (the result comes back through it)."""
        loop = asyncio.get_running_loop()
        if inline and not self._running and not self._waiting and disk_is_fast():
            b = self._submit(loop, {path: ([], set(dirs))})
            if b.done.wait(INLINE_WAIT):
                self._finished(b)
                error = b.errors.get(path) or next(iter(b.errors.values()), None)
                if error is not None:
                    raise error
                return
            done: asyncio.Future[None] = loop.create_future()
            b.files[path][0].append(done)  # the worker only reads the batch's paths
            await done
            return
        done = loop.create_future()
        futures, wanted = self._waiting.setdefault(path, ([], set()))
        futures.append(done)
        wanted.update(dirs)
        if not self._running:
            self._submit(loop, self._take_waiting())
        await done

    def _take_waiting(self) -> dict[Path, tuple[list[asyncio.Future[None]], set[Path]]]:
        batch, self._waiting = self._waiting, {}
        return batch

    def _submit(self, loop: asyncio.AbstractEventLoop,
                files: dict[Path, tuple[list[asyncio.Future[None]], set[Path]]]) -> Batch:
        self._running = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="groupsync", daemon=True)
            self._thread.start()
        b = Batch(loop, files)
        self._requests.put(b)
        return b

    def _work(self) -> None:
        while (b := self._requests.get()) is not None:
            paths = list(b.files)
            dirs = {d for _, wanted in b.files.values() for d in wanted}
            started = time.monotonic()
            b.errors = sync_files(paths, sorted(dirs))
            took = time.monotonic() - started
            if took > SLOW_SYNC and started >= self._slow_logged + 60:
                self._slow_logged = started
                log.warning("making %d file(s) durable took %.2f s: the disk is slow or busy "
                            "(replication waits for it; logged at most once a minute)",
                            len(paths), took)
            b.done.set()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                b.loop.call_soon_threadsafe(self._finished, b)

    def _finished(self, b: Batch) -> None:
        if b.handled:
            return  # already done by the loop's brief wait (sync, inline)
        b.handled = True
        self._running = False
        for path, (futures, wanted) in b.files.items():
            error = b.errors.get(path) or next((b.errors[d] for d in wanted if d in b.errors),
                                               None)
            for f in futures:
                if f.done():
                    continue
                if error is not None:
                    f.set_exception(error)
                else:
                    f.set_result(None)
        if self._waiting:
            self._submit(b.loop, self._take_waiting())

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._requests.put(None)
            await asyncio.to_thread(thread.join, 5)
