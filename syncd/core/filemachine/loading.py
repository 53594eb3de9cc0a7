"""Start-up verdicts: what the record kept of a file says about the file found at start-up,
and what a rehash of it then shows. Pure: the machine (`machine.py`) reads the bytes these
ask for, and acts on the verdict (start from a ledger, freeze as a reset, or rehash)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from syncd.core.events import ReadPlan, Snapshot
from syncd.core.ledger import BLOCK, Ledger, block_start
from syncd.core.reconcile import first_change
from syncd.core.records import FileRecord


@dataclass(frozen=True)
class Restore:
    """The file is as recorded: start from the ledger restored from the record."""

    ledger: Ledger


@dataclass(frozen=True)
class Reset:
    """The file is not the history recorded: frozen as a reset (`detail`: why, for a freeze
    to add; None when the record is frozen as a reset already)."""

    detail: str | None


@dataclass(frozen=True)
class Empty:
    """Nothing recorded and nothing to rehash: start from an empty ledger."""


@dataclass(frozen=True)
class RehashFile:
    """Changed while we were away: rehash it, holding `hold` bytes as ours; `intent_check`
    (end, digest): a peer's piece past the recorded end, ours only if the rehash shows it;
    `note_appending`: the `.appending` note must outlive a power loss now."""

    hold: int
    intent_check: tuple[int, bytes] | None = None
    note_appending: bool = False


LoadVerdict = Restore | Reset | Empty | RehashFile


def record_plan(rec: FileRecord) -> ReadPlan:
    """What judging a record reads: the last partial block it describes, and a stat."""
    return ReadPlan(((block_start(rec.size), rec.size),), stat=True)


def rehash_plan(rec: FileRecord, intent_check: tuple[int, bytes] | None) -> ReadPlan:
    """What judging a start-up rehash reads: the partial blocks at the recorded end and at
    the end of the intended peer's piece."""
    ranges = [(block_start(rec.size), rec.size)]
    if intent_check is not None:
        end = intent_check[0]
        ranges.append((block_start(end), end))
    return ReadPlan(tuple(ranges), stat=True)


def judge_record(rec: FileRecord, chain: list[bytes], snap: Snapshot, records: str,
                 appending: bool) -> LoadVerdict:
    """The file as found (`snap`, read by `record_plan`) against its record."""
    st = snap.stat
    if rec.freeze is not None and rec.freeze.reason == "reset":
        # Still reset: keep announcing what we last held, as before the restart. The file
        # is another history now; rehashing it (its inode may even be the old one, reused)
        # would announce that history while frozen, and the peers would diverge from it.
        return Reset(None)
    if st is None:
        if rec.size > 0:
            return Reset(f"file deleted while syncd was stopped (held {rec.size} bytes)")
        return Empty()
    if rec.size > 0 and st.inode != (rec.dev, rec.ino):
        return Reset("file replaced (new inode) while syncd was stopped")
    if st.size < rec.size:
        return Reset(f"file shrank from {rec.size} to {st.size} bytes while syncd was stopped")
    unchanged = (st.size, st.mtime_ns, st.ctime_ns) == (rec.file_size, rec.mtime_ns,
                                                        rec.ctime_ns)
    partial = snap.get(block_start(rec.size), rec.size)
    if (unchanged and len(chain) > rec.size // BLOCK
            and len(partial) == rec.size - block_start(rec.size)
            and (hashed := hashlib.sha256(partial)).digest() == rec.partial):
        # The ledger goes on from this hasher: the partial block is hashed once.
        return Restore(Ledger.restore(chain, rec.size, partial, records, hashed=hashed,
                                      keep_tail=False))
    # Changed while we were away (appended, or edited): rehash before trusting anything.
    # Bytes we recorded as held count as ours even mid-line, and so do a peer's pieces
    # we were appending when we stopped (the intent), never a local writer's torn line.
    hold, check = rec.size, None
    intent = rec.intent
    if intent is not None and intent[1] <= rec.size < intent[2] <= st.size:
        # Only if the whole piece is still there, and only once the file's prefix is checked
        # to have the digest we recorded: a writer's torn line may sit there instead.
        hold, check = intent[2], (intent[2], bytes.fromhex(intent[3]))
    # What a kill cut short may sit past our end until a peer's bytes explain it: the
    # note must now outlive a power loss too (the file's bytes will be synced).
    return RehashFile(hold, check, note_appending=appending and st.size > rec.size)


@dataclass(frozen=True)
class Hashed:
    """The rehashed file holds the recorded history (`edited_at` None) or not (then the
    first block that changed starts at or before `edited_at`)."""

    edited_at: int | None


@dataclass(frozen=True)
class NotTheIntent:
    """The bytes past the recorded end are not the peer's piece we were appending: local
    bytes; hash the file again holding only the recorded size."""


RehashVerdict = Hashed | NotTheIntent | Reset | Empty


def judge_rehash(rec: FileRecord | None, chain: list[bytes], fresh: Ledger | None,
                 snap: Snapshot, intent_check: tuple[int, bytes] | None) -> RehashVerdict:
    """A start-up rehash (`fresh`: None if the file vanished meanwhile) against the record
    (`snap` read by `rehash_plan`)."""
    if fresh is None:  # vanished while we hashed
        if rec is None or rec.size == 0:
            return Empty()
        return Reset("file deleted while syncd was starting")
    if intent_check is not None and rec is not None:
        end, digest = intent_check
        partial = snap.get(block_start(end), end)
        if not (fresh.size >= end and len(partial) == end - block_start(end)
                and fresh.digest_at(end, partial) == digest):
            return NotTheIntent()
    if rec is None:
        return Hashed(None)
    partial = snap.get(block_start(rec.size), rec.size)
    if (fresh.size >= rec.size and len(partial) == rec.size - block_start(rec.size)
            and fresh.digest_at(rec.size, partial) == rec.digest):
        return Hashed(None)
    return Hashed(first_change(chain, None, rec.size, fresh.chain, fresh.tail, fresh.size))


def still_vouched(ledger: Ledger, fresh: Ledger, snap: Snapshot) -> bool:
    """Whether a rehash (`fresh`) still holds every byte our ledger vouched for (`snap`: the
    ledger's last partial block, as the file holds it now)."""
    if fresh.size < ledger.size:
        return False
    partial = snap.get(block_start(ledger.size), ledger.size)
    return (len(partial) == ledger.size - block_start(ledger.size)
            and fresh.digest_at(ledger.size, partial) == ledger.digest())


def check_plan(ledger: Ledger) -> ReadPlan:
    """What a `check` rehash reads to judge: our last partial block, and a stat."""
    return ReadPlan(((block_start(ledger.size), ledger.size),), stat=True)
