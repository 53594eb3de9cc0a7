"""When local appends are read and shipped: the commit gate, and the optional batch window.

CommitGate is group commit (core/groupcommit.py): a file's change is read, published and
synced at once when nothing is in flight for that file; what the writer appends meanwhile goes
together in the next one, started the moment the one under way is done. No timer: a lone write
waits for nothing, and under load each commit carries what arrived during the previous one.

In front of it, `batch_window` (default 0: none) may add a wait, BatchWindow below, for a host
that would rather trade lag for fewer, larger frames.

The batch window: a busy writer's appends are read and shipped at most once per window.

Every MQTT message costs the same whatever it carries: a signature here, a verification,
a parse and a wake-up on every peer, and, when it carries one file's bytes, a write and an
fdatasync there. Shipping each append alone makes 500 appends a second cost 500 of each.

So local file changes (the watcher's hints) pass through this gate, like Nagle's algorithm
on a TCP socket: a change after a quiet window is looked at at once, so a lone write waits
for nothing; changes that follow within `window` seconds of the last release are gathered
and released together when it ends. One release reads each changed file once, whatever the
number of appends, and the bytes of every file leave in one frame (outbox.py). Under load the
added lag is at most `window`; the work per write shrinks by the number of writes per window.
While a window is open, the source of changes may stop reporting them (`hold`: the watcher
leaves inotify's events in the kernel) and report them all at its end (`drain`): under a
steady stream of writes the node wakes up once per window, not once per write.

A window of 0 releases every change at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from syncd.core.groupcommit import GroupCommit

T = TypeVar("T", bound=Hashable)


class BatchWindow(Generic[T]):
    def __init__(self, window: float, release: Callable[[T], None],
                 hold: Callable[[], None] = lambda: None,
                 drain: Callable[[], None] = lambda: None,
                 resume: Callable[[], None] = lambda: None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.window = window
        self._release = release  # called once per changed thing, per release
        # The source of changes: stop reporting them as they come (a window opened), report
        # those held back now (to offer(), at the end of a window), report them as they come.
        self._hold, self._drain, self._resume = hold, drain, resume
        self._loop = loop
        self._last = float("-inf")  # loop time of the last release
        self._pending: dict[T, None] = {}  # in order of arrival, each once
        self._timer: asyncio.TimerHandle | None = None  # set while a window is open
        self.releases = 0  # how many releases (of one or more things) so far

    def offer(self, thing: T) -> None:
        """`thing` changed: release it now, or with the others at the end of the window."""
        if self._timer is not None:
            self._pending[thing] = None
            return
        loop = self._loop
        if loop is None:
            # Found once: asyncio's lookup checks the process for a fork (a getpid(2) each).
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._last >= self.window:
            self._last = now
            self.releases += 1
            self._release(thing)
            return
        self._pending[thing] = None
        self._timer = loop.call_at(self._last + self.window, self._end)
        self._hold()

    def flush(self) -> None:
        """Release what is pending now and close the window (a reload may have shortened it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._drain()
            self._timer = None
            self._resume()
            self._release_pending((self._loop or asyncio.get_running_loop()).time())

    def _end(self) -> None:
        self._drain()  # their offers join this release: the timer is still set
        loop = self._loop or asyncio.get_running_loop()
        if not self._pending:  # a quiet window: report changes as they come again
            self._timer = None
            self._resume()
            return
        now = loop.time()
        # Still busy: the next window starts now, and the source stays held. A change during
        # it would wait for its end anyway; reading them all then costs one wake-up, not one
        # per change.
        self._timer = loop.call_at(now + self.window, self._end)
        self._release_pending(now)

    def _release_pending(self, now: float) -> None:
        self._last = now
        pending, self._pending = self._pending, {}
        if pending:
            self.releases += 1
        for thing in pending:
            self._release(thing)


class CommitGate(Generic[T]):
    """Local changes pass through the batch window (if any), then the group commit: `release`
    asks the file to look (read, ship, sync); the file calls done() when that look is over."""

    def __init__(self, window: float, release: Callable[[T], None],
                 hold: Callable[[], None] = lambda: None,
                 drain: Callable[[], None] = lambda: None,
                 resume: Callable[[], None] = lambda: None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._release = release
        self.commit: GroupCommit[T] = GroupCommit()
        self._window: BatchWindow[T] = BatchWindow(window, self._offer, hold, drain, resume,
                                                   loop)

    @property
    def window(self) -> float:
        return self._window.window

    @window.setter
    def window(self, seconds: float) -> None:
        self._window.window = seconds

    def offer(self, thing: T) -> None:
        """`thing` changed: its commit starts now, or after the window, or after the one
        under way."""
        self._window.offer(thing)

    def flush(self) -> None:
        """Pass on what the window holds now (a reload may have shortened it)."""
        self._window.flush()

    def done(self, thing: T) -> None:
        """`thing`'s look is over: start the next commit if it changed meanwhile."""
        if self.commit.done(thing):
            self._release(thing)

    def forget(self, thing: T) -> None:
        self.commit.forget(thing)

    def _offer(self, thing: T) -> None:
        if self.commit.offer(thing):
            self._release(thing)

    def status(self) -> dict[str, object]:
        return {"extra_wait": self.window, "windows": self._window.releases,
                **self.commit.status()}
