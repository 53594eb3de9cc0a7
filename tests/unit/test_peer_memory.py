"""What a listed host's keys cost in memory (issue #23, the hostile long mode): the log
check lists a few problems of a kind per file in the daemon (all are counted), and the heap
gives its free pages back."""

from __future__ import annotations

import ctypes.util

import pytest

from syncd.core.logcheck import LogChecker
from syncd.ops import allocator


def test_a_checker_lists_at_most_what_it_is_told_and_counts_every_problem() -> None:
    checker = LogChecker()
    checker.feed(b"not json\n" * 30)
    checker.list_at_most(10)  # and those listed so far
    checker.feed(b"[1]\n" * 30 + b"still not json\n" * 30)
    report = checker.report()
    assert report.problem_counts == {"invalid_json": 60, "not_object": 30}
    kinds = [p.kind for p in report.problems]
    assert kinds.count("invalid_json") == 10 and kinds.count("not_object") == 10
    # The saved state keeps what was listed, no more.
    again = LogChecker.from_state(checker.to_state())
    assert len(again.report().problems) == 20


def test_verify_still_lists_a_thousand() -> None:
    checker = LogChecker()
    checker.feed(b"x\n" * 1500)
    assert len(checker.report().problems) == 1000


def test_the_heap_gives_its_free_pages_back() -> None:
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(ctypes.CDLL(name), "malloc_trim"):
        pytest.skip("not glibc")
    held = [bytes(300_000 + i) for i in range(60)]  # below the mmap threshold: the heap
    del held[::2]  # holes in the middle, which only malloc_trim gives back
    before = allocator.heap()
    assert allocator.trim()
    assert before["fordblks"] >= 0 and set(allocator.MALLINFO2) == set(before)


def test_a_quiet_heap_is_not_walked_every_second() -> None:
    assert not allocator.worth_trimming(allocator.TRIM_THRESHOLD)
    assert allocator.worth_trimming(allocator.TRIM_THRESHOLD + 1)
    assert allocator.worth_trimming(None)  # no mallinfo2: trim as before


def test_libc_is_looked_up_once() -> None:
    # find_library runs `ldconfig -p`; the trimmer asks every second.
    assert allocator._libc() is allocator._libc()
