"""A flag a task waits on: asyncio.Event's set, clear, is_set and wait, for objects kept per
file. An asyncio.Event makes a deque of waiters at once (about 800 bytes with the Event, past
pymalloc's small blocks); a file task had two, for each of up to max_keys files a peer may
make (docs/peer-limits.md). This one holds two slots until someone waits."""

from __future__ import annotations

import asyncio


class Flag:
    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for f in waiters or ():
            if not f.done():
                f.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Return True once the flag is set (at once if it is). `loop`: the running loop, if
        the caller knows it (asyncio's lookup costs a getpid(2): its check for a fork)."""
        if self._set:
            return True
        f: asyncio.Future[None] = (loop or asyncio.get_running_loop()).create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(f)
        try:
            await f
            return True
        finally:
            if self._waiters is not None and f in self._waiters:
                self._waiters.remove(f)  # cancelled: the others still wait
