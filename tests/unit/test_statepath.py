"""Keys as state_dir file names (syncd/core/statepath.py), and records written before nesting."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st

from syncd.core import statepath
from syncd.core.ledger import DIGEST_SIZE
from syncd.core.names import NAME_MAX, key_problem
from syncd.core.records import FileRecord
from syncd.disk.archive import archive_copy
from syncd.disk.recordfiles import VERSION, RecordFiles

ODD_KEYS = [
    "onebot_123/group_456",
    "cross_大厅",
    "matrix_@bot_example.org_!room_example.org",
    "x+y#z",
    "onebot_123 456",
    "UPPER.lower",
    ".hidden/..x",
    "100%/~",
    "大" * 85 + "/" + "é" * 127,  # long: more than one segment
]


def test_old_flat_keys_are_their_own_encoding() -> None:
    for key in ("abc", "bot-1", "bot_2.v3", "A" * 128):
        assert statepath.encode(key) == key
        assert statepath.key_dir(Path("/s/files"), key) == Path("/s/files") / key


def test_odd_keys_round_trip_into_safe_names() -> None:
    base = Path("/s/files")
    for key in ODD_KEYS:
        folder = statepath.key_dir(base, key)
        assert statepath.key_of_dir(base, folder) == key
        for part in folder.relative_to(base).parts:
            assert part not in (".", "..") and "/" not in part
            assert len(part.encode()) <= NAME_MAX
    assert statepath.encode("onebot_123/group_456") == "onebot_123%2Fgroup_456"
    assert statepath.encode(".x") == "%2Ex"


@given(st.lists(st.text(min_size=1, max_size=60), min_size=1, max_size=5).map("/".join))
def test_every_valid_key_round_trips_and_stays_below_its_base(key: str) -> None:
    if key_problem(key) is not None:
        return
    base = Path("/s/files")
    folder = statepath.key_dir(base, key)
    assert statepath.key_of_dir(base, folder) == key
    assert all(p not in (".", "..") and len(p.encode()) <= NAME_MAX
               for p in folder.relative_to(base).parts)


def _record(size: int) -> FileRecord:
    return FileRecord(size=size, digest=b"\x01" * 32, file_size=size, dev=1, ino=2,
                      mtime_ns=3, ctime_ns=4, partial=b"")


def test_a_record_written_by_the_old_code_still_loads(tmp_path: Path) -> None:
    # The old code put key "abc" in state_dir/files/abc/, by hand here, byte for byte.
    old = tmp_path / "files" / "abc"
    old.mkdir(parents=True)
    (old / "events.jsonl.json").write_bytes(orjson.dumps({
        "version": VERSION, "size": 10, "digest": "02" * 32, "file_size": 12, "dev": 5,
        "ino": 6, "mtime_ns": 7, "ctime_ns": 8, "partial": "", "freeze": None,
        "diverged_peers": {}, "note": None, "intent": None}))
    (old / "events.jsonl.chain").write_bytes(b"\x03" * DIGEST_SIZE)
    loaded = RecordFiles(tmp_path).load("abc", "events.jsonl")
    assert loaded is not None
    record, chain = loaded
    assert (record.size, record.file_size, record.ino) == (10, 12, 6)
    assert chain == [b"\x03" * DIGEST_SIZE]


def test_nested_and_odd_keys_are_stored_apart(tmp_path: Path) -> None:
    store = RecordFiles(tmp_path)
    for n, key in enumerate(["onebot_123", *ODD_KEYS], 1):
        store.save(key, "events.jsonl", _record(n), [bytes([n]) * DIGEST_SIZE])
    again = RecordFiles(tmp_path)
    for n, key in enumerate(["onebot_123", *ODD_KEYS], 1):
        loaded = again.load(key, "events.jsonl")
        assert loaded is not None and loaded[0].size == n, key
    assert (tmp_path / "files" / "onebot_123%2Fgroup_456" / "events.jsonl.json").is_file()
    assert not (tmp_path / "files" / "onebot_123" / "group_456").exists()


def test_archive_of_a_nested_key(tmp_path: Path) -> None:
    copy = tmp_path / "rt" / "onebot_123" / "group_456" / "events.jsonl"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"{}\n")
    dest = archive_copy(tmp_path / "state", "host-a", "onebot_123/group_456", "events.jsonl",
                        copy, {"reason": "test"})
    assert dest.parent == tmp_path / "state" / "archive" / "onebot_123%2Fgroup_456"
    manifest = orjson.loads(dest.with_name(dest.name + ".manifest.json").read_bytes())
    assert manifest["key"] == "onebot_123/group_456" and dest.read_bytes() == b"{}\n"
