"""The kernel's limits at scale: when they are too low, and what the operator is told to type."""

from __future__ import annotations

from pathlib import Path

from syncd.core.oslimits import InotifyLimits, no_instance, shortfalls, suggested
from syncd.disk.oslimits import count_directories, inotify_limits


def test_the_suggestion_leaves_room_for_the_roots_to_double() -> None:
    assert suggested(10) == 8192
    assert suggested(4096) == 8192
    assert suggested(4097) == 16384
    assert suggested(12034) == 32768
    assert suggested(1, floor=128) == 128


def test_enough_watches_and_instances_say_nothing() -> None:
    assert shortfalls(InotifyLimits(8192, 128), 8192) == []
    assert shortfalls(InotifyLimits(None, None), 10**6) == []  # unknown: nothing to judge


def test_too_few_watches_name_the_numbers_and_the_sysctl() -> None:
    [warning] = shortfalls(InotifyLimits(8192, 128), 12034)
    assert warning == (
        "fs.inotify.max_user_watches is 8192, fewer than the 12034 directories under the "
        "runtimes roots (syncd watches each one): changes in 3842 or more of them are found "
        "by the sweep only, late; raise it: sysctl -w fs.inotify.max_user_watches=32768, and "
        "keep it across reboots with the line 'fs.inotify.max_user_watches = 32768' in "
        "/etc/sysctl.d/60-syncd.conf")


def test_watches_used_up_by_other_processes_are_named_too() -> None:
    [warning] = shortfalls(InotifyLimits(8192, 128), 100, unwatched=7)
    assert warning.startswith(
        "7 of the 100 directories under the runtimes roots have no inotify watch: this "
        "user's watches (fs.inotify.max_user_watches = 8192) are used up, by other processes "
        "of the same user too;")
    assert "sysctl -w fs.inotify.max_user_watches=16384" in warning


def test_no_instance_left() -> None:
    [warning] = shortfalls(InotifyLimits(8192, 0), 10)
    assert warning.startswith("fs.inotify.max_user_instances is 0: syncd needs 1 inotify "
                              "instance, and finds changes by the sweep only without;")
    assert "sysctl -w fs.inotify.max_user_instances=128" in warning
    why = no_instance(InotifyLimits(8192, 128), 12, 1024, "Too many open files")
    assert why.startswith("cannot watch the runtimes roots (Too many open files): this "
                          "user's inotify instances (fs.inotify.max_user_instances = 128) "
                          "are all in use")
    assert "sysctl -w fs.inotify.max_user_instances=256" in why
    # EMFILE from our own descriptors: the unit's LimitNOFILE, not the sysctl.
    fds = no_instance(InotifyLimits(8192, 128), 1023, 1024, "Too many open files")
    assert "1023 of its 1024 file descriptors open: raise LimitNOFILE=" in fds


def test_limits_are_the_lower_of_the_sysctl_and_this_user_namespace(tmp_path: Path) -> None:
    for name, value in (("fs/inotify/max_user_watches", "8192"),
                        ("user/max_inotify_watches", "2147483647"),  # a new namespace's
                        ("fs/inotify/max_user_instances", "128"),
                        ("user/max_inotify_instances", "5")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    assert inotify_limits(tmp_path) == InotifyLimits(8192, 5)
    assert inotify_limits(tmp_path / "nowhere") == InotifyLimits(None, None)


def test_directories_are_counted_as_the_watcher_walks_them(tmp_path: Path) -> None:
    root = tmp_path / "rt"
    for d in ("a/resources/artifacts", "b", "c/d/e"):
        (root / d).mkdir(parents=True)
    (root / "a" / "events.jsonl").write_bytes(b"")
    (root / "link").symlink_to(tmp_path)  # not followed, not counted
    (tmp_path / "elsewhere").mkdir()
    assert count_directories([root], 64) == 8  # rt a resources artifacts b c d e
    assert count_directories([root], 1) == 4  # rt a b c: the watcher's max_depth
    assert count_directories([root / "missing"], 64) == 0
