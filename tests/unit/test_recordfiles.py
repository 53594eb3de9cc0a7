"""Position records: routine ones written by the worker thread, never older over newer."""

from __future__ import annotations

import threading
from pathlib import Path

from syncd.core.ledger import DIGEST_SIZE
from syncd.core.records import FileRecord
from syncd.disk.recordfiles import RecordFiles

F = "events.jsonl"


def record(size: int) -> FileRecord:
    return FileRecord(size=size, digest=bytes([size % 256]) * 32, file_size=size, dev=1, ino=2,
                      mtime_ns=3, ctime_ns=4, partial=b"")


def chain(n: int, fill: int = 7) -> list[bytes]:
    return [bytes([fill]) * DIGEST_SIZE] * n


def no_worker(store: RecordFiles) -> None:
    """Queued records wait for flush(): the order of events is the test's, not a thread's."""
    store._worker = threading.current_thread()


def loaded_size(root: Path, key: str = "k") -> int:
    got = RecordFiles(root).load(key, F)
    assert got is not None
    return got[0].size


def test_a_routine_record_is_written_by_the_worker(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    store.save_later("k", F, record(10), chain(1))
    store.flush()
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[0].size == 10 and got[1] == chain(1)


def test_only_the_entries_of_its_record_are_written_while_the_chain_grows(
        tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    c = chain(2)
    store.save_later("k", F, record(10), c)
    c.append(b"\x09" * DIGEST_SIZE)  # the ledger grew after the record was made
    store.flush()
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[1] == chain(2)


def test_a_durable_save_is_never_undone_by_an_older_queued_one(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    no_worker(store)
    store.save_later("k", F, record(10), chain(1))
    store.save("k", F, record(20), chain(2))  # a freeze, say: synchronous, durable
    store.flush()
    assert loaded_size(tmp_path) == 20


def test_a_queued_record_of_a_replaced_history_is_dropped(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    store.save("k", F, record(30), chain(3))
    no_worker(store)
    store.save_later("k", F, record(40), chain(4))  # of the old history
    store.forget_chain("k", F)  # an edit was noticed: the ledger is rebuilt
    store.flush()
    assert loaded_size(tmp_path) == 30
    store.save("k", F, record(5), chain(1, fill=1))  # the new history, chain rewritten whole
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[0].size == 5 and got[1] == chain(1, fill=1)


def test_the_range_being_appended_survives_a_restart(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    store.save("k", F, record(10), chain(1), durable=False)
    store.note_appending("k", F, ("a-long-node-name", 10, 10, 9000, "ab" * 32))
    store.note_appending("k", F, ("b", 10, 12, 900, "cd" * 32))  # shorter: nothing else stays
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[0].appending == ("b", 10, 12, 900, "cd" * 32)
    store.note_appending("k", F, None)
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[0].appending is None
