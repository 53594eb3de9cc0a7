"""The log checks of many files in one pass (logfollow._Followers): a live file's few new
bytes checked at once with no task of its own, more than a slice in a task as before, and
one catch-up start per FOLLOW_INTERVAL per file still."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from syncd.core.spot import Spot
from syncd.daemon import logfollow
from syncd.daemon.logfollow import IncrementalVerifier
from tests.support.ishiki import ishiki_lines


def verifiers(tmp_path: Path, n: int, lines: int = 3) -> list[IncrementalVerifier]:
    out = []
    for i in range(n):
        log_file = tmp_path / f"f{i}.jsonl"
        log_file.write_bytes(ishiki_lines(lines))
        out.append(IncrementalVerifier(Spot(tmp_path, (log_file.name,)),
                                       tmp_path / "state" / f"f{i}.verify"))
    return out


async def until(cond: Callable[[], Any], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def test_many_files_are_checked_in_one_pass_without_a_task_each(tmp_path: Path) -> None:
    vs = verifiers(tmp_path, 50)

    async def scenario() -> None:
        for v in vs:
            size = v.path.path.stat().st_size
            v.follow(lambda size=size: size)
        assert all(v.size == 0 for v in vs)  # nothing read yet: at the end of this turn
        await asyncio.sleep(0)  # one turn of the loop: the pass
        for v in vs:
            assert v._task is None
            assert v.size == v.path.path.stat().st_size
            assert v.caught_up_at is not None
            report = v.report()
            assert report is not None and report.lines == 3

    asyncio.run(scenario())


def test_more_than_a_slice_goes_to_a_task_and_gets_the_same_report(tmp_path: Path) -> None:
    big, small = verifiers(tmp_path, 2, lines=1)
    big.path.path.write_bytes(ishiki_lines(200))
    assert big.path.path.stat().st_size > logfollow.SLICE
    small.path.path.write_bytes(big.path.path.read_bytes())

    async def scenario() -> None:
        size = big.path.path.stat().st_size
        big.follow(lambda: size)
        await asyncio.sleep(0)
        assert big._task is not None  # a backlog: read and parsed in a task, as before
        await until(lambda: big.size == size and big._task is not None and big._task.done())
        # The same bytes a slice at a time through the pass give the same report.
        fed = 0
        while fed < size:
            fed = min(size, fed + logfollow.SLICE // 2)
            small._followed_at = -1e9
            small.follow(lambda fed=fed: fed)
            await asyncio.sleep(0)
            assert small._task is None or small._task.done()
        assert small.size == size
        a, b = small.report(), big.report()
        assert a is not None and b is not None
        assert (a.lines, a.entries, a.bytes_checked) == (b.lines, b.entries, b.bytes_checked), (
            a, b)

    asyncio.run(scenario())


def test_a_second_change_within_the_interval_waits_for_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "FOLLOW_INTERVAL", 0.2)
    vs = verifiers(tmp_path, 3)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        sizes = [v.path.path.stat().st_size for v in vs]
        for v, size in zip(vs, sizes, strict=True):
            v.follow(lambda size=size: size)
        await asyncio.sleep(0)
        assert [v.size for v in vs] == sizes
        started = loop.time()
        for v in vs:
            with v.path.path.open("ab") as f:
                f.write(ishiki_lines(1))
        grown = [v.path.path.stat().st_size for v in vs]
        for v, size in zip(vs, grown, strict=True):
            v.follow(lambda size=size: size)
            v.follow(lambda size=size: size)  # booked once
        await asyncio.sleep(0)
        assert [v.size for v in vs] == sizes  # not yet: one start per interval
        await until(lambda: [v.size for v in vs] == grown)
        assert loop.time() - started >= 0.2 - 0.01

    asyncio.run(scenario())


def test_a_closed_file_is_not_checked_when_its_turn_comes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "FOLLOW_INTERVAL", 0.05)
    first, second = verifiers(tmp_path, 2)

    async def scenario() -> None:
        for v in (first, second):
            size = v.path.path.stat().st_size
            v.follow(lambda size=size: size)
        await first.close()  # closed before the pass ran
        await asyncio.sleep(0)
        assert first.size == 0 and first._task is None
        assert second.size > 0
        with second.path.path.open("ab") as f:
            f.write(ishiki_lines(1))
        size = second.path.path.stat().st_size
        second.follow(lambda: size)  # booked for the end of its interval
        await second.close()
        # Its turn comes and goes (its entry leaves the heap), and does nothing.
        await until(lambda: not logfollow._followers()._later)
        assert second.size < size

    asyncio.run(scenario())


def test_a_long_line_that_ends_the_few_new_bytes_exactly_is_checked_in_a_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line that outgrew HOLD in earlier passes and ends exactly where the few new bytes
    end: the checker left it unread, so the pass hands it to a task, which checks it from
    disk. (c811c5a: the pass had taken "nothing left to feed" for "caught up", and the line
    was never checked.)"""
    monkeypatch.setattr(logfollow, "HOLD", 4 << 10)
    (v,) = verifiers(tmp_path, 1, lines=3)

    async def follow_to_the_end() -> int:
        size = v.path.path.stat().st_size
        v._followed_at = -1e9  # no wait for the interval
        v.follow(lambda: size)
        await asyncio.sleep(0)  # the pass
        return size

    async def scenario() -> None:
        with v.path.path.open("ab") as f:
            f.write(b'{"long": "' + b"x" * (8 << 10))  # unfinished, past HOLD: not held
        await follow_to_the_end()
        assert v._task is None and v.checker.unread_line is None
        with v.path.path.open("ab") as f:
            f.write(b'"}\n')
        size = await follow_to_the_end()
        assert v._task is not None  # the line ended here: checked from disk, in the task
        await until(lambda: v._task is not None and v._task.done())
        assert v.checker.unread_line is None
        assert v.size == size
        report = v.report()
        assert report is not None and report.lines == 4, report

    asyncio.run(scenario())
