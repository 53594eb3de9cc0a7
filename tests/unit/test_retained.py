"""Retained positions are paced per file, and never hold back what a later host must know."""

from __future__ import annotations

from syncd.core.frames import Announce
from syncd.core.retained import RetainPacer

D = b"\x01" * 32
F = ("bot-1", "events.jsonl")
G = ("bot-2", "events.jsonl")


def test_the_first_announcement_goes_at_once_then_one_per_gap_ending_on_the_latest() -> None:
    p = RetainPacer(gap=5.0)
    assert p.offer(F, Announce(10, D), now=0.0)
    assert not p.offer(F, Announce(20, D), now=1.0)
    assert not p.offer(F, Announce(30, D), now=2.0)
    assert p.next_due() == 5.0
    assert p.due(4.9) == []
    assert p.due(5.0) == [(F, Announce(30, D))]  # the latest, not every one held back
    assert p.next_due() is None
    assert p.offer(F, Announce(40, D), now=10.0)  # a gap since the last one: at once


def test_what_a_later_host_must_not_miss_is_never_held_back() -> None:
    p = RetainPacer(gap=5.0)
    assert p.offer(F, Announce(10, D), now=0.0)
    assert p.offer(F, Announce(10, D, frozen="reset"), now=0.1)
    assert p.offer(F, Announce(10, D, frozen=None), now=0.2)  # unfrozen again
    assert p.offer(F, Announce(10, D, diverged=("b",)), now=0.3)
    assert p.offer(F, Announce(10, D, diverged=("b",), answers=7), now=0.4)
    assert p.offer(F, Announce(4, D, diverged=("b",)), now=0.5)  # history replaced: shorter


def test_files_are_paced_apart_and_a_new_connection_starts_afresh() -> None:
    p = RetainPacer(gap=5.0)
    assert p.offer(F, Announce(1, D), now=0.0)
    assert p.offer(G, Announce(1, D), now=3.0)
    assert not p.offer(F, Announce(2, D), now=3.5)
    assert not p.offer(G, Announce(2, D), now=4.0)
    assert p.next_due() == 5.0
    assert p.due(5.0) == [(F, Announce(2, D))]
    assert p.next_due() == 8.0
    p.forget()
    assert p.next_due() is None
    assert p.offer(G, Announce(3, D), now=6.0)


def test_everything_held_back_can_go_at_once() -> None:
    p = RetainPacer(gap=5.0)
    assert p.offer(F, Announce(1, D), now=0.0)
    assert not p.offer(F, Announce(2, D), now=1.0)
    assert p.due(1.5, everything=True) == [(F, Announce(2, D))]
    assert not p.offer(F, Announce(3, D), now=2.0)  # paced from 1.5 on
    assert p.next_due() == 6.5


def test_the_next_due_file_is_found_among_thousands_and_an_urgent_send_restarts_its_gap() -> None:
    p = RetainPacer(gap=5.0)
    files = [(f"bot-{i}", "events.jsonl") for i in range(3000)]
    for i, f in enumerate(files):
        assert p.offer(f, Announce(1, D), now=i / 1000)
        assert not p.offer(f, Announce(2, D), now=3.0 + i / 1000)
    assert p.next_due() == 5.0
    # The first file's urgent announcement goes at once: its held-back one is gone, and its
    # next gap runs from now.
    assert p.offer(files[0], Announce(1, D, frozen="reset"), now=4.0)
    assert p.next_due() == 5.001
    assert not p.offer(files[0], Announce(2, D, frozen="reset"), now=4.5)
    due = p.due(5.0025)
    assert due == [(files[1], Announce(2, D)), (files[2], Announce(2, D))]
    assert len(p.due(9.0)) == 2998  # the 2997 others, and files[0] (4.0 + 5)
    assert p.next_due() is None


def test_a_file_no_longer_replicated_is_never_due_nor_restated() -> None:
    p = RetainPacer(gap=5.0)
    assert p.offer(F, Announce(1, D), now=0.0)
    assert not p.offer(F, Announce(2, D), now=1.0)
    assert p.offer(G, Announce(1, D), now=1.0)
    p.drop(F)
    assert p.next_due() is None and p.due(100.0) == [] and p.due(100.0, everything=True) == []
    assert [w for w, _ in p.latest()] == [G]
