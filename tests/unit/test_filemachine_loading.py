"""Start-up verdicts (syncd/core/filemachine/loading.py), driven directly: a record and the
file found at start-up in, a verdict out."""

from __future__ import annotations

import hashlib

from syncd.core.events import Snapshot
from syncd.core.filemachine import loading
from syncd.core.ledger import Ledger
from syncd.core.records import FileRecord, Freeze
from tests.support.memfile import MemFile

LINES = b'{"id": 1}\n{"id": 2}\n'


def ledger_of(data: bytes) -> Ledger:
    ledger = Ledger()
    ledger.extend(data)
    return ledger


def record_of(f: MemFile, size: int, **kw: object) -> FileRecord:
    """The record syncd would have written for the first `size` bytes of `f` as it is."""
    ledger = ledger_of(bytes(f.data[:size]))
    fields: dict[str, object] = dict(
        size=size, digest=ledger.digest(), file_size=len(f.data), dev=1, ino=f.inode,
        mtime_ns=f.mtime, ctime_ns=f.mtime, partial=ledger.partial_digest())
    fields.update(kw)
    return FileRecord(**fields)  # type: ignore[arg-type]


def judge(rec: FileRecord, f: MemFile | None, appending: bool = False) -> loading.LoadVerdict:
    chain = ledger_of(bytes(f.data[: rec.size]) if f else b"").chain
    snap = f.read(loading.record_plan(rec)) if f else Snapshot()
    return loading.judge_record(rec, chain, snap, "lines", appending)


def test_an_unchanged_file_is_restored_from_its_record_without_a_rehash() -> None:
    f = MemFile(LINES)
    verdict = judge(record_of(f, len(LINES)), f)
    assert isinstance(verdict, loading.Restore)
    assert verdict.ledger.size == len(LINES)
    assert verdict.ledger.digest() == ledger_of(LINES).digest()


def test_a_file_deleted_while_stopped_is_a_reset_unless_nothing_was_held() -> None:
    f = MemFile(LINES)
    verdict = judge(record_of(f, len(LINES)), None)
    assert isinstance(verdict, loading.Reset) and verdict.detail is not None
    assert "deleted" in verdict.detail and str(len(LINES)) in verdict.detail
    assert isinstance(judge(record_of(MemFile(), 0), None), loading.Empty)


def test_a_new_inode_or_a_shorter_file_is_a_reset() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES))
    replaced = judge(rec, MemFile(LINES, inode=9))
    assert isinstance(replaced, loading.Reset) and "new inode" in (replaced.detail or "")
    f.truncate(5)
    shrank = judge(rec, f)
    assert isinstance(shrank, loading.Reset) and "shrank" in (shrank.detail or "")


def test_a_record_frozen_as_reset_stays_reset_whatever_the_file_holds() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES), freeze=Freeze("reset", "file deleted", 1.0))
    assert judge(rec, f) == loading.Reset(None)


def test_a_file_that_grew_is_rehashed_holding_what_was_recorded() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES))
    f.write(b'{"id": 3}\n')
    assert judge(rec, f) == loading.RehashFile(len(LINES))
    # A note of an append of ours past our end must now outlive a power loss.
    assert judge(rec, f, appending=True) == loading.RehashFile(len(LINES), note_appending=True)


def test_a_peers_piece_past_the_record_is_held_only_with_its_digest_to_check() -> None:
    f = MemFile(LINES)
    piece = b'{"id": 3, "long'
    end = len(LINES) + len(piece)
    intent = ("b", len(LINES), end, ledger_of(LINES + piece).digest().hex())
    rec = record_of(f, len(LINES), intent=intent)
    f.write(piece)
    verdict = judge(rec, f)
    assert isinstance(verdict, loading.RehashFile) and verdict.hold == end
    assert verdict.intent_check == (end, bytes.fromhex(intent[3]))
    plan = loading.rehash_plan(rec, verdict.intent_check)
    assert len(plan.ranges) == 2 and plan.stat


def rehash(rec: FileRecord | None, f: MemFile | None,
           check: tuple[int, bytes] | None = None) -> loading.RehashVerdict:
    fresh = ledger_of(bytes(f.data)) if f is not None else None
    snap = f.read(loading.rehash_plan(rec, check)) if f is not None and rec else Snapshot()
    chain = ledger_of(bytes(f.data[: rec.size])).chain if f is not None and rec else []
    return loading.judge_rehash(rec, chain, fresh, snap, check)


def test_a_rehash_that_holds_the_recorded_history_starts_from_it() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES))
    f.write(b'{"id": 3}\n')
    assert rehash(rec, f) == loading.Hashed(None)
    assert rehash(None, f) == loading.Hashed(None)  # nothing recorded: nothing to compare


def test_a_rehash_that_shows_an_edit_says_where() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES))
    f.data[2:4] = b"XX"
    verdict = rehash(rec, f)
    assert isinstance(verdict, loading.Hashed) and verdict.edited_at == 0


def test_bytes_past_the_record_that_are_not_the_intended_piece_are_local() -> None:
    f = MemFile(LINES)
    rec = record_of(f, len(LINES))
    f.write(b'{"id": "a local writer')
    wrong = hashlib.sha256(b"another history").digest()
    assert rehash(rec, f, (len(f.data), wrong)) == loading.NotTheIntent()


def test_a_file_that_vanished_during_the_rehash() -> None:
    f = MemFile(LINES)
    assert rehash(record_of(f, len(LINES)), None) == loading.Reset(
        "file deleted while syncd was starting")
    assert rehash(None, None) == loading.Empty()


def test_a_check_rehash_vouches_only_for_the_bytes_it_still_holds() -> None:
    f = MemFile(LINES)
    ours = ledger_of(LINES)
    snap = f.read(loading.check_plan(ours))
    assert loading.still_vouched(ours, ledger_of(LINES + b"more\n"), snap)
    assert not loading.still_vouched(ours, ledger_of(LINES[:5]), snap)
    f.data[-3] = ord("9")
    edited = f.read(loading.check_plan(ours))
    assert not loading.still_vouched(ours, ledger_of(bytes(f.data)), edited)
