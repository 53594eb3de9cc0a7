"""The local writer's file: which of its new records wait (a writer's batch still settling),
how its growth is cut into pieces, and whether bytes past our end are what an append of ours
cut short. The machine (`machine.py`) judges the file with these; none of them touches it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from syncd.core import recordkinds
from syncd.core.events import Snapshot
from syncd.core.filemachine.state import HOLD_BACK_MAX, PAGE, Unsettled, first_read
from syncd.core.frames import Data
from syncd.core.ledger import Ledger
from syncd.core.reconcile import LocalChange, judge_local
from syncd.core.records import Appending, Stat


def judge_file(ledger: Ledger, inode: tuple[int, int] | None, seen: tuple[int, int] | None,
               snap: Snapshot) -> LocalChange:
    """Is our history still a prefix of the file (read from Ledger.recheck_start() on), at
    the inode we describe, with nothing unrecorded past our end? (`seen`: the size and mtime
    judged last; None judges the bytes whatever the stat says.)"""
    st = snap.stat
    tail: bool | None = None
    if st is not None and st.size >= ledger.size:
        tail = ledger.matches_end(first_read(snap)[: ledger.size - ledger.recheck_start()])
    stat_now = (st.dev, st.ino, st.size, st.mtime_ns) if st else None
    return judge_local(ledger.size, inode, seen, stat_now, tail)


class HoldBack:
    """The writer's new whole records wait, unrecorded and unshipped, until the file held
    still `seconds` (docs/design.md, "A writer's rollback").

    A writer that rolls a failed batch back (dsh-session truncates the file to its previous
    length after a failed write or sync) does so right after the write or the sync returns.
    Records shipped meanwhile would be bytes the standbys keep and the writer withdrew;
    records still held are only unshipped bytes, whose truncation is no event. A file that
    never holds still ships after HOLD_BACK_MAX holds anyway."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.unsettled: Unsettled | None = None

    def held_back(self, growth: bool, st: Stat, now: float) -> bool:
        """Whether the growth seen in `st` waits (a look is due at `due()`)."""
        if not growth or self.seconds <= 0:
            self.unsettled = None
            return False
        seen = (st.size, st.mtime_ns)
        u = self.unsettled
        if u is None or u.seen != seen:
            u = self.unsettled = Unsettled(seen, now, u.first if u is not None else now)
        if now >= u.since + self.seconds or now >= u.first + HOLD_BACK_MAX * self.seconds:
            self.unsettled = None
            return False
        u.looked = False
        return True

    def due(self) -> float | None:
        """When the held records should be looked at again (None: nothing held, or a look
        asked for is under way)."""
        u = self.unsettled
        if u is None or u.looked:
            return None
        return min(u.since + self.seconds, u.first + HOLD_BACK_MAX * self.seconds)

    def looking(self) -> None:
        """The look asked for when due is under way: no timer until the file is judged."""
        assert self.unsettled is not None
        self.unsettled.looked = True

    def drop(self) -> None:
        """What was held back is gone (rolled back) or never was."""
        self.unsettled = None


def ship_end(records: str, new: bytes, start: int, line_end: int) -> int:
    """Where the shipped growth ends: at the last whole record (`line_end`) if the read
    `new` (from `start`) covers it, else at the read's last whole record, else (one record
    longer than the read, and complete) at the read's end, in pieces."""
    read_end = start + len(new)
    if line_end <= read_end:
        return line_end
    cut = recordkinds.last_end(records, new)
    return start + cut if cut > 0 else read_end


def pieces(records: str, buf: bytes, origin: int, start: int, end: int,
           chunk: int) -> Iterator[tuple[int, int]]:
    """[start, end) of the file cut into frames of whole records of at most `chunk` bytes
    where records allow (`buf` holds the file from `origin`): (offset, stop) pairs."""
    pos = start
    while pos < end:
        stop = origin + recordkinds.piece_end(records, buf, pos - origin, end - origin, chunk)
        yield pos, stop
        pos = stop


def maybe_cut_short(appending: Appending | None, end: int, file_size: int) -> bool:
    """Whether the bytes past our `end` may be what an append of ours cut short left: inside
    the range we were appending (`appending`), and ending on a page boundary. They are ours
    only if they are also byte for byte what a peer sends there, and cut_short_is_ours."""
    return (appending is not None and appending[1] <= end < file_size <= appending[3]
            and file_size % PAGE == 0)


def cut_short_is_ours(appending: Appending | None, end: int, local: bytes, d: Data) -> bool:
    """Bytes `local` past our `end`, equal to the start of the peer's `d` and inside the noted
    range (maybe_cut_short): ours, or a local writer's that happen to be equal? A process
    killed before its append leaves the note and no byte; the local writer may then start a
    line there, and every line of a log starts alike (simulator seed 7027257: 3 bytes,
    `{"i`, spliced a writer's line into a peer's history). So: the whole piece, with the
    digest noted, or at least a page of the piece's own bytes (no writer's line equals a
    peer's for that long); and where the peer's bytes cover the noted piece, they must be
    the noted ones (the history we were appending). Anything else is refused as a
    divergence, never spliced."""
    if appending is None:
        return False
    _, _, offset, stop, digest = appending
    if d.offset <= offset and d.end >= stop and hashlib.sha256(
            d.data[offset - d.offset: stop - d.offset]).hexdigest() != digest:
        return False
    size = end + len(local)
    if size == stop and offset >= end and hashlib.sha256(
            local[offset - end:]).hexdigest() == digest:
        return True
    # The piece's bytes in the file: [offset, size), all equal to the peer's (those below
    # `end` by the digest the peer's base matched, the others byte for byte).
    return size - (offset if size > offset else end) >= PAGE


def append_note(ledger: Ledger, d: Data, unsynced: int, peer: str) -> Appending | None:
    """The `.appending` note to write before appending the peer's `d`, if that write crosses
    a page (None: it cannot be cut short).

    A write() that a kill or a power loss may cut short mid-line (an intent vouches only for
    the whole piece): say so first, with the piece's digest. Not synced: an fsync per frame
    doubled the replication lag (docs/design.md). A power loss may keep some of the piece's
    pages and drop the note; bytes past our end without one are then taken for a local
    writer's torn line: a false divergence, frozen until `adopt` (issue #23 case 9,
    accepted), never a splice. Up to this piece's end only: a wider range (a fetch's window)
    would vouch for a local writer's torn line after it (the simulator found one). From the
    start of the line it continues, if that line is unfinished here (a restart counts whole
    lines only, so bytes of ours before this piece would sit past our end too), and from the
    first byte not yet synced: a power loss may cut any unsynced append, not only this one
    (seed 3164 of the simulator with power cuts that keep a page-cut tail)."""
    if d.offset // PAGE == (d.end - 1) // PAGE:
        return None
    start = ledger.open_line_start
    first = min(d.offset if start is None else min(start, d.offset),
                max(0, ledger.size - unsynced))
    return (peer, first, d.offset, d.end, hashlib.sha256(d.data).hexdigest())
