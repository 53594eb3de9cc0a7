"""Position records: routine ones written by the worker thread, never older over newer."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from syncd.core.ledger import DIGEST_SIZE
from syncd.core.records import FileRecord
from syncd.disk import durable
from syncd.disk.recordfiles import RecordFiles, Save

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


def test_a_stop_saves_every_file_at_once_and_each_loads_back(tmp_path: Path) -> None:
    """save_all (the daemon's stop): new files, a grown chain, a rebuilt one, a kept one."""
    store = RecordFiles(tmp_path)
    store.save("grown", F, record(10), chain(1), durable=False)
    store.save("rebuilt", F, record(30), chain(3))
    store.save("kept", F, record(20), chain(2))
    no_worker(store)
    store.save_later("grown", F, record(15), chain(1))  # older than the stop's: dropped
    store.save_all([
        *(Save(f"new-{i}", F, record(i), chain(i)) for i in range(1, 40)),
        Save("grown", F, record(40), chain(4)),
        Save("rebuilt", F, record(7), chain(1, fill=1), rebuilt=True),
        Save("kept", F, record(25), None),
    ])
    store.flush()
    fresh = RecordFiles(tmp_path)
    for i in range(1, 40):
        got = fresh.load(f"new-{i}", F)
        assert got is not None and got[0].size == i and got[1] == chain(i)
    assert fresh.load("grown", F) == (record(40), chain(4))
    assert fresh.load("rebuilt", F) == (record(7), chain(1, fill=1))
    assert fresh.load("kept", F) == (record(25), chain(2))
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_file_that_cannot_be_saved_at_a_stop_leaves_the_others_saved(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = RecordFiles(tmp_path)
    store.save("bad", F, record(10), chain(1))
    (tmp_path / "files" / "bad" / f"{F}.json.tmp").mkdir()  # its temp file cannot be made
    store.save_all([Save("bad", F, record(20), chain(2)), Save("good", F, record(30), chain(3))])
    assert loaded_size(tmp_path, "bad") == 10  # as it was
    assert loaded_size(tmp_path, "good") == 30
    assert "cannot record the position in" in caplog.text and "bad" in caplog.text


def test_a_stop_syncs_each_file_before_its_rename_and_its_folder_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order `save` keeps, batched: bytes synced, renamed, folder synced; chains first."""
    calls: list[tuple[str, str]] = []
    real_sync, real_replace = durable.sync_files, os.replace

    def sync(paths: Iterable[Path], directories: bool = False) -> dict[Path, OSError]:
        paths = list(paths)
        calls.extend(("dir" if directories else "file", p.name) for p in paths)
        return real_sync(paths, directories)

    def replace(src: str | Path, dst: str | Path) -> None:
        calls.append(("rename", Path(dst).name))
        real_replace(src, dst)

    store = RecordFiles(tmp_path)
    store.save("a", F, record(10), chain(1))
    monkeypatch.setattr(durable, "sync_files", sync)
    monkeypatch.setattr(os, "replace", replace)
    store.save_all([Save("a", F, record(20), chain(2)), Save("b", F, record(30), chain(3))])
    assert calls == [
        ("file", f"{F}.chain"), ("file", f"{F}.json.tmp"),  # a: chain appended in place
        ("file", f"{F}.chain.tmp"), ("file", f"{F}.json.tmp"),  # b: new, written whole
        ("rename", f"{F}.chain"), ("dir", "b"),
        ("rename", f"{F}.json"), ("rename", f"{F}.json"), ("dir", "a"), ("dir", "b"),
    ]


def test_a_keys_folder_is_made_at_its_first_save_only(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = RecordFiles(tmp_path)
    made: list[Path] = []
    real_make_dirs, real_mkdir = durable.make_dirs, Path.mkdir

    def make_dirs(path: Path, mode: int = 0o777) -> list[Path]:
        made.append(path)
        return real_make_dirs(path, mode)

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        made.append(self)
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(durable, "make_dirs", make_dirs)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    for size in (10, 20, 30):
        store.save("k", F, record(size), chain(size // 10), durable=False)
    assert made and all(p == made[0] for p in made)  # the key's folder, at the first save
    first = len(made)
    store.save("k", F, record(40), chain(4), durable=False)
    assert len(made) == first
    assert loaded_size(tmp_path) == 40


def test_a_routine_save_makes_a_folder_removed_by_hand_again(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    store.save("k", F, record(10), chain(1), durable=False)
    folder = store.folder("k")
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    store.save("k", F, record(20), chain(2), durable=False)
    got = RecordFiles(tmp_path).load("k", F)
    assert got is not None and got[0].size == 20 and got[1] == chain(2)
