"""Group commit: many files made durable with one flush of their filesystem.

With a thousand busy files, a thousand fdatasyncs a second each force a journal commit on
their own and queue up behind one another. Files that wait at the same moment are flushed
together instead: one syncfs() per filesystem (Linux), which makes every one of them durable.
A lone file gets its plain fdatasync.

How long syncs take decides where they run: on the event loop (replica.py) only while the
disk is fast, since an inline fdatasync stalls the loop (the MQTT reader included) while it
waits. Every sync of one file is timed, inline or in the thread, so the choice follows the
disk both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from pathlib import Path

from syncd import store

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)


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
    def __init__(self) -> None:
        self._waiting: dict[Path, list[asyncio.Future[None]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sync(self, path: Path) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="groupsync")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(path, []).append(done)
        self._wake.set()
        await done

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, {}
            if not batch:
                continue
            try:
                await asyncio.to_thread(sync_many, list(batch))
            except OSError as e:
                for futures in batch.values():
                    for f in futures:
                        if not f.done():
                            f.set_exception(e)
                continue
            for futures in batch.values():
                for f in futures:
                    if not f.done():
                        f.set_result(None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
