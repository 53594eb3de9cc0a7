"""The file tasks' shared timer (daemon/deadlines.py): each booking called once at its time,
in order; a cancelled or rebooked one never; the heap rebuilt once stale bookings pile up."""

from __future__ import annotations

import asyncio

from syncd.daemon import deadlines
from syncd.daemon.deadlines import Deadlines


def test_bookings_are_called_in_order_and_cancelled_ones_never() -> None:
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        d = Deadlines(loop)
        called: list[str] = []
        done = asyncio.Event()
        t0 = loop.time()
        d.book(t0 + 0.03, lambda: called.append("c"))
        d.book(t0 + 0.01, lambda: called.append("a"))
        gone = d.book(t0 + 0.02, lambda: called.append("cancelled"))
        d.book(t0 + 0.02, lambda: called.append("b"))
        d.cancel(gone)
        d.book(t0 + 0.04, done.set)
        await asyncio.wait_for(done.wait(), 5)
        assert loop.time() >= t0 + 0.04
        assert len(d) == 0
        return called

    assert asyncio.run(scenario()) == ["a", "b", "c"]


def test_a_booking_made_when_one_is_called_is_called_too() -> None:
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        d = Deadlines(loop)
        calls = 0
        done = asyncio.Event()

        def again() -> None:
            nonlocal calls
            calls += 1
            if calls < 5:
                d.book(loop.time() + 0.001, again)
            else:
                done.set()

        d.book(loop.time(), again)
        d.book(loop.time() + 3600, lambda: None)  # a far one does not hold the near ones
        await asyncio.wait_for(done.wait(), 5)
        return calls

    assert asyncio.run(scenario()) == 5


def test_stale_bookings_do_not_pile_up() -> None:
    async def scenario() -> int:
        d = Deadlines(asyncio.get_running_loop())
        far = asyncio.get_running_loop().time() + 3600
        n = d.book(far, lambda: None)
        for i in range(10 * deadlines.SLACK):  # one file rebooked on every write
            d.cancel(n)
            n = d.book(far + i, lambda: None)
        assert len(d) == 1
        return len(d._heap)

    assert asyncio.run(scenario()) <= 2 + deadlines.SLACK + 1
