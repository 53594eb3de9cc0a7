"""Answers (daemon/answers.py): a peer's request for bytes waits while what we answered that
peer is in flight past the bound, and goes back to its file task as the broker acknowledges."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from syncd.core.budget import Holdings
from syncd.core.events import Event, PeerRequest
from syncd.core.frames import Request
from syncd.daemon.answers import WAITED, Answers

MiB = 1 << 20


class Task:
    def __init__(self) -> None:
        self.running = True
        self.got: list[tuple[Event, str, int]] = []

    def deliver_held(self, event: Event, peer: str, size: int) -> None:
        self.got.append((event, peer, size))


async def until(cond: Callable[[], Any], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _request(n: int) -> PeerRequest:
    return PeerRequest("x", Request(0, b"", n * MiB, MiB))


def _answers(in_flight: dict[str, int], holdings: Holdings) -> tuple[Answers, list[int]]:
    flushes: list[int] = []
    answers = Answers(lambda p: in_flight.get(p, 0), lambda: flushes.append(1), holdings,
                      bound=4 * MiB)
    return answers, flushes


def test_a_request_waits_while_the_peers_answers_in_flight_pass_the_bound() -> None:
    async def run() -> None:
        in_flight = {"x": 3 * MiB, "b": 0}
        holdings = Holdings(1000)
        answers, flushes = _answers(in_flight, holdings)
        task = Task()
        assert answers.wait("x", task, _request(0)) is False  # under the bound: read now
        assert flushes  # what is batched counts as in flight before the check
        in_flight["x"] = 5 * MiB
        first, second = _request(1), _request(2)
        assert answers.wait("x", task, first) is True
        assert answers.wait("x", task, second) is True
        assert answers.wait("b", task, _request(3)) is False  # another peer is not held up
        assert holdings.held == {"x": 2 * WAITED}  # charged to x while it waits
        answers.acked("x")  # still past the bound: nothing goes on
        assert task.got == []
        in_flight["x"] = 4 * MiB
        answers.acked("x")  # one per acknowledgement
        assert task.got == [(first, "x", WAITED)]
        answers.acked("x")
        assert task.got == [(first, "x", WAITED), (second, "x", WAITED)]
        assert answers.waiting("x") == 0

    asyncio.run(run())


def test_past_the_peers_holdings_a_request_is_dropped() -> None:
    async def run() -> None:
        holdings = Holdings(WAITED)
        answers, _ = _answers({"x": 5 * MiB}, holdings)
        task = Task()
        assert answers.wait("x", task, _request(0)) is True
        assert answers.wait("x", task, _request(1)) is None  # the peer asks again later
        assert answers.waiting("x") == 1

    asyncio.run(run())


def test_what_waits_is_offered_again_without_an_acknowledgement() -> None:
    async def run() -> None:
        in_flight = {"x": 5 * MiB}
        holdings = Holdings(1000)
        answers, _ = _answers(in_flight, holdings)
        gone, live = Task(), Task()
        gone.running = False
        answers.wait("x", gone, _request(0))
        answers.wait("x", live, _request(1))
        in_flight["x"] = 0  # the session ended: nothing of it is held, no PUBACK will come
        await until(lambda: not answers.waiting("x"))
        assert gone.got == [] and len(live.got) == 1
        assert holdings.held == {"x": WAITED}  # the stopped task's charge given back

    asyncio.run(run())


def test_a_served_file_waits_for_room_before_its_next_chunk() -> None:
    async def run() -> None:
        in_flight = {"x": 5 * MiB}
        answers, _ = _answers(in_flight, Holdings(1000))
        waiter = asyncio.create_task(answers.room("x"))
        await asyncio.sleep(0)
        assert not waiter.done()
        in_flight["x"] = MiB
        answers.acked("x")
        await asyncio.wait_for(waiter, 5)

    asyncio.run(run())
