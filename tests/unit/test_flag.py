"""daemon/flag.py: what asyncio.Event does for the file tasks, at a fraction of its memory."""

from __future__ import annotations

import asyncio
import sys

from syncd.daemon.flag import Flag


def test_waiters_wake_when_set_and_a_set_flag_does_not_wait() -> None:
    async def main() -> None:
        flag = Flag()
        woken: list[int] = []

        async def waiter(i: int) -> None:
            await flag.wait()
            woken.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert woken == [] and not flag.is_set()
        flag.set()
        await asyncio.gather(*tasks)
        assert sorted(woken) == [0, 1, 2] and flag.is_set()
        assert await asyncio.wait_for(flag.wait(), 1)  # set: returns at once
        flag.clear()
        assert not flag.is_set()

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    async def main() -> None:
        flag = Flag()
        first = asyncio.create_task(flag.wait())
        second = asyncio.create_task(flag.wait())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        assert first.cancelled() and not second.done()
        flag.set()
        assert await asyncio.wait_for(second, 1)

    asyncio.run(main())


def test_a_flag_is_much_smaller_than_an_event() -> None:
    async def main() -> tuple[int, int]:
        event = asyncio.Event()
        event_size = sys.getsizeof(event) + sys.getsizeof(vars(event)) + sys.getsizeof(
            event._waiters)  # type: ignore[attr-defined]
        return sys.getsizeof(Flag()), event_size

    flag_size, event_size = asyncio.run(main())
    assert flag_size * 8 < event_size
