"""The log checks that READY needs, kept up incrementally for one file (`IncrementalVerifier`).

Each replicated file has a checker that has seen the file's first `size` bytes. After growth
(at most once a second) it reads only the bytes it has not seen (fresh in the page cache) and
parses them on the event loop in small slices, spread out in time while it keeps up with a live
file, so that neither this daemon nor the other processes on the host wait behind a burst.
Its state is saved in `state_dir` (at most every SAVE_INTERVAL seconds, and on shutdown)
together with the size it covers, so a restart goes on from there instead of re-reading whole
files. When the file's history is replaced (an adopted
copy, a noticed edit) the checker starts again from byte 0. The decision itself is pure:
core/readiness.py.

An unfinished line is held up to HOLD bytes; past that only its length is kept (and saved),
so a bot's huge line without its newline costs neither memory nor long saves. Once such a
line ends, it is checked in a process of its own (longline.py), which reads it back from the
file, while the loop goes on; the catch-up resumes after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import orjson

from syncd.core.framecheck import Checker, checker_for, checker_from_state
from syncd.core.logcheck import LogChecker
from syncd.core.logreport import Report
from syncd.core.recordkinds import LINES
from syncd.daemon import longline
from syncd.disk import logfile

log = logging.getLogger("syncd.readiness")

STEP = 4 << 20
SLICE = 16 << 10
SPREAD = 0.002  # seconds between two slices of a live file's new bytes
BACKLOG = 1 << 20
INLINE_READ = 256 << 10  # bytes read on the loop at most (page cache); more: in a thread
SAVE_INTERVAL = 30.0
FOLLOW_INTERVAL = 1.0  # seconds between two catch-ups of one file
HOLD = 1 << 20  # bytes of an unfinished line held in memory at most; longer: longline.py
# Bytes of unfinished lines held by all files together. A listed host can make a thousand
# keys and give each a megabyte without a newline: held per file only, that was a gigabyte.
# Past the pool a line is held no further and is checked from disk when it ends, as a line
# longer than HOLD is (docs/peer-limits.md).
POOL_BYTES = 16 << 20
# Problems of one kind listed per file (all are counted): status shows three lines of each
# kind (core/readiness.py), `syncd verify` lists them all from the file. At the checker's
# 1000, a peer's key of random bytes held ~40 KiB of problems here.
LISTED = 10
LONG_LINE_RETRY = 60.0  # seconds before a failed check of a long line is tried again


class HeldLines:
    """What the unfinished lines of every file's checker hold in memory, against one limit."""

    def __init__(self, limit: int = POOL_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self.outgrown = 0  # lines not held further because the pool was full (for status)

    def room(self) -> int:
        return max(0, self.limit - self.used)

    def change(self, delta: int) -> None:
        self.used = max(0, self.used + delta)

    def status(self) -> dict[str, int]:
        """status `peer_limits.unfinished_lines`: bytes held, the limit, lines not held."""
        return {"held": self.used, "limit": self.limit, "not_held": self.outgrown}


HELD = HeldLines()  # one per process: the bound is on the daemon's memory


def _list_few(checker: Checker) -> Checker:
    (checker if isinstance(checker, LogChecker) else checker.inner).list_at_most(LISTED)
    return checker


def _release(charged: list[int]) -> None:
    HELD.change(-charged[0])
    charged[0] = 0


class IncrementalVerifier:
    def __init__(self, path: logfile.Where, state_file: Path, records: str = LINES) -> None:
        self.path = path
        self.state_file = state_file
        self.records = records  # lines, or zstd frames (each decompressed for its check)
        self.checker: Checker = _list_few(checker_for(records, HOLD))
        # What this file's unfinished line holds, charged to HELD (given back when the
        # verifier goes: a forgotten key's line must not keep the pool's room).
        self._charged = [0]
        weakref.finalize(self, _release, self._charged)
        self.size = 0  # bytes of the file the checks have covered
        self._fed = 0  # bytes fed to the checker: `size`, and a long line waiting (longline.py)
        self._long_line_at = -LONG_LINE_RETRY  # when a long line's check last failed
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._report: Report | None = None
        self._last: Report | None = None  # the last report made, shown while a catch-up runs
        self._saved_at = 0.0
        self._saved_size = -1
        self.bytes_read = 0  # since start: shows that a restart did not re-read the file
        self._followed_at = -FOLLOW_INTERVAL
        # The catch-up asked for, and whether it waits in the pass (_Followers) for its turn
        # now (`_soon`) or for the end of its FOLLOW_INTERVAL (`_later`, its entry's number).
        self._wanted: tuple[Callable[[], int], Callable[[], bool]] | None = None
        self._soon = False
        self._later: int | None = None
        self._closed = False
        self.caught_up_at: float | None = None  # wall time a catch-up last reached its end

    def restore(self, limit: int) -> None:
        """Continue from the saved state if it covers no more than `limit` bytes (the ledger)."""
        try:
            saved = orjson.loads(self.state_file.read_bytes())
            size = saved["size"]
            if not 0 <= size <= limit:
                return
            self._replace_checker(checker_from_state(self.records, saved["checker"].encode(),
                                                     HOLD))
            self._fed = self._saved_size = size
            self.size = size - _waiting(self.checker)
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("%s: saved verification state unusable (%s); verifying from the start",
                        self.path, e)

    def restart(self) -> None:
        """The file's history was replaced: check it again from byte 0."""
        self._generation += 1
        self._replace_checker(checker_for(self.records, HOLD))
        self.size = self._fed = 0
        self._report = self._last = None
        self._saved_size = -1

    def follow(self, target: Callable[[], int],
               paused: Callable[[], bool] = lambda: False) -> None:
        """Catch up to target() soon: one catch-up at a time, and at most one start per
        FOLLOW_INTERVAL, so that a busy file is read in few large steps. A catch-up stops
        early once `paused()` says so (the next follow goes on from there).

        The catch-ups of every file due in one turn of the loop run in one pass (_Followers):
        a live file's few new bytes (up to SLICE) are read and checked there and then, with
        no task, timer or sleep of their own; more than that, or a long line, gets a task as
        before (_catch_up). At 1000 busy keys that was a task, two steps, a timer and a
        sleep per write on each host."""
        if self._soon or (self._task is not None and not self._task.done()):
            return
        if target() <= self.size:
            # Nothing to read: at most the state to save, and no task for that. (Each idle file
            # started a catch-up task every sweep, forever: the task's own save() was refused
            # while it ran, and the sweep's came just after the next one started.)
            self.save()
            return
        self._wanted = (target, paused)
        if self._later is not None:
            return  # its turn is booked already (the newest target and pause are asked then)
        followers = _followers()
        now = followers.loop.time()
        wait = self._followed_at + FOLLOW_INTERVAL - now
        if wait > 0:
            self._later = followers.later(now + wait, self)
            return
        self._followed_at = now
        self._soon = True
        followers.soon(self)

    def _later_due(self, entry: int) -> None:
        """The end of the FOLLOW_INTERVAL this file's catch-up waited for (_Followers)."""
        if entry != self._later:
            return  # closed, or booked again since
        self._later = None
        if self._wanted is not None and not self._closed:
            self.follow(*self._wanted)

    def _start(self) -> None:
        """This file's turn in the pass: checked now if it is a few bytes, else in a task."""
        self._soon = False
        if self._closed or self._wanted is None:
            return
        target, paused = self._wanted
        try:
            if self._catch_up_now(target, paused):
                return
        except OSError as e:
            log.warning("%s: cannot read for the log check: %s (tried again at the next "
                        "change or sweep)", self.path, e.strerror or e)
            return
        self._task = asyncio.get_running_loop().create_task(self._catch_up(target, paused))

    def _catch_up_now(self, target: Callable[[], int], paused: Callable[[], bool]) -> bool:
        """_catch_up for at most SLICE new bytes, here and now (what a live file gets between
        two follows). False: not such a case (more bytes, a long line to check, paused), or a
        long line ended in these bytes: the task does it (from where this stopped)."""
        if self.checker.unread_line is not None or paused():
            return False
        end = target()
        start = self._fed
        if end - start > SLICE:
            return False
        data = logfile.read_known(self.path, start, end) if end > start else b""
        self._feed_until_long(data)
        if self.checker.unread_line is not None:
            self._report = None
            return False  # a long line to check in a process of its own: the task's
        if data:
            self._report = None
        if self._fed >= end:
            self.caught_up_at = time.time()
        self._save(in_task=True)
        return True

    async def _catch_up(self, target: Callable[[], int], paused: Callable[[], bool]) -> None:
        generation = self._generation
        if self.checker.unread_line is not None and not await self._check_long_line():
            self._save(in_task=True)
            return
        while (end := target()) > self._fed and not paused():
            start = self._fed
            stop = min(end, start + STEP)
            # A live file's few new bytes are in the page cache: reading them here costs less
            # than the hop to a thread; a backlog is read in a thread, a STEP at a time. Both
            # through the descriptor the file task read or appended them through, when open
            # (logfile.read_known: the inode the machine follows, no reopen per write).
            if stop - start <= INLINE_READ:
                data = logfile.read_known(self.path, start, stop)
            else:
                data = await asyncio.to_thread(logfile.read_known, self.path, start, stop)
            if not data:
                break
            # Parse on the event loop, a slice at a time, yielding in between: parsed in a
            # worker thread, the whole chunk held the GIL for milliseconds while frames waited
            # (it set the lag's 99th percentile); a slice costs ~0.2 ms.
            for at in range(0, len(data), SLICE):
                if generation != self._generation:
                    return  # restarted meanwhile; the new history gets its own catch-up
                if paused():
                    break
                if not await self._feed(data[at : at + SLICE]):
                    if generation == self._generation:
                        self._save(in_task=True)
                    return  # a long line that could not be checked: tried again later
                self._report = None
                # Keeping up with a live file, spread the slices out (no burst of parsing
                # for the other processes on the host to wait behind); a backlog goes at once.
                await asyncio.sleep(SPREAD if end - self._fed < BACKLOG else 0)
            if self._fed >= end and target() - self._fed < BACKLOG:
                # Keeping up with a live file: what it got meanwhile waits for the next
                # follow (at most FOLLOW_INTERVAL away), not for another read right now.
                break
        if generation == self._generation and self._fed >= end:
            self.caught_up_at = time.time()
        self._save(in_task=True)

    async def _feed(self, piece: bytes) -> bool:
        """Feed `piece`; False when it ends a long line whose check failed (not fed on)."""
        while piece := self._feed_until_long(piece):
            if not await self._check_long_line():
                return False
        if self.checker.unread_line is not None:
            return await self._check_long_line()
        return True

    def _feed_until_long(self, piece: bytes) -> bytes:
        """Feed `piece` until a long line is left to check (checker.unread_line); what is
        not fed yet (empty: all of it, or the long line ended it exactly)."""
        while piece:
            used = self._feed_held(piece)
            self._fed += used
            self.bytes_read += used
            piece = piece[used:]
            if self.checker.unread_line is not None:
                return piece
            self.size = self._fed
        return b""

    def _feed_held(self, piece: bytes) -> int:
        """checker.feed, with the line it holds charged to HELD: it may grow by the room left
        in the pool, and a line that outgrows that is no longer held (checked from disk)."""
        checker = self.checker
        if not isinstance(checker, LogChecker):  # zstd frames: held per file (framecheck.py)
            return checker.feed(piece)
        was_outgrown = checker.outgrown
        checker.hold = min(HOLD, checker.held_bytes + HELD.room())
        used = checker.feed(piece)
        if checker.outgrown and not was_outgrown and checker.hold < HOLD:
            HELD.outgrown += 1
        self._charge_held()
        return used

    def _charge_held(self) -> None:
        now = self.checker.held_bytes if isinstance(self.checker, LogChecker) else 0
        HELD.change(now - self._charged[0])
        self._charged[0] = now

    def _replace_checker(self, checker: Checker) -> None:
        """A new checker for this file: what the old one held goes back to the pool."""
        _list_few(checker)
        self.checker = checker
        self._charge_held()

    async def _check_long_line(self) -> bool:
        """Check the line the checker did not hold, in a process of its own (longline.py)."""
        waiting = self.checker.unread_line
        assert waiting is not None
        now = time.monotonic()
        if now - self._long_line_at < LONG_LINE_RETRY:
            return False
        generation, state = self._generation, self.checker.to_state()
        start, length = waiting
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "syncd.daemon.longline", str(start), str(length),
                *longline.where_args(self.path), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await proc.communicate(state)
            finally:
                if proc.returncode is None:  # cancelled (shutdown): do not leave it running
                    proc.kill()
                    await proc.wait()
        except OSError as e:
            out, err = b"", str(e).encode()
            proc = None
        if generation != self._generation:
            return False
        if proc is None or proc.returncode != 0:
            self._long_line_at = now
            log.warning("%s: cannot check the line of %d bytes at offset %d: %s (tried again "
                        "in %gs)", self.path, length, start,
                        err.decode(errors="replace").strip()[-500:], LONG_LINE_RETRY)
            return False
        self._replace_checker(LogChecker.from_state(out, HOLD))
        self.bytes_read += length + 1
        self.size = self._fed
        return True

    @property
    def unsaved(self) -> bool:
        return self._fed != self._saved_size

    def report(self) -> Report | None:
        """The current report, or the last one while a catch-up is feeding the checker."""
        if self._report is None and (self._task is None or self._task.done()):
            self._report = self._last = self.checker.report()
        return self._report if self._report is not None else self._last

    def save(self, force: bool = False) -> None:
        self._save(force=force)

    def _save(self, force: bool = False, in_task: bool = False) -> None:
        """`in_task`: called by the catch-up itself at its end (not a save mid-catch-up)."""
        if self._fed == self._saved_size:
            return
        if not force and time.monotonic() - self._saved_at < SAVE_INTERVAL:
            return
        if self._task is not None and not self._task.done() and not (force or in_task):
            return
        blob = orjson.dumps({"size": self._fed, "checker": self.checker.to_state().decode()})
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        with contextlib.suppress(OSError):
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            # No fsync: a state lost to a power cut only means checking the file again.
            tmp.write_bytes(blob)
            tmp.replace(self.state_file)
            self._saved_at, self._saved_size = time.monotonic(), self._fed

    async def close(self) -> None:
        self._closed = True
        self._later = None  # its entry in the pass is skipped when due
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.save(force=True)


class _Followers:
    """The catch-ups of every file on one event loop, started in one pass: those due now at
    the end of this turn of the loop (one call_soon for all), those waiting for the end of
    their FOLLOW_INTERVAL in one heap under one timer (no TimerHandle per file and write)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._now: list[IncrementalVerifier] = []
        self._scheduled = False
        self._later: list[tuple[float, int, IncrementalVerifier]] = []
        self._numbers = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def soon(self, v: IncrementalVerifier) -> None:
        self._now.append(v)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._pass)

    def later(self, when: float, v: IncrementalVerifier) -> int:
        """Call v._later_due(entry) at `when` (loop time); the entry's number."""
        entry = next(self._numbers)
        heapq.heappush(self._later, (when, entry, v))
        if when < self._timer_at:
            self._arm(when)
        return entry

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._due)

    def _pass(self) -> None:
        self._scheduled = False
        batch, self._now = self._now, []
        for v in batch:
            try:
                v._start()
            except Exception:  # one file's failure must not hold the others' checks
                log.exception("%s: log check failed (tried again at the next change)", v.path)

    def _due(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        now = self.loop.time()
        heap = self._later
        while heap and heap[0][0] <= now:
            _, entry, v = heapq.heappop(heap)
            v._later_due(entry)  # may book again (later than now): _arm below sees it
        if heap and heap[0][0] < self._timer_at:
            self._arm(heap[0][0])


_FOLLOWERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Followers] = (
    weakref.WeakKeyDictionary())


def _followers() -> _Followers:
    loop = asyncio.get_running_loop()
    f = _FOLLOWERS.get(loop)
    if f is None:
        f = _FOLLOWERS[loop] = _Followers(loop)
    return f


def _waiting(checker: Checker) -> int:
    """Bytes fed to `checker` that its checks do not cover yet: a long line and its newline."""
    return checker.unread_line[1] + 1 if checker.unread_line is not None else 0
