"""Group commit: many files made durable with one flush of their filesystem.

With a thousand busy files, a thousand fdatasyncs a second each force a journal commit on
their own and queue up behind one another. Files that wait at the same moment are flushed
together instead: one syncfs() per filesystem (Linux), which makes every one of them durable.
A lone file gets its plain fdatasync.

How long syncs take decides where they run: on the event loop (daemon/replica.py) only while the
disk is fast, since an inline fdatasync stalls the loop (the MQTT reader included) while it
waits. Every sync of one file is timed, inline or in the thread, so the choice follows the
disk both ways.
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
from dataclasses import dataclass
from pathlib import Path

from syncd.disk import store

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)


log = logging.getLogger("syncd.groupsync")

SLOW_SYNC = 0.5  # seconds: a group commit this slow is worth a warning

# Past this on average a sync goes to the thread: worth it on the loop only where syncs are
# fast (~0.1-0.3 ms); a slow disk (4 ms measured on a busy /tmp) would stall the loop.
INLINE_SYNC_NS = 1_000_000
_sync_ns = 0  # moving average (weight 1/8) of this process's one-file syncs


def disk_is_fast() -> bool:
    return _sync_ns < INLINE_SYNC_NS


def timed_sync(path: Path) -> None:
    """fdatasync one file, and note how long it took."""
    global _sync_ns
    started = time.monotonic_ns()
    store.sync(path)
    _sync_ns += (time.monotonic_ns() - started - _sync_ns) // 8


def sync_many(paths: list[Path]) -> None:
    """Make every file in `paths` durable, flushing each filesystem once."""
    if len(paths) == 1:
        timed_sync(paths[0])
        return
    if _syncfs is None:
        for path in paths:
            store.sync(path)
        return
    by_device: dict[int, Path] = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            by_device.setdefault(os.lstat(path).st_dev, path)
    for path in by_device.values():
        fd = store.open_file(path)
        try:
            if _syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(path))
        finally:
            os.close(fd)


class GroupSync:
    """Syncs run in one worker thread of ours; those asked for while one runs go together
    next. (A plain executor hop per sync cost a Future chain, a context copy and a pool
    lookup each: ~8 % of a standby's CPU at 500 writes/s.)"""

    def __init__(self) -> None:
        self._waiting: dict[Path, list[asyncio.Future[None]]] = {}
        self._running = False  # a batch is in the worker
        self._requests: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._slow_logged = -60.0

    async def sync(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiting.setdefault(path, []).append(done)
        if not self._running:
            self._submit(loop)
        await done

    def _submit(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._waiting = self._waiting, {}
        self._running = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="groupsync", daemon=True)
            self._thread.start()
        self._requests.put(Batch(loop, batch))

    def _work(self) -> None:
        while (b := self._requests.get()) is not None:
            error: OSError | None = None
            started = time.monotonic()
            try:
                sync_many(list(b.files))
            except OSError as e:
                error = e
            took = time.monotonic() - started
            if took > SLOW_SYNC and started >= self._slow_logged + 60:
                self._slow_logged = started
                log.warning("making %d file(s) durable took %.2f s: the disk is slow or busy "
                            "(replication waits for it; logged at most once a minute)",
                            len(b.files), took)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                b.loop.call_soon_threadsafe(self._finished, b, error)

    def _finished(self, b: Batch, error: OSError | None) -> None:
        self._running = False
        for futures in b.files.values():
            for f in futures:
                if f.done():
                    continue
                if error is not None:
                    f.set_exception(error)
                else:
                    f.set_result(None)
        if self._waiting:
            self._submit(b.loop)

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._requests.put(None)
            await asyncio.to_thread(thread.join, 5)


@dataclass
class Batch:
    loop: asyncio.AbstractEventLoop
    files: dict[Path, list[asyncio.Future[None]]]
