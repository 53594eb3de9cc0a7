"""The per-file machine on a log of Zstandard frames, and the writer's rollback rule (hold
back: FileMachine.hold_back): scripted events in, effects out, as in test_filemachine.py."""

from __future__ import annotations

import os

from syncd.core import recordkinds
from syncd.core.events import (
    Append,
    Appended,
    Event,
    Loaded,
    Look,
    LookAgain,
    PeerData,
    Persist,
    Redeliver,
    Rehash,
    Rehashed,
    Send,
    Sync,
    Synced,
    Tick,
)
from syncd.core.filemachine import FileMachine, Mode, Tuning
from syncd.core.frames import Data, Kind
from syncd.core.ledger import Ledger, digest_of
from syncd.core.records import Stat
from tests.support import zstd
from tests.support.memfile import MemFile

FRAMES = recordkinds.ZSTD_FRAMES


File = MemFile


def feed(m: FileMachine, f: File, event: Event, now: float = 1.0) -> list[object]:
    effects: list[object] = list(m.handle(event, f.snapshot(m, event), now, 1e9 + now))
    out = list(effects)
    for e in effects:
        if isinstance(e, Append):
            f.write(e.data)
            out += feed(m, f, Appended(e.peer, e.data, Stat(1, 1, len(f.data), f.mtime,
                                                               f.mtime)), now)
        elif isinstance(e, Sync):
            out += feed(m, f, Synced(), now)
        elif isinstance(e, Rehash):
            ledger = Ledger(f.kind)
            end = recordkinds.last_end(f.kind, bytes(f.data)) if e.whole_lines else len(f.data)
            ledger.extend(bytes(f.data[: max(end, min(e.hold, len(f.data)))]))
            out += feed(m, f, Rehashed(e.purpose, ledger, e.why), now)
        elif isinstance(e, Redeliver):
            out += feed(m, f, e.event, now)
        elif isinstance(e, LookAgain):
            out += feed(m, f, Look(), now)
    return out


def live(kind: str, data: bytes = b"", settle: float = 0.0) -> tuple[FileMachine, File]:
    m = FileMachine("a", "k", "session.jsonl.zstd", "symmetric", Tuning(chunk_bytes=4096),
                online={"b": True}, records=kind, settle=settle)
    f = File(data, kind=kind)
    feed(m, f, Loaded(None, []))
    feed(m, f, Look())
    assert m.mode is Mode.LIVE
    return m, f


def shipped(out: list[object]) -> bytes:
    return b"".join(e.payload.data for e in out if isinstance(e, Send) and e.kind is Kind.LIVE
                    and isinstance(e.payload, Data))


def test_only_whole_frames_are_shipped_whatever_bytes_they_hold() -> None:
    one, two = b"", b""
    while b"\n" not in one + two:  # random frames hold a 0x0A byte 9 times in 10: make sure
        one, two = zstd.frame(os.urandom(300)), zstd.frame(os.urandom(300))
    m, f = live(FRAMES)
    f.write(one + two[:-3])
    assert shipped(feed(m, f, Look(), 2.0)) == one
    f.write(two[-3:])
    assert shipped(feed(m, f, Look(), 3.0)) == two
    assert m.held == len(one + two)


def test_a_frame_longer_than_a_chunk_travels_in_pieces_with_intents_for_the_pieces() -> None:
    big = zstd.frame(os.urandom(10_000))  # 4096-byte chunks: three pieces
    sender, sf = live(FRAMES)
    sf.write(big)
    pieces = [e.payload for e in feed(sender, sf, Look(), 2.0)
              if isinstance(e, Send) and e.kind is Kind.LIVE and isinstance(e.payload, Data)]
    assert len(pieces) == 3 and b"".join(p.data for p in pieces) == big
    receiver, rf = live(FRAMES)
    intents = 0
    for p in pieces:
        out = feed(receiver, rf, PeerData("b", p), 3.0)
        intents += sum(1 for e in out if isinstance(e, Persist) and e.durable)
    assert bytes(rf.data) == big and receiver.held == len(big)
    assert intents == 2  # the two pieces that end no frame; the last one ends it


def test_a_frame_longer_than_one_read_after_others_travels_whole() -> None:
    small, big = zstd.frame(b'{"seq":1}\n'), zstd.frame(os.urandom(30_000))
    m = FileMachine("a", "k", "session.jsonl.zstd", "symmetric",
                Tuning(chunk_bytes=4096, fetch_window=8192), online={"b": True}, records=FRAMES)
    f = File(small, kind=FRAMES)
    feed(m, f, Loaded(None, []))
    feed(m, f, Look())
    f.write(big)
    assert shipped(feed(m, f, Look(), 2.0)) == big
    assert m.held == len(small + big)


def test_a_rolled_back_batch_held_back_is_no_event() -> None:
    first = zstd.frame(b'{"seq":1}\n')
    m, f = live(FRAMES, first, settle=0.05)
    batch = zstd.frame(b'{"seq":2}\n' * 50)
    f.write(batch)
    assert shipped(feed(m, f, Look(), 2.0)) == b""  # held: the file changed just now
    assert m.deadline() is not None and m.deadline() <= 2.06
    f.truncate(len(first))  # the library's rollback: ENOSPC or EIO on its sync
    out = feed(m, f, Tick(), 2.06)
    assert shipped(out) == b"" and m.freeze is None and m.held == len(first)
    again = zstd.frame(b'{"seq":2,"retry":true}\n')
    f.write(again)
    assert shipped(feed(m, f, Look(), 3.0)) == b""
    out = feed(m, f, Tick(), 3.06)  # it held still: shipped
    assert shipped(out) == again and m.freeze is None


def test_without_hold_back_a_rollback_of_shipped_bytes_is_a_reset() -> None:
    m, f = live(recordkinds.LINES, b'{"seq":1}\n')
    f.write(b'{"seq":2}\n')
    assert shipped(feed(m, f, Look(), 2.0)) == b'{"seq":2}\n'
    f.truncate(10)
    feed(m, f, Look(), 2.1)
    feed(m, f, Look(), 2.5)  # a shrink must hold still before it is judged
    assert m.freeze is not None and m.freeze.reason == "reset"


def test_a_writer_that_never_holds_still_ships_after_twenty_holds() -> None:
    m, f = live(recordkinds.LINES, settle=0.05)
    first_shipped = None
    for i in range(150):  # a write every 10 ms for 1.5 s: never still for 50 ms
        now = 2.0 + i * 0.01
        f.write(b'{"n":%d}\n' % i)
        if shipped(feed(m, f, Look(), now)) and first_shipped is None:
            first_shipped = now
    assert first_shipped is not None and 2.99 <= first_shipped <= 3.01  # 20 x 50 ms
    assert m.held > 0 and digest_of(bytes(f.data[: m.held])) == m.ledger.digest()
