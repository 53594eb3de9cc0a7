"""Large frames opened on a thread of their own, handed back to the loop in arrival order.

Opening a catch-up's 1000 KiB frame is a SHA-256 of its ciphertext (the wrap's associated
data, sealed.py) and AES-GCM of its body: about 0.7 ms on the standby's loop, on top of
the write(2), the ledger's SHA-256 and the `.appending` note's SHA-256 of the frame before,
all on the same thread. hashlib and write(2) release the GIL, so opening the next frame on
another thread while the loop writes this one uses the second core (docs/catch-up.md has
the figures).

Nothing but the opening moves: the gate's checks after it (replay, presence, bounds,
delivery) run on the loop, in the order the frames came, as before. Once a frame waits
here, every later one waits behind it (opened on the same single thread, one at a time), so
no frame overtakes another. What waits is bounded (AHEAD_BYTES): past it the loop waits for
the oldest frame, as it waited for every frame before, so a peer's frames cost no more
memory here than a few frames (docs/peer-limits.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("syncd.node")

LARGE = 256 << 10  # payloads from this size are opened on the thread (fills, full chunks)
AHEAD_BYTES = 2 << 20  # bytes of payloads waiting to be opened or handed on, at most

Opened = Callable[[Any], None]  # the gate's rest: gets the frame, or the exception raised


class Opening:
    def __init__(self) -> None:
        self._waiting: deque[tuple[Future[Any], Opened, int]] = deque()
        self._bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, size: int, opener: Callable[[], Any], then: Opened) -> None:
        """`then(opener())` (or `then(exception)`), now if nothing waits and the payload is
        small, else once `opener` ran on the thread and every earlier frame was handed on."""
        if not self._waiting and size < LARGE:
            then(_call(opener))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="syncd-open")
            self._loop = asyncio.get_running_loop()
        future = self._pool.submit(_call, opener)
        self._waiting.append((future, then, size))
        self._bytes += size
        loop = self._loop
        assert loop is not None
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._hand_on))
        while self._bytes > AHEAD_BYTES and self._waiting:
            self._waiting[0][0].result()  # the oldest frame, waited for here (bounded)
            self._hand_on()

    def _hand_on(self) -> None:
        """Hand on every opened frame at the front, in arrival order."""
        waiting = self._waiting
        while waiting and waiting[0][0].done():
            future, then, size = waiting.popleft()
            self._bytes -= size
            try:
                then(future.result())
            except Exception:
                # One bad message must not stop the frames behind it.
                log.exception("error handling an opened frame")

    def close(self) -> None:
        """At shutdown: what waits is dropped (anti-entropy asks for it again)."""
        self._waiting.clear()
        self._bytes = 0
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _call(opener: Callable[[], Any]) -> Any:
    try:
        return opener()
    except Exception as e:  # the gate tells a rejection from a frame not for us
        return e
