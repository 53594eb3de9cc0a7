"""The `status` reply of the control socket: one build at a time, shared, and paced.

A thousand keys make a status document of ~850 KB that costs ~150-250 ms of CPU to build
(Host.status_sliced builds it a few milliseconds at a time, the event loop free in between).
However many clients ask at once, one build of the whole document runs: every request that
arrives while it runs gets its result, serialized once. A request that selects keys (`select`)
gets a build of its own, of those keys' files only, but in the same queue. After any build,
the next one waits PACE times the time the last one took, so that status requests, whoever
sends them and however fast, take at most 1 / (1 + PACE) of the loop; replication keeps the
rest. A request on a quiet daemon gets a document built after it arrived, at once, and so
does one from root or the daemon's own user (`urgent`: a failover script): the pause is for
everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger("syncd.control")

PACE = 2.0  # idle time after a build, in multiples of the time the build took

Build = Callable[[], Awaitable[tuple[dict[str, Any], float]]]  # document, seconds it took


class StatusReplies:
    def __init__(self, build: Build) -> None:
        """`build`: the whole status document, and the seconds of loop time it took."""
        self._build = build
        self._running: asyncio.Future[bytes] | None = None
        self._turn = asyncio.Lock()  # one build at a time, shared or selected
        self._next_at = 0.0  # loop time before which no build starts
        self._hurry = asyncio.Event()  # set: the pausing build starts now (urgent)
        self._pausing = False
        self.builds = 0  # how many documents were built (tests, bench)

    async def line(self, urgent: bool = False) -> bytes:
        """The reply line to a status request: `{"ok": true, "status": {...}}` and "\\n".
        `urgent`: do not wait for the pause after the last build (root's requests)."""
        self._urge(urgent)
        if self._running is None:
            self._running = asyncio.ensure_future(self._shared())
        # Shielded: a client that goes away must not cancel the build the others wait for.
        return await asyncio.shield(self._running)

    async def selected(self, build: Build, urgent: bool = False) -> dict[str, Any]:
        """A document of its own (`build`: of the keys a request selects), in turn."""
        self._urge(urgent)
        async with self._turn:
            await self._pause()
            status, spent = await build()
            self._paced(spent)
            return status

    def _urge(self, urgent: bool) -> None:
        if urgent and self._pausing:
            self._hurry.set()  # the build still pausing starts now (everyone waiting gets it)

    async def _pause(self) -> None:
        wait = self._next_at - asyncio.get_running_loop().time()
        if wait > 0 and not self._hurry.is_set():
            self._pausing = True
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._hurry.wait()
            finally:
                self._pausing = False
        self._hurry.clear()

    def _paced(self, spent: float) -> None:
        self._next_at = asyncio.get_running_loop().time() + PACE * spent
        self.builds += 1

    async def _shared(self) -> bytes:
        try:
            async with self._turn:
                await self._pause()
                spent = 0.0
                try:
                    status, spent = await self._build()
                    started = time.monotonic()
                    line = orjson.dumps({"ok": True, "status": status}) + b"\n"
                    spent += time.monotonic() - started
                except Exception as e:  # a bug must not leave every client without an answer
                    log.exception("building the status failed")
                    line = orjson.dumps({"ok": False, "error": f"status failed: {e!r}"}) + b"\n"
                self._paced(spent)
                return line
        finally:
            self._running = None
