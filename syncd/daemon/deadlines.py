"""The file tasks' timers: every file's next Tick in one heap, under one loop timer.

A file's machine names when it next wants a Tick (FileMachine.deadline), and that moves with
nearly every turn (the next announcement, the next persist). One asyncio TimerHandle per file
was cancelled and made again on every write of every busy file: at 1000 busy keys, a
TimerHandle and a push into the loop's heap, whose comparisons are Python calls
(TimerHandle.__lt__), per write, and as many cancelled handles left in that heap. Here a
booking is a tuple pushed into a heap of our own (compared in C), a stale one is skipped when
its time comes, and the loop holds one timer: the earliest.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from collections.abc import Callable

# Stale bookings tolerated before the heap is rebuilt of the live ones only.
SLACK = 1024


class Deadlines:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: dict[int, None] = {}  # numbers of the bookings not cancelled nor run
        self._numbers = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def book(self, when: float, call: Callable[[], None]) -> int:
        """Call `call()` at loop time `when` (or soon after); the booking's number."""
        n = next(self._numbers)
        heapq.heappush(self._heap, (when, n, call))
        self._live[n] = None
        if len(self._heap) > 2 * len(self._live) + SLACK:
            self._heap = [b for b in self._heap if b[1] in self._live]
            heapq.heapify(self._heap)
        if when < self._timer_at:
            self._arm(when)
        return n

    def cancel(self, n: int) -> None:
        self._live.pop(n, None)  # its entry stays in the heap, skipped when due

    def __len__(self) -> int:
        return len(self._live)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._due)

    def _due(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        heap, live = self._heap, self._live
        now = self.loop.time()
        due = []
        while heap and heap[0][0] <= now:
            _, n, call = heapq.heappop(heap)
            if n in live:
                del live[n]
                due.append(call)
        while heap and heap[0][1] not in live:
            heapq.heappop(heap)  # stale: no timer for it
        if heap:
            self._arm(heap[0][0])
        for call in due:  # each may book again (the timer is armed already)
            call()


_OF: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
    weakref.WeakKeyDictionary())


def of_running_loop() -> Deadlines:
    """The running loop's Deadlines (made at first use)."""
    loop = asyncio.get_running_loop()
    d = _OF.get(loop)
    if d is None:
        d = _OF[loop] = Deadlines(loop)
    return d
