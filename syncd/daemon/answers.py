"""Answers held for one peer: a peer's request for bytes is read only while the frames
already answered to that peer and not yet acknowledged by the broker stay under a bound.

The budgets (core/budget.py) meter what a peer may make us send; this bounds what its answers
hold here at once. Without it a burst of requests admitted by `byte_burst` was read, sealed
and queued in paho all at once (the bytes read, the frame, the sealed frame and the packet:
several copies of up to `byte_burst`), before the link wrote any of it. A request met past
the bound waits here (charged to the peer's Holdings, ANSWER_OVERHEAD) and goes back to its
file task as the broker acknowledges that peer's frames (docs/peer-limits.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from syncd.core.budget import Holdings

# A request that waits: a file task's event (core/events.py) or a resource machine's
# (a manifest request, core/resources), given back to whoever it came from.
Event = Any

# Bytes answered to one peer and not yet acknowledged, past which its next request waits.
# One fetch window more may be read past it (the request under way), so at most about
# IN_FLIGHT + fetch_window_bytes are held per peer.
IN_FLIGHT = 4 << 20
WAITED = 100  # bytes a waiting request is charged to its peer's Holdings
RETRY = 1.0  # seconds: what waits is offered again even if no acknowledgement came


class Answering(Protocol):
    """A file task, as far as answers go."""

    @property
    def running(self) -> bool: ...

    def deliver_held(self, event: Event, peer: str, size: int) -> None: ...


class Answers:
    def __init__(self, in_flight: Callable[[str], int], flush: Callable[[], None],
                 holdings: Holdings, bound: int = IN_FLIGHT) -> None:
        self._in_flight = in_flight  # peer -> its bytes sent and not acknowledged (link)
        self._flush = flush  # send what is batched now (it then counts as in flight)
        self._holdings = holdings
        self.bound = bound
        self._waiting: dict[str, deque[tuple[Answering, Event]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._rooms: dict[str, asyncio.Event] = {}  # peer -> set when it is under the bound
        self.waited = 0  # requests that waited, since start

    def wait(self, peer: str, task: Answering, event: Event) -> bool | None:
        """Whether `event`, a request of `peer`, must wait (True: kept here, given back to
        `task` later); None: it must wait and the peer's Holdings are full (dropped: the peer
        asks again after its timeout)."""
        if self.bound <= 0:
            return False
        self._flush()  # answers batched in this turn count too
        if self._in_flight(peer) <= self.bound:
            return False
        if not self._holdings.take(peer, WAITED):
            return None
        self._waiting.setdefault(peer, deque()).append((task, event))
        self.waited += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(RETRY, self._retry)
        return True

    async def room(self, peer: str) -> None:
        """Return once what we answered `peer` is under the bound (a resource file served
        in chunks waits here before each: ResourceFiles._serve)."""
        if self.bound <= 0:
            return
        self._flush()
        while self._in_flight(peer) > self.bound:
            room = self._rooms.get(peer)
            if room is None:
                room = self._rooms[peer] = asyncio.Event()
            self.waited += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETRY):
                    await room.wait()
            self._flush()

    def acked(self, peer: str) -> None:
        """Some of `peer`'s frames were acknowledged: what waits goes on while under the
        bound. One request per acknowledgement at most, so that a drained queue is not
        refilled at once by every waiting request."""
        if self._in_flight(peer) > self.bound:
            return
        room = self._rooms.pop(peer, None)
        if room is not None:
            room.set()
        queue = self._waiting.get(peer)
        if queue:
            self._release(peer, queue)

    def waiting(self, peer: str) -> int:
        queue = self._waiting.get(peer)
        return len(queue) if queue else 0

    def _release(self, peer: str, queue: deque[tuple[Answering, Event]]) -> None:
        task, event = queue.popleft()
        if not queue:
            del self._waiting[peer]
        if task.running:
            task.deliver_held(event, peer, WAITED)
        else:
            self._holdings.give(peer, WAITED)  # its file is no longer replicated

    def _retry(self) -> None:
        """Offered again once a RETRY: a session that ended, a file task stopped, or frames
        that were written whole at once must not leave a request waiting for good."""
        self._timer = None
        for peer, queue in list(self._waiting.items()):
            if self._in_flight(peer) <= self.bound:
                while queue and self._in_flight(peer) <= self.bound:
                    self._release(peer, queue)
                    if peer not in self._waiting:
                        break
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(RETRY, self._retry)
