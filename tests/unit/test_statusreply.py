"""The status reply: one build shared by every request that waits, paced, root not paced."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from syncd.ops.statusreply import PACE, StatusReplies

BUILD = 0.05  # seconds each fake build says it took


def replies() -> tuple[StatusReplies, list[float]]:
    started: list[float] = []

    async def build() -> tuple[dict[str, Any], float]:
        started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.01)  # a slice boundary: others arrive meanwhile
        return {"n": len(started)}, BUILD

    return StatusReplies(build), started


def test_every_request_that_waits_gets_the_same_build() -> None:
    async def main() -> list[bytes]:
        r, started = replies()
        lines = await asyncio.gather(*(r.line() for _ in range(64)))
        assert len(started) == 1
        return lines

    lines = asyncio.run(main())
    assert len(set(lines)) == 1
    assert orjson.loads(lines[0]) == {"ok": True, "status": {"n": 1}}


def test_builds_are_paced_except_for_root() -> None:
    async def main() -> None:
        r, started = replies()
        loop = asyncio.get_running_loop()
        await r.line()
        await r.line()  # waits PACE x BUILD after the first build
        assert started[1] - started[0] >= PACE * BUILD
        t = loop.time()
        pausing = asyncio.ensure_future(r.line())  # someone else's: pauses
        await asyncio.sleep(0.01)
        urgent = await r.line(urgent=True)  # root's: the pausing build starts now
        assert loop.time() - t < PACE * BUILD
        assert await pausing == urgent and len(started) == 3

    asyncio.run(main())


def test_a_failing_build_answers_every_waiter_with_an_error() -> None:
    async def build() -> tuple[dict[str, Any], float]:
        raise RuntimeError("boom")

    async def main() -> list[bytes]:
        r = StatusReplies(build)
        return await asyncio.gather(r.line(), r.line())

    for line in asyncio.run(main()):
        reply = orjson.loads(line)
        assert reply["ok"] is False and "boom" in reply["error"]
