"""An unfinished line longer than the checker holds (issue #23, case 12): only its length is
kept, in memory and in the saved state; once it ends, the same rules check it as any line."""

from __future__ import annotations

import tracemalloc
from itertools import pairwise

import orjson
import pytest

from syncd.core.logcheck import LogChecker
from tests.support.ishiki import ishiki_lines

HOLD = 64 << 10
HUGE = 32 << 20  # bytes of the one long line: 512 times what the checker holds


def long_line(size: int, turn: str = "t1") -> bytes:
    """A message entry of `size` bytes (newline included) inside turn `turn`."""
    head = orjson.dumps({"id": "big", "type": "message", "turnId": turn,
                         "data": {"role": "user", "content": ""}})[:-3]  # up to `content":"`
    tail = b'"}}\n'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def feed_all(checker: LogChecker, data: bytes, piece: int = 1 << 16) -> None:
    """Feed `data` as the daemon does, handing back each long line when asked."""
    view = memoryview(data)
    for at, end in pairwise([*range(0, len(data), piece), len(data)]):
        chunk = bytes(view[at:end])
        while chunk:
            used = checker.feed(chunk)
            chunk = chunk[used:]
            if checker.unread_line is not None:
                start, length = checker.unread_line
                checker.resume_with(bytes(view[start : start + length]))


def test_a_huge_unfinished_line_keeps_its_length_not_its_bytes() -> None:
    before = ishiki_lines(20)
    big = long_line(HUGE)
    checker = LogChecker(hold=HOLD)
    checker.feed(before)
    piece = big[: 1 << 16]
    tracemalloc.start()
    try:
        for _ in range((len(big) - 1) // len(piece)):  # all of it but its end
            assert checker.feed(piece) == len(piece)
        _, peak = tracemalloc.get_traced_memory()
        state = checker.to_state()
        report = checker.report()
    finally:
        tracemalloc.stop()
    assert peak < 4 * HOLD + (1 << 20)  # not the 32 MiB of the line
    assert len(state) < 64 << 10
    torn = [p for p in report.problems if p.kind == "torn_tail"]
    assert len(torn) == 1 and torn[0].offset == len(before)
    assert "not parsed" in torn[0].message
    assert report.bytes_checked == len(before) + (len(big) - 1) // len(piece) * len(piece)
    # Saved and restored mid-line: only the length travels.
    again = LogChecker.from_state(state, hold=HOLD)
    assert again.report().bytes_checked == report.bytes_checked


def test_a_long_line_that_ends_is_checked_by_the_same_rules() -> None:
    data = (ishiki_lines(5) + orjson.dumps({"id": "s", "type": "event", "turnId": "t1",
                                            "data": {"type": "turn.start"}}) + b"\n"
            + long_line(3 * HOLD) + b'{"not": "closed"\n' + long_line(2 * HOLD, "t2")
            + ishiki_lines(3) + b"torn")
    whole = LogChecker()  # syncd verify: holds everything
    whole.feed(data)
    bounded = LogChecker(hold=HOLD)
    feed_all(bounded, data, piece=1000)
    assert bounded.report() == whole.report()
    # The line waits for the caller: feeding on before it is handed back is refused.
    waiting = LogChecker(hold=HOLD)
    line = long_line(2 * HOLD)
    assert waiting.feed(line + b"more") == len(line)
    assert waiting.unread_line == (0, len(line) - 1)
    with pytest.raises(ValueError, match="must be checked first"):
        waiting.feed(b"more")
    # Saved while it waits: a restarted daemon hands it back the same way.
    restored = LogChecker.from_state(waiting.to_state(), hold=HOLD)
    assert restored.unread_line == (0, len(line) - 1)
    restored.resume_with(line[:-1])
    assert restored.report().entries == 1
