"""The writer's file (syncd/core/filemachine/localfile.py), driven directly: records held back
while a batch settles, growth cut into pieces, and bytes past our end that an append of ours
cut short."""

from __future__ import annotations

import hashlib

from syncd.core.events import ReadPlan
from syncd.core.filemachine import localfile
from syncd.core.filemachine.localfile import HoldBack
from syncd.core.filemachine.state import HOLD_BACK_MAX, PAGE
from syncd.core.frames import Data
from syncd.core.ledger import Ledger
from syncd.core.reconcile import LocalChange
from syncd.core.records import Stat
from tests.support.memfile import MemFile


def stat(size: int, mtime: int) -> Stat:
    return Stat(1, 1, size, mtime, mtime)


def test_growth_waits_until_the_file_held_still() -> None:
    h = HoldBack(0.5)
    assert h.held_back(True, stat(10, 1), now=0.0)
    assert h.due() == 0.5
    assert h.held_back(True, stat(10, 1), now=0.4)  # unchanged, not long enough
    assert h.held_back(True, stat(20, 2), now=0.45)  # it moved: the hold starts again
    assert h.due() == 0.95
    assert not h.held_back(True, stat(20, 2), now=0.95)  # held still: ship
    assert h.unsettled is None and h.due() is None


def test_a_writer_that_never_holds_still_ships_after_the_longest_hold() -> None:
    h = HoldBack(0.1)
    now, size = 0.0, 10
    while h.held_back(True, stat(size, size), now):
        now, size = now + 0.05, size + 1
    assert now >= HOLD_BACK_MAX * 0.1 - 1e-9 and now < HOLD_BACK_MAX * 0.1 + 0.1


def test_no_hold_without_growth_or_without_a_hold_time() -> None:
    h = HoldBack(0.5)
    assert h.held_back(True, stat(10, 1), now=0.0)
    assert not h.held_back(False, stat(10, 1), now=0.1) and h.unsettled is None
    assert not HoldBack(0.0).held_back(True, stat(10, 1), now=0.0)


def test_a_look_under_way_stops_the_timer_until_judged() -> None:
    h = HoldBack(0.5)
    h.held_back(True, stat(10, 1), now=0.0)
    h.looking()
    assert h.due() is None
    assert h.held_back(True, stat(10, 1), now=0.1)  # judged again: the timer runs
    assert h.due() == 0.5
    h.drop()
    assert h.unsettled is None


def test_growth_ships_to_the_last_whole_record() -> None:
    new = b'{"a": 1}\n{"b": 2}\n{"c":'
    assert localfile.ship_end("lines", new, 100, line_end=109) == 109
    # More whole lines than one read: ship what the read holds whole.
    assert localfile.ship_end("lines", new, 100, line_end=500) == 118
    # One line longer than the read: its piece, to the read's end.
    assert localfile.ship_end("lines", b"x" * 50, 100, line_end=500) == 150


def test_pieces_cut_at_records_within_the_chunk() -> None:
    buf = b"aaaa\nbbbb\ncccc\n"
    assert list(localfile.pieces("lines", buf, 0, 0, 15, chunk=10)) == [(0, 10), (10, 15)]
    assert list(localfile.pieces("lines", buf, 100, 105, 115, chunk=5)) == [(105, 110),
                                                                          (110, 115)]
    assert list(localfile.pieces("lines", buf, 0, 5, 5, chunk=5)) == []


def test_bytes_past_our_end_may_be_ours_only_inside_the_noted_range_on_a_page() -> None:
    note = ("b", 0, 10, 3 * PAGE, "00" * 32)
    assert localfile.maybe_cut_short(note, 100, 2 * PAGE)
    assert not localfile.maybe_cut_short(note, 100, 2 * PAGE + 1)  # not on a page boundary
    assert not localfile.maybe_cut_short(note, 100, 4 * PAGE)  # past the noted piece
    assert not localfile.maybe_cut_short(None, 100, 2 * PAGE)


def test_bytes_cut_short_are_ours_with_the_whole_piece_or_a_page_of_it() -> None:
    end = 100
    piece = b"p" * (2 * PAGE)
    d = Data(end, b"", piece)
    digest = hashlib.sha256(piece).hexdigest()
    note = ("b", 0, end, end + len(piece), digest)
    assert localfile.cut_short_is_ours(note, end, piece[:PAGE], d)  # a page of the piece
    assert not localfile.cut_short_is_ours(note, end, piece[:3], d)  # `{"i`: a writer's?
    whole = ("b", 0, end, end + 3, hashlib.sha256(b"ppp").hexdigest())
    assert localfile.cut_short_is_ours(whole, end, b"ppp", Data(end, b"", b"ppp"))
    # The peer's bytes over the noted piece must be the ones noted.
    other = ("b", 0, end, end + len(piece), hashlib.sha256(b"another").hexdigest())
    assert not localfile.cut_short_is_ours(other, end, piece[:PAGE], d)
    assert not localfile.cut_short_is_ours(None, end, piece, d)


def test_a_write_across_a_page_is_noted_first_from_the_first_unsynced_byte() -> None:
    ledger = Ledger()
    ledger.extend(b"x" * (PAGE - 10) + b"\n")
    at = ledger.size
    inside = Data(at, ledger.digest(), b"y" * 5)
    assert localfile.append_note(ledger, inside, 0, "b") is None  # one page: not cut short
    across = Data(at, ledger.digest(), b"y" * 20)
    note = localfile.append_note(ledger, across, unsynced=0, peer="b")
    assert note == ("b", at, at, at + 20, hashlib.sha256(b"y" * 20).hexdigest())
    note = localfile.append_note(ledger, across, unsynced=100, peer="b")
    assert note is not None and note[1] == at - 100  # an unsynced append may be cut too


def test_the_file_is_judged_against_the_history_we_hold() -> None:
    data = b'{"a": 1}\n{"b": 2}\n'
    ledger = Ledger()
    ledger.extend(data)
    f = MemFile(data)

    def judged(seen: tuple[int, int] | None = None) -> LocalChange:
        plan = ReadPlan(((ledger.recheck_start(), len(f.data)),), stat=True)
        return localfile.judge_file(ledger, (1, 1), seen, f.read(plan))

    assert judged((len(data), 1)) is LocalChange.NONE
    f.write(b'{"c": 3}\n')
    assert judged((len(data), 1)) is LocalChange.GROWTH
    f.data[len(data) - 3] = ord("9")  # a byte we vouched for
    assert judged() is LocalChange.EDITED
    f.truncate(4)
    assert judged() is LocalChange.SHRUNK
