"""A bot's huge line without its newline (issue #23, case 12), through the daemon's log check
(logfollow.py) on a real file: bounded memory, the event loop never held, and once the line
ends it is checked (in a process of its own) like any other."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from pathlib import Path

import orjson
import pytest

from syncd.core.spot import Spot
from syncd.daemon import logfollow
from syncd.daemon.logfollow import IncrementalVerifier
from tests.support.ishiki import ishiki_lines

HUGE = 200 << 20  # the size that stalled the loop 0.85-2 s and cost +530 MB per save
HOLD = 1 << 20  # what the daemon holds of an unfinished line (logfollow.HOLD)


def write_huge_unfinished_line(path: Path, size: int) -> bytes:
    """`path` gets a few lines, then the start of one message of `size` bytes, without its
    end; returns the bytes that end it."""
    head = orjson.dumps({"id": "big", "type": "message",
                         "data": {"role": "user", "content": ""}})[:-3]
    tail = b'"}}\n'
    block = b"x" * (1 << 20)
    with path.open("wb") as f:
        f.write(ishiki_lines(10) + head)
        left = size - len(head) - len(tail)
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
    return tail


async def follow_until(verifier: IncrementalVerifier, target: int, seconds: float,
                       gaps: list[float]) -> None:
    """Follow the file until `target` bytes are checked, measuring the loop's longest gap."""
    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    deadline = time.monotonic() + seconds
    try:
        while verifier.size < target:
            assert time.monotonic() < deadline, f"checked {verifier.size} of {target} bytes"
            verifier._followed_at = -1e9  # no FOLLOW_INTERVAL pause between catch-ups
            verifier.follow(lambda: target)
            await asyncio.sleep(0.05)
        if verifier._task is not None:
            await asyncio.wait_for(verifier._task, seconds)
    finally:
        ticker.cancel()


def test_a_200_mib_unfinished_line_costs_bounded_memory_and_never_holds_the_loop(
    tmp_path: Path
) -> None:
    log_file = tmp_path / "events.jsonl"
    state = tmp_path / "state" / "events.jsonl.verify"
    tail = write_huge_unfinished_line(log_file, HUGE)
    unfinished = log_file.stat().st_size

    async def scenario() -> tuple[int, float, float]:
        # Reached as the daemon reaches it: from the root, one component at a time.
        verifier = IncrementalVerifier(Spot(tmp_path, (log_file.name,)), state)
        gaps: list[float] = []
        tracemalloc.start()
        try:
            await follow_until(verifier, unfinished, 120, gaps)
            verifier.save(force=True)  # the save that cost +530 MB and a long stall
            report = verifier.report()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert report is not None and report.problem_counts["torn_tail"] == 1
        with log_file.open("ab") as f:
            f.write(tail)  # the bot ends its line
        end = log_file.stat().st_size
        await follow_until(verifier, end, 120, gaps)
        report = verifier.report()
        assert report is not None and report.entries == 11  # the long line parsed
        assert not {"torn_tail", "invalid_json"} & set(report.problem_counts)
        await verifier.close()
        return peak, max(gaps), state.stat().st_size

    peak, longest_gap, saved = asyncio.run(scenario())
    # The reads are 4 MiB steps (logfollow.STEP); the line itself is never held whole.
    assert peak < 16 * HOLD + (16 << 20), f"peak {peak / 2**20:.0f} MiB"
    assert saved < 1 << 20
    # Generous for a loaded machine: the old save alone held the loop for 0.85-2 s.
    assert longest_gap < 0.5, f"the loop was held {longest_gap:.2f} s"


def test_unfinished_lines_of_all_files_share_one_pool(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Three files, each 300 KiB into a line, against a pool of 512 KiB: the first file's
    line is held, the second's fills the pool up to the limit and is then only measured, and
    the third's is only measured. Once a line ends it is checked all the same (from disk).
    A verifier that goes gives its share back."""
    pool = logfollow.HeldLines(512 << 10)
    monkeypatch.setattr(logfollow, "HELD", pool)
    head = b'{"id":"big","type":"message","data":{"role":"user","content":"'
    unfinished = head + b"x" * (300 << 10)
    verifiers = []
    for i in range(3):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(ishiki_lines(3) + unfinished)
        v = IncrementalVerifier(path, tmp_path / f"{i}.verify")
        asyncio.run(follow_until(v, path.stat().st_size, 30, []))
        verifiers.append(v)
    assert pool.used <= pool.limit, pool.used
    assert [v.checker.held_bytes > 0 for v in verifiers] == [True, False, False]
    assert pool.outgrown == 2
    # The third file's line ends: checked from disk (longline.py), clean.
    path = tmp_path / "2.jsonl"
    with path.open("ab") as f:
        f.write(b'"}}\n')
    asyncio.run(follow_until(verifiers[2], path.stat().st_size, 60, []))
    report = verifiers[2].report()
    assert report is not None and report.entries == 4, report  # the long line parsed
    assert not {"torn_tail", "invalid_json"} & set(report.problem_counts), report
    held = pool.used
    del verifiers[0]
    gc.collect()
    assert pool.used < held
