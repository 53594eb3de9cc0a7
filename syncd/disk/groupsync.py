"""Group commit: the files (and new directories) syncd wrote, made durable on sync threads.

Each file syncd appended to gets its own fdatasync, each directory it created an entry in its
own fsync, nothing else. Never syncfs(): it waits for every dirty page of the filesystem,
whoever wrote it, so that any process writing a lot (a `dd`, a backup) made every replication
wait for that process's data (issue #23: p50 9.7 ms -> 2.7 s).

The syncs run on a few threads of ours (WORKERS). An idle one takes the files waiting at
that moment, up to GROUP of them, and syncs them one after another; the group's result comes
back to the loop in one callback. The files one turn of the loop asks for (a frame carrying
the bytes of many keys, the changes of one inotify read) are spread over as many threads as
GROUP asks for, and synced at the same time: concurrent fdatasyncs share the journal's commit
and the disk's cache flush, one after another each waits for a flush of its own (measured on
this project's ext4 VM: 64 small appends made durable in 73-106 ms on one thread, 7-11 ms on
8 threads of 8; at 1000 busy keys a frame's 64 files on one thread was ~100 ms of lag). Several
threads also because under another writer's load one fdatasync now and then waits a second or
more for the journal: with one thread, every file behind it waited too (measured: p50 260-355
ms at 100 writes/s under a dd loop, against ~5 ms with several).

The event loop never waits for a disk past a small bound: a lone small sync is handed to a
thread of its own and waited for at most INLINE_WAIT (a thread hop back through the loop costs
more CPU than most such syncs take); past that, the loop goes on and the result comes back
through it. The wait is not even tried while recent syncs were slow. (Syncing on the loop
itself would save the hand-off, but one slow fdatasync would then hold every file, the link
and the heartbeats for its whole length: tests/unit/test_groupsync.py.)

Hand-offs are bare locks (_thread.allocate_lock), not Conditions or Events: at 500 writes/s
the Condition's per-wait lock and waiter list were a profile's top frame.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from syncd.disk import logfile
from syncd.disk.logfile import Where

log = logging.getLogger("syncd.groupsync")

SLOW_SYNC = 0.5  # seconds: a group this slow is worth a warning
INLINE_WAIT = 0.002  # seconds the loop may wait for a lone small sync before going on
WORKERS = 8  # sync threads at most (started as needed)
GROUP = 4  # files one thread takes at once at most (more: spread over more threads)
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


@dataclass(slots=True)
class Job:
    """One file to make durable, and the directories that must be durable with it."""

    loop: asyncio.AbstractEventLoop
    path: Where
    dirs: set[Where]
    futures: list[asyncio.Future[None]] = field(default_factory=list)
    error: OSError | None = None  # set by the worker
    handled: bool = False  # its futures are resolved (on the loop)


def _error_of(job: Job, errors: dict[Where, OSError]) -> OSError | None:
    return errors.get(job.path) or next((errors[d] for d in job.dirs if d in errors), None)


class GroupSync:
    """Sync threads of ours, fed by the event loop. (A plain executor hop per sync cost a
    Future chain, a context copy and a pool lookup each: ~8 % of a standby's CPU at 500
    writes/s; here a group of files costs one callback.)

    The hand-off is batched: the files the loop asks for during one of its iterations wake
    one thread, once, at the end of that iteration (a threading.Condition.notify per file was
    the top frame of a profile at 500 writes/s). A lone small sync goes to a thread of its
    own (_Inline) through two bare locks, and comes back without a trip through the loop
    when it is done within INLINE_WAIT."""

    def __init__(self) -> None:
        self._mutex = _thread.allocate_lock()  # _queued and _idle
        self._queued: dict[Where, Job] = {}  # waiting for a thread, in order (under _mutex)
        self._threads: list[threading.Thread] = []
        # The go-locks of the threads waiting for work (under _mutex): a bare lock each, held
        # until there is work (a Condition allocated a lock and a deque entry per wait).
        self._idle: list[_thread.LockType] = []
        self._kick_due = False  # a _kick is scheduled on the loop (loop thread only)
        self._closing = False
        self._slow_logged = -60.0
        self._inline = _Inline(self._warn_if_slow)

    async def sync(self, path: Where, dirs: Iterable[Where] = (), inline: bool = False
                   ) -> None:
        """Make `path` durable, and `dirs` (where syncd created `path` or its folders).

        `inline`: a lone small sync; when the disk is fast and nothing else waits, the loop
        waits for it up to INLINE_WAIT, and only then goes on (the result comes back through
        it)."""
        loop = asyncio.get_running_loop()
        if inline and self._inline.idle and not self._queued and disk_is_fast() \
                and not self._closing:
            waited = self._inline.sync(path, tuple(dirs), loop)
            if waited is not None:
                await waited
            return
        done: asyncio.Future[None] = loop.create_future()
        with self._mutex:
            job = self._queued.get(path)  # not started yet: it covers our bytes too
            if job is None:
                job = self._queued[path] = Job(loop, path, set(dirs))
            else:
                job.dirs.update(dirs)
            job.futures.append(done)
        if not self._kick_due:
            self._kick_due = True
            loop.call_soon(self._kick)
        await done

    def _kick(self) -> None:
        """Wake the threads for what this iteration of the loop queued: one per GROUP files."""
        self._kick_due = False
        woken = []
        with self._mutex:
            wanted = -(-len(self._queued) // GROUP)
            while wanted > 0 and self._idle:
                woken.append(self._idle.pop())
                wanted -= 1
            while wanted > 0 and len(self._threads) < WORKERS:
                self._start_thread()
                wanted -= 1
        # Woken once the mutex is free: a thread woken while we held it (its first step is
        # to take it) went back to sleep on it at once, one more wake-up per sync.
        for go in woken:
            go.release()

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._work, name=f"groupsync-{len(self._threads)}",
                             daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        go = _thread.allocate_lock()
        go.acquire()
        while True:
            with self._mutex:
                if not self._queued:
                    if self._closing:
                        return  # closing, and nothing left
                    self._idle.append(go)
                    wait = True
                else:
                    wait = False
                    group: list[Job] = []
                    while self._queued and len(group) < GROUP:
                        path = next(iter(self._queued))
                        group.append(self._queued.pop(path))
            if wait:
                go.acquire()  # released by _kick (work) or close()
                continue
            self._sync(group)

    def _warn_if_slow(self, started: float, files: int) -> None:
        took = time.monotonic() - started
        if took > SLOW_SYNC and started >= self._slow_logged + 60:
            self._slow_logged = started
            log.warning("making %d file(s) durable took %.2f s: the disk is slow or busy "
                        "(replication waits for it; logged at most once a minute)",
                        files, took)

    def _sync(self, group: list[Job]) -> None:
        started = time.monotonic()
        errors = sync_files([j.path for j in group],
                            sorted({d for j in group for d in j.dirs}, key=str))
        self._warn_if_slow(started, len(group))
        by_loop: dict[asyncio.AbstractEventLoop, list[Job]] = {}
        for j in group:
            j.error = _error_of(j, errors)
            by_loop.setdefault(j.loop, []).append(j)
        for loop, jobs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_finished, jobs)

    async def close(self) -> None:
        with self._mutex:
            self._closing = True
            idle, self._idle = self._idle, []
        for go in idle:
            go.release()
        threads, self._threads = self._threads, []
        inline = self._inline.close()
        if inline is not None:
            threads.append(inline)
        await asyncio.gather(*(asyncio.to_thread(t.join, 5) for t in threads))


def _finished(jobs: list[Job]) -> None:
    for j in jobs:
        if j.handled:
            continue
        j.handled = True
        for f in j.futures:
            if f.done():
                continue
            if j.error is not None:
                f.set_exception(j.error)
            else:
                f.set_result(None)


class _Inline:
    """One thread for the lone small sync the loop waits for (up to INLINE_WAIT), handed over
    and back through bare locks (no Condition, Event or Future on the way when it is done in
    time). A sync not done in time is left to finish on its own: its result comes back
    through the loop (call_soon_threadsafe), and until then this thread takes no other (the
    loop hands them to the group threads, and waits for none)."""

    def __init__(self, warn_if_slow: Callable[[float, int], None]) -> None:
        self._warn_if_slow = warn_if_slow
        self._go = _thread.allocate_lock()  # released by the loop: a job is in _job
        self._go.acquire()
        self._done = _thread.allocate_lock()  # released by the thread: the loop waits on it
        self._done.acquire()
        self._mutex = _thread.allocate_lock()  # _waiting, and the choice made with it
        self._job: Job | None = None
        self._waiting = False  # the loop still waits on _done (under _mutex)
        self._busy = False  # a job is under way (loop thread only)
        self._thread: threading.Thread | None = None
        self._closing = False

    @property
    def idle(self) -> bool:
        """No sync under way here (one not done in time is still under way)."""
        return not self._busy

    def sync(self, path: Where, dirs: tuple[Where, ...], loop: asyncio.AbstractEventLoop
             ) -> asyncio.Future[None] | None:
        """Sync `path` (and `dirs`) on this thread. None: done in time (an error raises);
        else the future the result comes back in. Never waits past INLINE_WAIT."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="groupsync-inline",
                                            daemon=True)
            self._thread.start()
        job = self._job = Job(loop, path, set(dirs))
        self._busy = True
        self._waiting = True
        self._go.release()
        if not self._done.acquire(timeout=INLINE_WAIT):
            with self._mutex:
                # Done between the timeout and now? Then _done was released meanwhile.
                finished = self._done.acquire(blocking=False)
                if not finished:
                    self._waiting = False
                    future: asyncio.Future[None] = loop.create_future()
                    job.futures.append(future)
                    return future  # the thread ends it (_finished_late)
        self._busy = False
        if job.error is not None:
            raise job.error
        return None

    def _work(self) -> None:
        while True:
            self._go.acquire()
            job = self._job
            if job is None or self._closing:
                return
            started = time.monotonic()
            job.error = _error_of(job, sync_files([job.path], sorted(job.dirs, key=str)))
            self._warn_if_slow(started, 1)
            with self._mutex:
                if self._waiting:
                    self._waiting = False
                    self._done.release()
                    continue
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                job.loop.call_soon_threadsafe(self._finished_late, job)

    def _finished_late(self, job: Job) -> None:
        self._busy = False
        _finished([job])

    def close(self) -> threading.Thread | None:
        """Stop the thread (once its job is done); the thread, to join."""
        self._closing = True
        t, self._thread = self._thread, None
        if t is not None:
            self._job = None
            self._go.release()  # busy: it ends its job first, then finds this
        return t
