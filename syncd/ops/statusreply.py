"""The `status` reply of the control socket: one build at a time, shared, and paced.

A thousand keys make a status document of ~700 KB that costs ~150 ms of CPU to build
(Node.status_sliced builds it a few milliseconds at a time, the event loop free in between).
However many clients ask at once, one build runs: every request that arrives while it runs
gets its result, serialized once. After a build, the next one waits PACE times the CPU the
last one took, so that status requests, whoever sends them and however fast, take at most
1 / (1 + PACE) of the loop; replication keeps the rest. A request on a quiet daemon gets a
document built after it arrived, at once, and so does one from root or the daemon's own user
(`urgent`: a failover script) while no build runs: the pause is for everyone else.
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

PACE = 2.0  # idle time after a build, in multiples of the CPU time the build took


class StatusReplies:
    def __init__(self, build: Callable[[], Awaitable[tuple[dict[str, Any], float]]]) -> None:
        """`build`: the status document, and the seconds of loop time building it took."""
        self._build = build
        self._running: asyncio.Future[bytes] | None = None
        self._next_at = 0.0  # loop time before which no build starts
        self._hurry = asyncio.Event()  # set: the pausing build starts now (urgent)
        self._pausing = False
        self.builds = 0  # how many documents were built (tests, bench)

    async def line(self, urgent: bool = False) -> bytes:
        """The reply line to a status request: `{"ok": true, "status": {...}}` and "\\n".
        `urgent`: do not wait for the pause after the last build (root's requests)."""
        if urgent and self._pausing:
            self._hurry.set()  # the build still pausing starts now (everyone waiting gets it)
        if self._running is None:
            self._running = asyncio.ensure_future(self._make())
        # Shielded: a client that goes away must not cancel the build the others wait for.
        return await asyncio.shield(self._running)

    async def _make(self) -> bytes:
        loop = asyncio.get_running_loop()
        try:
            wait = self._next_at - loop.time()
            if wait > 0 and not self._hurry.is_set():
                self._pausing = True
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._hurry.wait()
                finally:
                    self._pausing = False
            self._hurry.clear()
            spent = 0.0
            try:
                status, spent = await self._build()
                started = time.monotonic()
                line = orjson.dumps({"ok": True, "status": status}) + b"\n"
                spent += time.monotonic() - started
            except Exception as e:  # a bug must not leave every client without an answer
                log.exception("building the status failed")
                line = orjson.dumps({"ok": False, "error": f"status failed: {e!r}"}) + b"\n"
            self._next_at = loop.time() + PACE * spent
            self.builds += 1
            return line
        finally:
            self._running = None
