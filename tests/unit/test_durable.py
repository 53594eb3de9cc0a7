"""disk/durable.py: what is fsynced, and in which order (issue #23 case 10).

Real files and directories; only `os.fsync` is replaced by a double that records which file
or directory each call was about (a power loss cannot be had in a unit test: the order of
the calls is what a power loss depends on)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from syncd.disk import durable


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each fsync made, as the path its descriptor was open on ('dir:' for a directory)."""
    calls: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(("dir:" if os.path.isdir(path) else "") + path)
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", record)
    return calls


def test_make_dirs_fsyncs_the_parent_of_each_directory_it_creates(tmp_path: Path,
                                                                    fsyncs: list[str]) -> None:
    created = durable.make_dirs(tmp_path / "a" / "b" / "c")
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert (tmp_path / "a" / "b" / "c").is_dir()
    # Deepest first: c's entry in b, b's in a, a's in tmp_path.
    assert fsyncs == [f"dir:{tmp_path}/a/b", f"dir:{tmp_path}/a", f"dir:{tmp_path}"]


def test_make_dirs_of_an_existing_directory_syncs_nothing(tmp_path: Path,
                                                          fsyncs: list[str]) -> None:
    assert durable.make_dirs(tmp_path) == []
    assert fsyncs == []


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        durable.make_dirs(tmp_path / "f" / "g")


def test_replace_file_syncs_the_file_then_renames_then_syncs_its_directory(
        tmp_path: Path, fsyncs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state" / "record.json"
    path.parent.mkdir()
    path.write_bytes(b"old")
    seen: list[str] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        seen.append(f"rename after {len(fsyncs)} fsync(s)")
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "replace", replace)
    durable.replace_file(path, b"new")
    assert path.read_bytes() == b"new" and not (path.parent / "record.json.tmp").exists()
    assert fsyncs == [f"{path.parent}/record.json.tmp", f"dir:{path.parent}"]
    assert seen == ["rename after 1 fsync(s)"]  # the bytes are durable before the name
    assert (path.stat().st_mode & 0o777) == 0o600


def test_replace_file_makes_a_new_folder_durable_in_its_parent(tmp_path: Path,
                                                               fsyncs: list[str]) -> None:
    durable.replace_file(tmp_path / "files" / "k" / "r.json", b"{}")
    assert fsyncs == [f"dir:{tmp_path}/files", f"dir:{tmp_path}",
                      f"{tmp_path}/files/k/r.json.tmp", f"dir:{tmp_path}/files/k"]


def test_replace_file_not_durable_syncs_nothing(tmp_path: Path, fsyncs: list[str]) -> None:
    durable.replace_file(tmp_path / "r.json", b"{}", durable=False)
    assert (tmp_path / "r.json").read_bytes() == b"{}" and fsyncs == []


def test_create_file_never_overwrites_and_syncs_its_entry(tmp_path: Path,
                                                          fsyncs: list[str]) -> None:
    path = tmp_path / "identity.key"
    durable.create_file(path, b"secret")
    assert fsyncs == [str(path), f"dir:{tmp_path}"]
    with pytest.raises(FileExistsError):
        durable.create_file(path, b"other")
    assert path.read_bytes() == b"secret" and (path.stat().st_mode & 0o777) == 0o600


def test_records_and_notes_are_written_through_it(tmp_path: Path, fsyncs: list[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable record's rename is followed by its folder's fsync. The note before an
    append syncs nothing (it is per frame: a sync there doubled the lag); a durable one (at
    a start) is synced with its folder's entry."""
    from syncd.core.records import FileRecord
    from syncd.disk import recordfiles

    store = recordfiles.RecordFiles(tmp_path)
    record = FileRecord(size=0, digest=bytes(32), file_size=0, dev=1, ino=2, mtime_ns=3,
                        ctime_ns=4, partial=b"")
    store.save("k", "events.jsonl", record, [bytes(32)], durable=True)
    folder = f"{tmp_path}/files/k"
    assert fsyncs[-1] == f"dir:{folder}" and f"dir:{tmp_path}/files" in fsyncs
    fsyncs.clear()
    datasyncs: list[int] = []
    monkeypatch.setattr(recordfiles.os, "fdatasync", datasyncs.append)
    note = ("b", 0, 0, 9000, "00" * 32)
    store.note_appending("k", "log.jsonl", note)
    store.note_appending("k", "log.jsonl", note)
    assert fsyncs == [] and datasyncs == []
    assert store.load_appending("k", "log.jsonl") == note
    store.note_appending("k", "log.jsonl", note, durable=True)
    assert fsyncs == [f"dir:{folder}"] and len(datasyncs) == 1  # its bytes, then its entry


def test_files_synced_together_report_each_failure(tmp_path: Path) -> None:
    paths = [tmp_path / f"f{i}" for i in range(20)]
    for p in paths:
        p.write_bytes(b"x")
    missing = tmp_path / "gone"
    failed = durable.sync_files([*paths, missing, paths[0]])
    assert list(failed) == [missing] and isinstance(failed[missing], FileNotFoundError)
    assert durable.sync_files([tmp_path], directories=True) == {}
    assert list(durable.sync_files([paths[0]], directories=True)) == [paths[0]]  # not a folder
