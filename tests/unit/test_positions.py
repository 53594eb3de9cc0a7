"""PositionSender (syncd/net/positions.py) on a real event loop: routine positions of many files
share one release, an urgent one goes at once and drops the routine one held for its file,
and retained copies are paced per file."""

from __future__ import annotations

import asyncio

from syncd.core import frames
from syncd.core.frames import Announce, Kind
from syncd.net.positions import PositionSender

D = b"\x01" * 32


def pos(key: str, size: int, **kw: object) -> frames.Item:
    return frames.Item(Kind.POS, Announce(size, D, **kw), key, "events.jsonl")  # type: ignore[arg-type]


class Sent:
    def __init__(self) -> None:
        self.batched: list[frames.Item] = []
        self.retained: list[frames.Item] = []
        self.changed = asyncio.Event()

    def batch(self, item: frames.Item) -> None:
        self.batched.append(item)
        self.changed.set()

    def retain(self, key: str, file: str, item: frames.Item) -> None:
        self.retained.append(item)

    async def until(self, n: int) -> None:
        async def met() -> None:
            while len(self.batched) < n:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(met(), 5)


def test_routine_positions_share_a_release_and_urgent_ones_go_at_once() -> None:
    async def run() -> None:
        sent = Sent()
        p = PositionSender(sent.batch, sent.retain)
        for i in range(100):
            p.announce(f"bot-{i}", "events.jsonl", pos(f"bot-{i}", 10))
        p.announce("bot-0", "events.jsonl", pos("bot-0", 20))  # replaces the held one
        assert sent.batched == []  # held, to share a frame
        urgent = pos("bot-1", 10, frozen="reset")
        p.announce("bot-1", "events.jsonl", urgent)
        assert sent.batched == [urgent]  # at once
        await sent.until(100)  # bot-0 (its newer one) and bot-2..99; bot-1's routine one dropped
        assert len(sent.batched) == 100
        assert pos("bot-0", 20) in sent.batched and pos("bot-0", 10) not in sent.batched
        assert pos("bot-1", 10) not in sent.batched
        # Retained: each file's first announcement at once, then paced.
        assert len(sent.retained) == 101  # 100 firsts, and the freeze of bot-1
        p.announce("bot-5", "events.jsonl", pos("bot-5", 30))
        assert len(sent.retained) == 101  # held back until its gap has passed
        p.retain_everything()  # a peer came online
        assert sent.retained[-1] == pos("bot-5", 30)
    asyncio.run(run())
