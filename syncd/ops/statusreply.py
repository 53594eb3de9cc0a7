"""The `status` reply of the control socket: one build at a time, shared, and paced.

A thousand keys make a status document of ~700 KB that costs ~150 ms of CPU to build
(Node.status_sliced builds it a few milliseconds at a time, the event loop free in between).
However many clients ask at once, one build runs: every request that arrives while it runs
gets its result, serialized once. After a build, the next one waits PACE times the CPU the
last one took, so that status requests, whoever sends them and however fast, take at most
1 / (1 + PACE) of the loop; replication keeps the rest. A request on a quiet daemon gets a
document built after it arrived, at once.
"""

from __future__ import annotations

import asyncio
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
        self.builds = 0  # how many documents were built (tests, bench)

    async def line(self) -> bytes:
        """The reply line to a status request: `{"ok": true, "status": {...}}` and "\\n"."""
        if self._running is None:
            self._running = asyncio.ensure_future(self._make())
        # Shielded: a client that goes away must not cancel the build the others wait for.
        return await asyncio.shield(self._running)

    async def _make(self) -> bytes:
        loop = asyncio.get_running_loop()
        try:
            wait = self._next_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
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
