"""Finding instances at any depth, under one or several roots (syncd/disk/discovery.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from syncd.core.roots import Layout, RootSpec
from syncd.core.spot import Spot
from syncd.disk import discovery, tree
from syncd.disk.discovery import Scanner

FILES = ("events.jsonl",)
ODD = ["cross_大厅", "matrix_@bot_example.org_!room_example.org", "x+y#z", "onebot_123 456",
       "UPPER.lower", "大" * 40]


def files_of(key: str) -> tuple[str, ...]:
    return FILES


def scanner(layout: Layout, extra_depth: int = 0) -> Scanner:
    return Scanner(layout, files_of, frozenset(FILES), extra_depth)


def instance(root: Path, rel: str, name: str = "events.jsonl") -> Path:
    folder = root / rel
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"{}\n")
    return folder


def keys(s: Scanner) -> list[str]:
    return sorted(i.key for i in s.scan().instances)


def test_instances_at_any_depth_and_nothing_inside_them(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    instance(rt, "main")
    instance(rt, "onebot_123/group_456")
    instance(rt, "onebot_123/private_7")
    instance(rt, "a/b/c/d")  # 4 levels: the deepest
    instance(rt, "main/resources/artifacts/tool")  # inside an instance: not one
    instance(rt, "onebot_123/group_456/workspace")
    (rt / "onebot_123" / "empty").mkdir()
    for name in ODD:
        instance(rt, f"{name}/{name}")
    assert keys(scanner(Layout.single(rt))) == sorted([
        "a/b/c/d", "main", "onebot_123/group_456", "onebot_123/private_7",
        *(f"{n}/{n}" for n in ODD)])


def test_too_deep_is_reported_not_found(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    instance(rt, "a/b/c/d/e")
    assert keys(scanner(Layout.single(rt))) == []
    scan = scanner(Layout.single(rt), extra_depth=2).scan()
    assert scan.instances == []
    [skip] = scan.skipped
    assert (skip.key, skip.folder) == ("a/b/c/d/e", rt / "a/b/c/d/e")
    assert "5 levels below its root (instances are found at most 4 levels deep)" in skip.reason


def test_what_cannot_be_replicated_is_named_with_the_reason(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    bad = os.fsdecode(b"bad\xff")  # not UTF-8: a str with a surrogate escape
    instance(rt, bad)
    instance(rt, f"{bad}/below")  # inside the bad instance: not looked at
    instance(rt, "ok")
    instance(tmp_path / "elsewhere", "x")
    (rt / "linked").symlink_to(tmp_path / "elsewhere" / "x")
    (rt / "events.jsonl").write_bytes(b"")  # the root itself holds a memory file
    scan = scanner(Layout.single(rt)).scan()
    assert [i.key for i in scan.instances] == ["ok"]
    reasons = {s.key: s.reason for s in scan.skipped}
    assert reasons["bad\\xff"] == "component 'bad\\xff': not valid UTF-8"
    assert reasons["linked"].startswith("a symbolic link: not followed")
    assert reasons[""].startswith("the root itself holds events.jsonl")
    assert len(scan.skipped) == 3


def test_an_unreadable_directory_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    instance(rt, "locked/in")
    instance(rt, "open")
    real = tree.open_dir

    def refusing(spot: Spot) -> int:  # as for a directory of mode 000 (root reads those)
        if spot.path == rt / "locked":
            raise PermissionError(13, "Permission denied", str(spot))
        return real(spot)

    monkeypatch.setattr(discovery.tree, "open_dir", refusing)
    scan = scanner(Layout.single(rt)).scan()
    assert [i.key for i in scan.instances] == ["open"]
    [skip] = scan.skipped
    assert (skip.key, skip.reason) == ("locked", "cannot list: Permission denied")


def test_a_sweep_lists_only_directories_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    for n in range(20):
        instance(rt, f"bot-{n}")
        instance(rt, f"sid-{n}/chan")
    set_mtimes_in_the_past(rt)  # not racy: a listing is trusted while the mtime holds
    s = scanner(Layout.single(rt))
    assert len(s.scan().instances) == 40
    listed: list[str] = []
    real = tree.open_dir

    def counting(spot: Spot) -> int:
        listed.append(str(spot.path))
        return real(spot)

    monkeypatch.setattr(discovery.tree, "open_dir", counting)
    again = s.scan()
    assert listed == [] and not again.changed and len(again.instances) == 40
    new = instance(rt, "sid-3/chan-2")  # a nested instance appears
    found = s.scan()
    assert found.changed and "sid-3/chan-2" in {i.key for i in found.instances}
    assert sorted(listed) == [str(rt / "sid-3"), str(new)]  # the changed directory, the new one
    (rt / "sid-3" / "chan-2" / "events.jsonl").unlink()  # clear(): still an instance
    assert len(s.scan().instances) == 41


def set_mtimes_in_the_past(rt: Path) -> None:
    for folder in [rt, *(p for p in rt.rglob("*") if p.is_dir())]:
        t = os.stat(folder).st_mtime_ns - 10_000_000_000
        os.utime(folder, ns=(t, t))


def test_a_racy_directory_is_listed_again(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    (rt / "sid").mkdir(parents=True)
    s = scanner(Layout.single(rt))
    assert keys(s) == []
    t = os.stat(rt / "sid").st_mtime_ns
    instance(rt, "sid/chan")
    os.utime(rt / "sid", ns=(t, t))  # a change within the same timestamp tick
    assert keys(s) == ["sid/chan"]


def test_profiles_under_a_glob(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    instance(profiles / "alice" / "runtimes", "onebot_123/group_456")
    instance(profiles / "alice" / "runtimes", "main")
    (profiles / "alice" / "cache").mkdir()
    (profiles / ".trash" / "runtimes").mkdir(parents=True)
    (profiles / "carol").mkdir()  # no runtimes yet
    layout = Layout((RootSpec(profiles / "*" / "runtimes"),), prefixed=True)
    s = scanner(layout)
    assert keys(s) == ["alice/main", "alice/onebot_123/group_456"]
    instance(profiles / "bob" / "runtimes", "main")
    instance(profiles / "carol" / "runtimes", "x+y#z/大厅")
    assert keys(s) == ["alice/main", "alice/onebot_123/group_456", "bob/main",
                       "carol/x+y#z/大厅"]


def test_a_name_taken_twice_is_named(tmp_path: Path) -> None:
    instance(tmp_path / "a" / "alice", "main")
    instance(tmp_path / "b" / "alice", "main")
    layout = Layout((RootSpec(tmp_path / "a" / "*"), RootSpec(tmp_path / "b" / "*")),
                    prefixed=True)
    scan = scanner(layout).scan()
    assert [(i.key, i.folder) for i in scan.instances] == [
        ("alice/main", tmp_path / "a" / "alice" / "main")]
    [skip] = scan.skipped
    assert skip.folder == tmp_path / "b" / "alice"
    assert skip.reason == f"root name 'alice' is already taken by {tmp_path / 'a' / 'alice'}"
