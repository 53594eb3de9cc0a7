"""A sync of a peer's bytes under way while more are appended (Sync ahead, a catch-up's):
only what it covers is announced, one is under way at a time, and a plain sync covers it."""

from __future__ import annotations

import dataclasses

from syncd.core.events import (
    Append,
    Appended,
    Drained,
    Durable,
    Event,
    PeerData,
    Redeliver,
    Sync,
    Synced,
    SyncedAhead,
)
from syncd.core.filemachine import FileMachine
from syncd.core.frames import Data
from syncd.core.ledger import Position, digest_of
from syncd.core.records import Stat
from tests.support.memfile import File, live

LINE, ONE, TWO = b'{"id": "1"}\n', b'{"id": "2"}\n', b'{"id": "3"}\n'


def run(m: FileMachine, f: File, event: Event) -> list[object]:
    """As memfile.feed, but a Sync is left unanswered: the test answers it."""
    out: list[object] = list(m.handle(event, f.snapshot(m, event), 1.0, 1e9))
    for e in list(out):
        if isinstance(e, Append):
            f.write(e.data)
            out += run(m, f, Appended(e.peer, e.data, Stat(1, f.inode, len(f.data), f.mtime,
                                                           f.mtime)))
        elif isinstance(e, Redeliver):
            out += run(m, f, e.event)
    return out


def peer_bytes(m: FileMachine, f: File, data: bytes) -> list[object]:
    """The peer's next bytes arrive, then the shell's queue runs dry."""
    here = bytes(f.data)
    return run(m, f, PeerData("b", Data(len(here), digest_of(here), data))) + run(m, f, Drained())


def syncs(out: list[object]) -> list[Sync]:
    return [e for e in out if isinstance(e, Sync)]


def catching_up() -> tuple[FileMachine, File]:
    m, f = live(LINE)
    m.tuning = dataclasses.replace(m.tuning, ahead_sync_bytes=0)
    return m, f


def test_only_what_a_sync_ahead_covers_is_durable_and_announced() -> None:
    m, f = catching_up()
    assert syncs(peer_bytes(m, f, ONE)) == [Sync(local=False, ahead=1)]
    # More bytes while it runs: appended, and no second sync while the first is under way.
    assert syncs(peer_bytes(m, f, TWO)) == []
    assert bytes(f.data) == LINE + ONE + TWO and m.position.size == len(LINE)
    out = run(m, f, SyncedAhead(1))
    assert m.position == Position(len(LINE + ONE), digest_of(LINE + ONE))
    assert [e.size for e in out if isinstance(e, Durable)] == [len(LINE + ONE)]
    assert m.unsynced == len(TWO)
    # What it did not cover is synced next.
    assert syncs(run(m, f, Drained())) == [Sync(local=False, ahead=2)]


def test_a_plain_sync_covers_the_one_ahead_whose_late_answer_changes_nothing() -> None:
    m, f = catching_up()
    peer_bytes(m, f, ONE)
    peer_bytes(m, f, TWO)
    run(m, f, Synced())
    assert m.position.size == len(LINE + ONE + TWO) and m.unsynced == 0
    out = run(m, f, SyncedAhead(1))
    assert m.position.size == len(LINE + ONE + TWO) and not any(
        isinstance(e, Durable) for e in out)


def test_a_failed_sync_ahead_is_an_error_and_is_tried_again() -> None:
    m, f = catching_up()
    peer_bytes(m, f, ONE)
    run(m, f, SyncedAhead(1, "Input/output error"))
    assert m.position.size == len(LINE) and m.failing is not None
    assert "cannot make" in m.failing.detail
    assert syncs(run(m, f, Drained())) == [Sync(local=False, ahead=2)]
    run(m, f, SyncedAhead(2))
    assert m.position.size == len(LINE + ONE) and m.failing is None


def test_a_live_frames_few_bytes_are_synced_before_the_next_event() -> None:
    m, f = live(LINE)  # the default: more than 64 KiB unsynced before a sync goes ahead
    assert syncs(peer_bytes(m, f, ONE)) == [Sync(local=False)]
