"""Group commit: the files (and new directories) syncd wrote, made durable on sync threads.

Each file syncd appended to gets its own fdatasync, each directory it created an entry in its
own fsync, nothing else. Never syncfs(): it waits for every dirty page of the filesystem,
whoever wrote it, so that any process writing a lot (a `dd`, a backup) made every replication
wait for that process's data (issue #23: p50 9.7 ms -> 2.7 s).

The syncs run on a few threads of ours (WORKERS). An idle one takes every file waiting at
that moment (up to GROUP files) and syncs them one after another: the first fdatasync's
journal commit usually carries the others, and the group's result comes back to the loop in
one callback. Several threads, because under another writer's load one fdatasync now and then
waits a second or more for the journal: with one thread, every file behind it waited too
(measured: p50 260-355 ms at 100 writes/s under a dd loop, against ~5 ms with several).

The event loop never waits for a disk past a small bound: a lone small sync is handed to a
thread and waited for at most INLINE_WAIT (a thread hop back through the loop costs more CPU
than most such syncs take); past that, the loop goes on and the result comes back through it.
The wait is not even tried while recent syncs were slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from syncd.disk import logfile
from syncd.disk.logfile import Where

log = logging.getLogger("syncd.groupsync")

SLOW_SYNC = 0.5  # seconds: a group this slow is worth a warning
INLINE_WAIT = 0.002  # seconds the loop may wait for a lone small sync before going on
WORKERS = 8  # sync threads at most (started as needed)
GROUP = 64  # files one thread takes at once at most
# The loop waits at all only while the average file sync is below this (fast disk).
INLINE_SYNC_NS = 1_000_000
_sync_ns = 0  # moving average (weight 1/8) of one file's fdatasync, measured by the workers


def disk_is_fast() -> bool:
    return _sync_ns < INLINE_SYNC_NS


def sync_dir(path: Where) -> None:
    """fsync a directory: the entries syncd created in it (a new file, a new folder)."""
    with contextlib.suppress(FileNotFoundError):
        logfile.sync_dir(path)


def sync_files(paths: Iterable[Where], dirs: Iterable[Where] = ()) -> dict[Where, OSError]:
    """fdatasync each file, then fsync each directory; the errors, by path."""
    global _sync_ns
    errors: dict[Where, OSError] = {}
    for path in paths:
        started = time.monotonic_ns()
        try:
            logfile.sync(path)
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
class Job:
    """One file to make durable, and the directories that must be durable with it."""

    loop: asyncio.AbstractEventLoop
    path: Where
    dirs: set[Where]
    futures: list[asyncio.Future[None]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: OSError | None = None  # set by the worker
    handled: bool = False  # its futures are resolved (on the loop)


class GroupSync:
    """Sync threads of ours, fed by the event loop. (A plain executor hop per sync cost a
    Future chain, a context copy and a pool lookup each: ~8 % of a standby's CPU at 500
    writes/s; here a group of files costs one callback.)"""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queued: dict[Where, Job] = {}  # waiting for a thread, in order (under _cond)
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for work (under _cond)
        self._closing = False
        self._slow_logged = -60.0

    async def sync(self, path: Where, dirs: Iterable[Where] = (), inline: bool = False
                   ) -> None:
        """Make `path` durable, and `dirs` (where syncd created `path` or its folders).

        `inline`: a lone small sync; when a thread is idle and the disk fast, the loop waits
        for it up to INLINE_WAIT, and only then goes on (the result comes back through it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._cond:
            brief = inline and self._idle > 0 and not self._queued and disk_is_fast()
            job = self._queued.get(path)  # not started yet: it covers our bytes too
            if job is None:
                job = self._queued[path] = Job(loop, path, set(dirs))
                if self._idle:
                    self._cond.notify()
                elif len(self._threads) < WORKERS:
                    self._start_thread()
            else:
                job.dirs.update(dirs)
            if not brief:
                job.futures.append(done)
        if brief:
            if job.done.wait(INLINE_WAIT):
                self._finished([job])
                if job.error is not None:
                    raise job.error
                return
            job.futures.append(done)  # resolved by the worker's callback, on this loop
        await done

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._work, name=f"groupsync-{len(self._threads)}",
                             daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._closing:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._queued:
                    return  # closing, and nothing left
                group: list[Job] = []
                while self._queued and len(group) < GROUP:
                    path = next(iter(self._queued))
                    group.append(self._queued.pop(path))
            self._sync(group)

    def _sync(self, group: list[Job]) -> None:
        started = time.monotonic()
        errors = sync_files([j.path for j in group],
                            sorted({d for j in group for d in j.dirs}, key=str))
        took = time.monotonic() - started
        if took > SLOW_SYNC and started >= self._slow_logged + 60:
            self._slow_logged = started
            log.warning("making %d file(s) durable took %.2f s: the disk is slow or busy "
                        "(replication waits for it; logged at most once a minute)",
                        len(group), took)
        by_loop: dict[asyncio.AbstractEventLoop, list[Job]] = {}
        for j in group:
            j.error = errors.get(j.path) or next((errors[d] for d in j.dirs if d in errors),
                                                 None)
            j.done.set()
            by_loop.setdefault(j.loop, []).append(j)
        for loop, jobs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._finished, jobs)

    @staticmethod
    def _finished(jobs: list[Job]) -> None:
        for j in jobs:
            if j.handled:
                continue  # already done by the loop's brief wait (sync, inline)
            j.handled = True
            for f in j.futures:
                if f.done():
                    continue
                if j.error is not None:
                    f.set_exception(j.error)
                else:
                    f.set_result(None)

    async def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        threads, self._threads = self._threads, []
        await asyncio.gather(*(asyncio.to_thread(t.join, 5) for t in threads))
