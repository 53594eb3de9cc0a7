"""The per-file machine without sockets or files: scripted events in, expected effects out.

Each test drives `syncd.core.filemachine.FileMachine` the way the shell does (reads the planned
bytes from an in-memory file, hands over event and snapshot) and asserts on the effects.
Milliseconds each; the end-to-end tests stay the acceptance layer.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from syncd.core.events import (
    Append,
    Appended,
    Drained,
    Event,
    FindLine,
    IoFailed,
    Loaded,
    Log,
    Look,
    LookAgain,
    NoteAppending,
    PeerData,
    PeerOnline,
    PeerPos,
    PeerProbe,
    PeerProbed,
    PeerRefuse,
    PeerRequest,
    Persist,
    Redeliver,
    Rehash,
    Rehashed,
    Send,
    Snapshot,
    Sync,
    Synced,
    SyncFailed,
    Tick,
)
from syncd.core.filemachine import (
    LOCATE_RETRY,
    PAGE,
    FileMachine,
    Mode,
    Tuning,
)
from syncd.core.frames import Announce, Data, Kind, Probe, Probed, ProbeWhat, Refuse, Request
from syncd.core.ledger import BLOCK, Ledger, Position, digest_of
from syncd.core.records import Appending, FileRecord, Stat
from tests.support.memfile import File, feed, live, sent

LINE = b'{"id": "1"}\n'


def test_local_growth_ships_whole_lines_only_then_syncs_before_announcing() -> None:
    m, f = live(LINE)
    f.write(b'{"id": "2"}\n{"id": "3", "torn')
    out = feed(m, f, Look(), now=2.0)
    live_frames = sent(out, Kind.LIVE)
    assert [e.payload.data for e in live_frames] == [b'{"id": "2"}\n{"id": "3", "torn'[:12]]
    assert isinstance(live_frames[0].payload, Data)
    assert live_frames[0].payload.base == digest_of(LINE)
    order = [type(e).__name__ for e in out if isinstance(e, Send | Sync)]
    assert order.index("Sync") < len(order) - 1 and m.position.size == 24


def test_the_commit_gates_full_look_ships_in_one_turn_what_a_stat_first_look_ships() -> None:
    # FileTask.released: the watcher's hint is no append of ours, so the look reads the bytes
    # at once; the stat-first look (a sweep's) gets there through a Redeliver.
    growth = b'{"id": "2"}\n{"id": "3"}\n'
    m1, f1 = live(LINE)
    m2, f2 = live(LINE)
    f1.write(growth)
    f2.write(growth)
    stat_first = feed(m1, f1, Look(), now=2.0)
    at_once = m2.handle(Look(full=True), f2.snapshot(m2, Look(full=True)), 2.0, 1e9 + 2.0)
    assert any(isinstance(e, Redeliver) for e in stat_first)
    assert not any(isinstance(e, Redeliver) for e in at_once)
    assert [e.payload for e in sent(at_once, Kind.LIVE)] == \
        [e.payload for e in sent(stat_first, Kind.LIVE)]
    assert any(isinstance(e, Sync) for e in at_once)
    # Nothing new: the full look finds nothing to ship either (the tail checked, unchanged).
    feed(m2, f2, Synced(), 2.0)
    again = m2.handle(Look(full=True), f2.snapshot(m2, Look(full=True)), 3.0, 1e9 + 3.0)
    assert not sent(again, Kind.LIVE) and not any(isinstance(e, Sync | Rehash) for e in again)


def test_a_peers_bytes_extending_ours_are_appended() -> None:
    m, f = live(LINE)
    out = feed(m, f, PeerData("b", Data(len(LINE), digest_of(LINE), b'{"id": "2"}\n')))
    assert any(isinstance(e, Append) for e in out)
    assert bytes(f.data) == LINE + b'{"id": "2"}\n'


def test_never_appended_onto_an_unfinished_local_line() -> None:
    """#10 case 1: B's writer has `{"id": "` past our end when A's line arrives."""
    m, f = live(LINE)
    f.write(b'{"id": "')
    feed(m, f, Look())  # nothing whole to ship
    out = feed(m, f, PeerData("b", Data(len(LINE), digest_of(LINE), b'{"id": "3"}\n')))
    assert not any(isinstance(e, Append) for e in out)
    assert bytes(f.data) == LINE + b'{"id": "'
    # A fork with b isolates b only: the file stays live, and b's bytes are not taken.
    assert "b" in m.diverged and m.mode is Mode.LIVE and m.state_word() == "diverged"
    assert not m.may_accept("b", 1.0)
    refusals = sent(out, Kind.REFUSE)
    assert refusals and isinstance(refusals[0].payload, Refuse)  # the peer learns of the fork


def test_an_edit_just_below_an_end_on_a_block_boundary_is_noticed_before_shipping() -> None:
    """#10 case 2: the re-check covers the last full block when the partial one is empty."""
    data = (b"x" * 63 + b"\n") * (BLOCK // 64)
    m, f = live(data)
    f.data[-10] = ord("E")  # in place, then an append: one look sees both
    f.write(b'{"id": "new"}\n')
    out = feed(m, f, Look())
    assert not sent(out, Kind.LIVE)
    assert any(isinstance(e, Rehash) and e.purpose == "check" for e in out)


def test_a_peers_bytes_never_go_into_another_file_than_the_one_we_describe() -> None:
    """#10 case 3: a file renamed over our copy (same size, other inode)."""
    m, f = live(LINE)
    f.inode = 2
    f.data = bytearray(b'{"id": "X"}\n')
    out = feed(m, f, PeerData("b", Data(len(LINE), digest_of(LINE), b'{"id": "2"}\n')))
    assert not any(isinstance(e, Append) for e in out)
    assert m.freeze is not None and m.freeze.reason == "reset"


def test_a_failed_look_is_shown_and_retried_until_it_works() -> None:
    """#10 case 4: EMFILE on a look is an error in status, retried with backoff."""
    m, f = live(LINE)
    feed(m, f, PeerPos("b", Announce(len(LINE), digest_of(LINE))))
    assert m.state_word() == "in_sync"
    f.write(b'{"id": "2"}\n')
    feed(m, None, IoFailed(Look(), "Too many open files"), now=2.0)
    assert m.state_word() == "error" and "Too many open files" in str(m.status()["error"])
    assert m.failing is not None
    due = m.failing.retry_at
    assert due > 2.0
    out = feed(m, None, Tick(), now=due)
    assert any(isinstance(e, LookAgain) for e in out)
    out = feed(m, f, Look(), now=due)
    assert sent(out, Kind.LIVE) and m.failing is None


def test_serving_checks_the_bytes_against_the_ledger_first() -> None:
    m, f = live(LINE * 3)
    f.data[3] = ord("E")  # edited in place since we recorded it (same size, new mtime)
    f.mtime += 1
    out = feed(m, f, PeerRequest("b", Request(0, Position.empty().digest, 0, 1 << 20)))
    assert not sent(out, Kind.FILL)
    assert any(isinstance(e, Rehash) for e in out)


def test_answers_to_a_fetch_go_in_frames_of_fill_bytes_live_bytes_in_chunk_bytes() -> None:
    m = FileMachine("a", "k", "events.jsonl", "symmetric",
                    Tuning(chunk_bytes=4096, fill_bytes=16384), online={"b": True})
    f = File(b"")
    feed(m, f, Loaded(None, []))
    feed(m, f, Look())
    record = b'{"id": "%05d", "pad": "' + b"x" * 80 + b'"}\n'
    data = b"".join(record % i for i in range(600))  # ~60 KiB
    f.write(data)
    live_frames = [e.payload.data for e in sent(feed(m, f, Look(), now=2.0), Kind.LIVE)]
    assert b"".join(live_frames) == data and max(map(len, live_frames)) <= 4096
    out = feed(m, f, PeerRequest("b", Request(0, Position.empty().digest, 0, 1 << 20)), 3.0)
    fills = [e.payload for e in sent(out, Kind.FILL)]
    assert b"".join(d.data for d in fills) == data
    assert 4096 < max(len(d.data) for d in fills) <= 16384 and len(fills) == 4
    for d in fills:
        assert d.data.endswith(b"\n") and d.base == digest_of(data[: d.offset])
    # Never fewer bytes a frame than chunk_bytes.
    assert Tuning(chunk_bytes=4096).fill == Tuning(chunk_bytes=4096, fill_bytes=100).fill == 4096


# --- a divergence isolates one peer (#13) ----------------------------------------------------

BOGUS = Announce(5, bytes(32))  # a listed host claims a copy whose prefix is not ours


def diverged_from_c() -> tuple[FileMachine, File]:
    """a holds 2 lines, in sync with b; c announces a copy that differs inside our prefix."""
    m, f = live(LINE + b'{"id": "2"}\n', peers=("b", "c"))
    feed(m, f, PeerPos("b", Announce(len(f.data), digest_of(bytes(f.data)))))
    out = feed(m, f, PeerPos("c", BOGUS))
    assert "c" in m.diverged and m.diverged["c"].offset == 5
    # Our announcement says we know, and says no freeze: the file is live for the others.
    [pos] = sent(out, Kind.POS)
    assert pos.payload == Announce(len(f.data), digest_of(bytes(f.data)), None, 0, ("c",))
    return m, f


def test_a_divergence_with_one_peer_leaves_the_file_live_with_the_others() -> None:
    m, f = diverged_from_c()
    assert m.mode is Mode.LIVE and m.frozen is None and m.state_word() == "diverged"
    assert m.status()["peers"]["b"]["state"] == "in_sync"
    assert m.status()["peers"]["c"]["state"] == "diverged"
    # Local growth is shipped...
    f.write(b'{"id": "3"}\n')
    out = feed(m, f, Look(), now=2.0)
    assert [e.payload.data for e in sent(out, Kind.LIVE)] == [b'{"id": "3"}\n']
    # ...b's bytes that extend ours are appended...
    held = bytes(f.data)
    out = feed(m, f, PeerData("b", Data(len(held), digest_of(held), b'{"id": "4"}\n')), 3.0)
    assert any(isinstance(e, Append) for e in out) and m.held == len(held) + 12
    # ...and c's are not, even bytes that would extend our copy.
    held = bytes(f.data)
    out = feed(m, f, PeerData("c", Data(len(held), digest_of(held), b'{"id": "X"}\n')), 4.0)
    assert not any(isinstance(e, Append) for e in out) and bytes(f.data) == held


def test_nothing_is_fetched_from_or_served_to_a_diverged_peer() -> None:
    m, f = diverged_from_c()
    held = bytes(f.data)
    # c claims more than anyone: we still do not ask it.
    out = feed(m, f, PeerPos("c", Announce(10_000, bytes(32))), 2.0)
    assert not [e for e in sent(out, Kind.REQ) if e.to == "c" and e.payload.length]
    assert m.fetch is None
    # A request from c after a prefix that is ours gets no bytes...
    out = feed(m, f, PeerRequest("c", Request(12, digest_of(held[:12]), 12, 1 << 20)), 3.0)
    assert not sent(out, Kind.FILL)
    # ...one after another prefix is refused, as before...
    out = feed(m, f, PeerRequest("c", Request(12, bytes(32), 12, 1 << 20)), 4.0)
    assert sent(out, Kind.REFUSE) and not sent(out, Kind.FILL)
    # ...and an operator on c adopting our copy (forced, from nothing) is served.
    out = feed(m, f, PeerRequest("c", Request(0, Position.empty().digest, 0, 1 << 20,
                                              force=True, ask=7)), 5.0)
    assert b"".join(e.payload.data for e in sent(out, Kind.FILL)) == held
    assert [e.payload.answers for e in sent(out, Kind.POS)] == [7]


def test_a_refusal_is_said_again_until_the_peer_names_us() -> None:
    m, f = diverged_from_c()
    feed(m, f, PeerOnline("c", True), 1.0)
    out = feed(m, f, Tick(), 1.0 + LOCATE_RETRY)
    assert [e.to for e in sent(out, Kind.REFUSE)] == ["c"]
    # c announces that it knows (it names us); it is not frozen for it.
    feed(m, f, PeerPos("c", Announce(5, bytes(32), None, 0, ("a",))), 7.0)
    out = feed(m, f, Tick(), 7.0 + 2 * LOCATE_RETRY)
    assert not sent(out, Kind.REFUSE)
    assert "c" in m.diverged


def test_a_divergence_clears_when_the_peer_holds_our_bytes_where_we_parted() -> None:
    m, f = diverged_from_c()
    held = bytes(f.data)
    # An old position of c, consistent but short of the fork at byte 5: proves nothing.
    feed(m, f, PeerPos("c", Announce(3, digest_of(held[:3]))), 2.0)
    assert "c" in m.diverged and m.state_word() == "diverged"
    # While c adopts our copy it is judged on the copy it ends with.
    feed(m, f, PeerPos("c", Announce(len(held), digest_of(held), "adopting")), 3.0)
    assert "c" in m.diverged
    out = feed(m, f, PeerPos("c", Announce(len(held), digest_of(held))), 4.0)
    assert m.diverged == {} and m.state_word() == "in_sync"
    assert [e.payload.diverged for e in sent(out, Kind.POS)] == [()]


# --- intents: a peer's pieces of a long line across a kill -----------------------------------

class Killed(Exception):
    """kill -9 of the process: the effects not carried out yet never happen."""


class Disk:
    """What `state_dir` holds: the last record and chain a Persist wrote (kill -9 keeps it)."""

    def __init__(self) -> None:
        self.record: FileRecord | None = None
        self.chain: list[bytes] = []
        self.noted: Appending | None = None  # the `.appending` note


def shell(m: FileMachine, f: File, event: Event, disk: Disk,
          die_before: type | None = None, die_at: int | None = None) -> list[object]:
    """Like `feed`, with the shell's Rehash (never below `hold`) and Persist, and a process
    that dies just before the first effect of type `die_before`, or in the write() of an
    append that crosses file offset `die_at` (the kernel stops there: a page boundary)."""
    snap = f.snapshot(m, event)
    effects: list[object] = list(m.handle(event, snap, 1.0, 1e9 + 1.0))
    out = list(effects)
    for e in effects:
        if die_before is not None and isinstance(e, die_before):
            raise Killed
        if isinstance(e, Persist):
            disk.record = e.record
            disk.chain = list(e.chain) if e.chain is not None else disk.chain
        elif isinstance(e, NoteAppending):
            disk.noted = e.appending
        elif isinstance(e, Append):
            if die_at is not None and e.offset < die_at < e.offset + len(e.data):
                f.write(e.data[: die_at - e.offset])
                raise Killed
            f.write(e.data)
            st = Stat(1, f.inode, len(f.data), f.mtime, f.mtime)
            out += shell(m, f, Appended(e.peer, e.data, st), disk, die_before, die_at)
        elif isinstance(e, Sync):
            out += shell(m, f, Synced(), disk, die_before, die_at)
        elif isinstance(e, Redeliver):
            out += shell(m, f, e.event, disk, die_before, die_at)
        elif isinstance(e, Rehash):
            end = max(f.data.rfind(b"\n") + 1, min(e.hold, len(f.data)))
            ledger = Ledger()
            ledger.extend(bytes(f.data[:end]))
            out += shell(m, f, Rehashed(e.purpose, ledger, e.why), disk, die_before, die_at)
    return out


def restart(f: File, disk: Disk) -> FileMachine:
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(), online={"b": True})
    assert disk.record is not None
    shell(m, f, Loaded(dataclasses.replace(disk.record, appending=disk.noted),
                       list(disk.chain)), disk)
    return m


LONG = b'{"id": "2", "p": "' + b"x" * 300 + b'"}\n'  # longer than a piece: it travels in three


def piece(at: int, f: File | bytes, data: bytes) -> PeerData:
    held = bytes(f.data if isinstance(f, File) else f)[:at]
    return PeerData("b", Data(at, digest_of(held), data))


def test_a_peers_piece_survives_a_kill_between_the_next_pieces_intent_and_its_append() -> None:
    """Chaos: b killed while pieces of a's long line arrived back to back (no sync between
    them); at start its last piece was taken for a local torn line, a false divergence."""
    m, f = live(LINE)
    disk = Disk()
    s, p1, p2, p3 = len(LINE), LONG[:100], LONG[100:200], LONG[200:]
    shell(m, f, piece(s, f, p1), disk)
    with pytest.raises(Killed):  # the next frame of the burst: dies before its append
        shell(m, f, piece(s + 100, f, p2), disk, die_before=Append)
    assert bytes(f.data) == LINE + p1
    m = restart(f, disk)
    assert m.mode is Mode.LIVE and m.held == s + 100  # b's piece, not a local torn line
    shell(m, f, piece(s + 100, f, p2), disk)
    shell(m, f, piece(s + 200, f, p3), disk)
    assert bytes(f.data) == LINE + LONG and not m.diverged and m.held == len(f.data)


def test_a_peers_piece_after_its_unsynced_whole_lines_survives_a_kill() -> None:
    """A whole line, then a piece of a long line, appended back to back and killed before
    any sync: the intent must be about bytes past the size recorded with it."""
    m, f = live(LINE)
    disk = Disk()
    s, p1, p2 = len(LINE), LONG[:100], LONG[100:]
    shell(m, f, piece(s, f, LINE), disk)
    shell(m, f, piece(2 * s, f, p1), disk)  # appended; killed before anything else
    assert bytes(f.data) == LINE + LINE + p1
    m = restart(f, disk)
    assert m.mode is Mode.LIVE and m.held == 2 * s + 100
    shell(m, f, piece(2 * s + 100, f, p2), disk)
    assert bytes(f.data) == 2 * LINE + LONG and not m.diverged


# Whole lines, ~19 KB: their append crosses page boundaries, and one falls mid-line.
LINES = b"".join(b'{"id": "%d", "p": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(300))


@pytest.mark.parametrize("whole", [True, False], ids=["whole-lines", "piece-of-a-line"])
def test_an_append_cut_short_by_a_kill_is_the_peers_bytes_not_a_torn_line(whole: bool) -> None:
    """Chaos (CI): c killed in the write() of a catch-up piece; the kernel stopped it on a
    page boundary, mid-line. At start the line's beginning past c's end was taken for a local
    writer's torn line, and c froze as diverged from every peer (a false divergence). The
    record says which range was being appended; bytes there that are exactly the peer's
    bytes for that offset are kept, and the rest of the piece is appended."""
    m, f = live(LINE)
    disk = Disk()
    disk.record, disk.chain = m._record_now(), list(m.ledger.chain if m.ledger else [])
    theirs = LINE + (LINES if whole else LINES[:-5])
    s = len(LINE)
    assert theirs[: 3 * PAGE].endswith(b"\n") is False
    with pytest.raises(Killed):
        shell(m, f, piece(s, theirs, theirs[s:]), disk, die_at=3 * PAGE)
    assert len(f.data) == 3 * PAGE
    m = restart(f, disk)
    assert m.mode is Mode.LIVE and m.held < 3 * PAGE  # whole lines: the rest is past the end
    out = shell(m, f, piece(m.held, theirs, theirs[m.held:]), disk)
    assert not m.diverged and bytes(f.data) == theirs and m.held == len(theirs)
    assert any(isinstance(e, Log) and "cut short" in e.message for e in out)


def test_a_restart_that_finds_the_file_as_recorded_writes_no_record_again() -> None:
    """1000 idle keys at a restart: each record loaded was written again, identical, by the
    records thread, and the loads waited on its lock. Only a record that says something new
    is written."""
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(), online={"b": True})
    f = File(LINE * 3)
    disk = Disk()
    shell(m, f, Loaded(None, []), disk)
    stopped = m.record_at_shutdown()
    assert stopped is not None and stopped.chain is not None
    disk.record, disk.chain = stopped.record, list(stopped.chain)
    m = restart(f, disk)
    assert m.mode is Mode.LIVE and m.held == len(LINE * 3)
    assert not [e for e in shell(m, f, Drained(), disk) if isinstance(e, Persist)]
    f.write(LINE)  # the file grows: the next record says so
    out = shell(m, f, Look(), disk) + shell(m, f, Drained(), disk, ) + shell(
        m, f, Tick(), disk)
    assert m.held == len(LINE * 4)
    assert [e.record.size for e in out if isinstance(e, Persist)] == [len(LINE * 4)]


def test_a_stop_writes_only_a_record_the_disk_does_not_hold_durably() -> None:
    """A stop fsynced every file's record, 1000 of them with 1000 idle keys (1.7 s on a
    quiet disk). Unchanged since the load or since the last durable save: nothing to write;
    after a routine (unsynced) save, or a durable one that failed, the stop writes it."""
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(), online={"b": True})
    f = File(LINE * 3)
    disk = Disk()
    shell(m, f, Loaded(None, []), disk)
    first = m.record_at_shutdown()
    assert first is not None and first.durable
    assert m.record_at_shutdown() is None  # written durably just now
    disk.record, disk.chain = first.record, list(first.chain or [])
    m = restart(f, disk)
    assert m.record_at_shutdown() is None  # as loaded
    f.write(LINE)
    out = shell(m, f, Look(), disk) + shell(m, f, Drained(), disk) + shell(m, f, Tick(), disk)
    assert [e.durable for e in out if isinstance(e, Persist)] == [False]
    stopped = m.record_at_shutdown()
    assert stopped is not None and stopped.durable and stopped.record.size == len(LINE * 4)
    m.record_not_kept()  # the shell's save failed
    again = m.record_at_shutdown()
    assert again is not None and again.record == stopped.record
    assert m.record_at_shutdown() is None


def test_a_first_catch_up_cut_short_before_any_record_keeps_the_peers_bytes() -> None:
    """A new standby killed inside its first appends, before it ever recorded a position:
    the note alone says which range was being appended."""
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(), online={"b": True})
    f = File()
    feed(m, f, Loaded(None, []))
    disk = Disk()
    with pytest.raises(Killed):
        shell(m, f, piece(0, LINES, LINES), disk, die_at=2 * PAGE)
    assert disk.record is None and disk.noted is not None
    assert disk.noted[:4] == ("b", 0, 0, len(LINES))
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(), online={"b": True})
    out = shell(m, f, Loaded(None, [], appending=disk.noted), disk)
    assert any(isinstance(e, NoteAppending) and e.durable for e in out)
    shell(m, f, piece(m.held, LINES, LINES[m.held:]), disk)
    assert not m.diverged and bytes(f.data) == LINES and m.held == len(LINES)


def test_a_local_torn_line_that_reads_like_the_peers_bytes_is_still_refused() -> None:
    """Bytes past our end on a page boundary that equal the peer's, but outside any append of
    ours: a local writer's (split brain). Never taken for ours."""
    m, f = live(LINE)
    disk = Disk()
    theirs = LINE + LINES
    f.write(theirs[len(LINE): 3 * PAGE])  # the local bot, cut short: its line the peer's too
    m = restart_from(m, f, disk)
    out = shell(m, f, piece(m.held, theirs, theirs[m.held:]), disk)
    assert m.diverged and bytes(f.data) == theirs[: 3 * PAGE]
    assert not any(isinstance(e, Append) for e in out)


def test_the_note_of_a_piece_across_a_page_carries_its_digest_and_is_not_synced() -> None:
    """Issue #23 case 9: the note says which bytes were to be written, before the append. Not
    synced (per frame, a sync doubled the lag): a power loss that keeps some pages of the
    append and drops the note freezes the copy as diverged (refused, never spliced)."""
    m, f = live(LINE)
    theirs = LINE + LINES
    out = feed(m, f, piece(len(LINE), theirs, theirs[len(LINE):]))
    notes = [e for e in out if isinstance(e, NoteAppending)]
    assert len(notes) == 1 and not notes[0].durable
    assert notes[0].appending == ("b", len(LINE), len(LINE), len(theirs),
                                  hashlib.sha256(LINES).hexdigest())
    kinds = [type(e) for e in out]
    assert kinds.index(NoteAppending) < kinds.index(Append)


def test_a_local_line_where_an_append_of_ours_never_started_is_refused_not_spliced() -> None:
    """Simulator seed 7027257: killed after noting a piece and before appending it; the local
    writer (split brain) then starts its own line there, and its first bytes (`{"i`, as every
    line's) reach the next page boundary and equal the peer's. Fewer than a page of the
    piece's bytes cannot tell ours from a writer's: refused as a divergence, never spliced
    (on the old rule they were taken for ours, and the writer's line was cut in two)."""
    head = b'{"id": "0", "p": "'
    base = head + b"x" * (PAGE - 3 - len(head) - 3) + b'"}\n'
    assert len(base) == PAGE - 3
    m, f = live(base)
    disk = Disk()
    disk.record, disk.chain = m._record_now(), list(m.ledger.chain if m.ledger else [])
    theirs = base + LINES
    with pytest.raises(Killed):
        shell(m, f, piece(len(base), theirs, theirs[len(base):]), disk, die_before=Append)
    assert disk.noted is not None and bytes(f.data) == base
    f.write(b'{"i')  # the local writer's line, as far as the page boundary
    m = restart(f, disk)
    assert m.held == len(base)
    out = shell(m, f, piece(len(base), theirs, theirs[len(base):]), disk)
    assert m.diverged and bytes(f.data) == base + b'{"i'
    assert not any(isinstance(e, Append) for e in out)
    assert any(isinstance(e, Log) and "too short to tell" in e.message for e in out)


def restart_from(m: FileMachine, f: File, disk: Disk) -> FileMachine:
    """Record `m` as it is (a graceful stop), then start again on the file as it is now."""
    disk.record, disk.chain = m._record_now(), list(m.ledger.chain if m.ledger else [])
    return restart(f, disk)


def test_a_piece_waits_for_a_durable_base_and_is_dropped_while_syncs_fail() -> None:
    m, f = live(LINE)
    disk = Disk()
    shell(m, f, piece(len(LINE), f, LINE), disk)  # a whole line, not synced yet
    event = piece(2 * len(LINE), f, LONG[:100])
    out = m.handle(event, f.snapshot(m, event), 1.0, 1e9)
    assert [type(e) for e in out] == [Sync, Redeliver]  # no intent on an unrecorded base
    m.handle(SyncFailed("Input/output error"), Snapshot(), 1.0, 1e9)
    out = m.handle(event, f.snapshot(m, event), 1.0, 1e9)
    assert [type(e) for e in out] == [Sync]  # tried again, the piece dropped: no loop
    assert m.intent is None and bytes(f.data) == 2 * LINE


def test_transitions_outside_the_table_are_refused() -> None:
    m, _ = live()
    with pytest.raises(AssertionError, match="no transition live -> loading"):
        m._enter(Mode.LOADING)


def test_every_expected_error_has_one_root() -> None:
    from syncd.config import ConfigError
    from syncd.core.errors import ConcurrentWrite, FileReplaced, FileShrank, SyncdError
    from syncd.core.frames import FrameError
    from syncd.core.identity import IdentityError
    from syncd.daemon.host import StartupError
    from syncd.ops.brokercheck import BrokerProblem
    from syncd.ops.control import ControlError

    for error in (BrokerProblem, ConfigError, ControlError, ConcurrentWrite, FileReplaced,
                  FileShrank, FrameError, StartupError, IdentityError):
        assert issubclass(error, SyncdError), error


def test_a_probe_is_answered_as_a_request_would_be_never_by_a_frozen_copy() -> None:
    """#23 case 3: probes obey may_serve (a reset copy has nothing to compare), and a live
    copy answers with at most one block or one frame of chain values."""
    data = (b"x" * 63 + b"\n") * (3 * BLOCK // 64)
    m, f = live(data)
    out = feed(m, f, PeerProbe("b", Probe(ProbeWhat.BYTES, BLOCK, 10 * BLOCK)))
    answer = sent(out, Kind.PROBED)[0].payload
    assert isinstance(answer, Probed) and len(answer.data) == BLOCK
    out = feed(m, f, PeerProbe("b", Probe(ProbeWhat.SUMS, 0, 1 << 40)))
    answer = sent(out, Kind.PROBED)[0].payload
    assert isinstance(answer, Probed) and len(answer.data) == 3 * 32
    m.role = "replica"
    f.write(LINE)  # a local write on a replica freezes the copy (its ledger is kept)
    feed(m, f, Look())
    assert m.mode is Mode.FROZEN and m.ledger is not None
    out = feed(m, f, PeerProbe("b", Probe(ProbeWhat.BYTES, 0, BLOCK)))
    assert not sent(out, Kind.PROBED)
    assert not sent(feed(m, f, PeerProbe("b", Probe(ProbeWhat.SUMS, 0, 3))), Kind.PROBED)


def test_only_the_answer_to_our_own_probe_is_read() -> None:
    """#23 case 3: an answer to a probe nobody sent would make us read (and count lines up
    to) any offset a peer likes: it is ignored without a read."""
    data = (b"x" * 63 + b"\n") * (2 * BLOCK // 64)
    m, f = live(data)
    out = feed(m, f, PeerRefuse("b", Refuse(BLOCK, bytes(32))))  # b's copy differs
    assert isinstance(sent(out, Kind.PROBE)[0].payload, Probe)
    unasked = PeerProbed("b", Probed(ProbeWhat.BYTES, 10**9, 2 * BLOCK, b"y" * 100))
    assert m.reads_for(unasked).empty
    assert not any(isinstance(e, FindLine) for e in feed(m, f, unasked))
    assert m.ledger is not None
    theirs = m.ledger.chain[1] + bytes(32)  # block 0 agrees, block 1 does not
    out = feed(m, f, PeerProbed("b", Probed(ProbeWhat.SUMS, 0, 2 * BLOCK, theirs)))
    asked = sent(out, Kind.PROBE)[0].payload
    assert isinstance(asked, Probe) and (asked.what, asked.start) == (ProbeWhat.BYTES, BLOCK)
    other = bytearray(data[BLOCK:2 * BLOCK])
    other[5] = ord("y")
    out = feed(m, f, PeerProbed("b", Probed(ProbeWhat.BYTES, BLOCK, 2 * BLOCK, bytes(other))))
    assert [e for e in out if isinstance(e, FindLine)] == [FindLine("b", BLOCK + 5)]
    again = PeerProbed("b", Probed(ProbeWhat.BYTES, BLOCK, 2 * BLOCK, bytes(other)))
    assert not any(isinstance(e, FindLine) for e in feed(m, f, again))  # answered once
