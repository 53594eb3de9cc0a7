"""The free-space floor (syncd/daemon/freespace.py), on a statvfs that says what it is told."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from syncd.daemon import freespace
from syncd.daemon.freespace import FreeSpace


def statvfs_of(free: dict[str, int]):  # type: ignore[no-untyped-def]
    def statvfs(path: Path) -> os.statvfs_result:
        if str(path) not in free:
            raise FileNotFoundError(path)
        return SimpleNamespace(f_bavail=free[str(path)], f_frsize=1)  # type: ignore[return-value]
    return statvfs


def test_below_the_floor_no_peer_bytes_and_the_reason_names_the_place() -> None:
    free = {"/state": 10_000, "/roots": 500}
    fs = FreeSpace(Path("/state"), statvfs_of(free))
    fs.check([Path("/roots"), Path("/gone")], floor=1000)  # /gone: not there yet, skipped
    assert fs.low == {"/roots": 500} and fs.low_since is not None
    assert fs.problem(lambda: Path("/roots/a/b"), 1000) == (
        "free space on /roots is 500 bytes, below [limits] min_free_bytes (1000)")
    assert fs.problem(lambda: Path("/elsewhere"), 1000) is None
    assert fs.problem(lambda: None, 1000) is None
    assert fs.status(1000) == {"stopped": True, "since": fs.low_since,
                               "low": {"/roots": 500}, "min_free_bytes": 1000}


def test_a_low_state_dir_stops_every_key() -> None:
    fs = FreeSpace(Path("/state"), statvfs_of({"/state": 1, "/roots": 10**9}))
    fs.check([Path("/roots")], floor=1000)
    why = fs.problem(lambda: Path("/roots/a"), 1000)
    assert why is not None and why.startswith("free space in state_dir is 1 bytes")


def test_the_disk_is_looked_at_once_a_second_unless_asked_sooner() -> None:
    free = {"/state": 10**9}
    fs = FreeSpace(Path("/state"), statvfs_of(free))
    fs.check([], floor=1000)
    assert not fs.low
    free["/state"] = 5
    fs.check([], floor=1000)  # within FREE_SPACE_EVERY: not looked at again
    assert not fs.low
    fs.look_soon()
    fs.check([], floor=1000)
    assert fs.low == {"/state": 5}
    assert freespace.FREE_SPACE_EVERY == 1.0


def test_nothing_is_low_without_a_floor_and_the_ask_is_not_made() -> None:
    fs = FreeSpace(Path("/state"), statvfs_of({"/state": 0}))
    fs.check([], floor=0)
    asked = []
    assert fs.problem(lambda: asked.append(1) or None, 0) is None  # type: ignore[func-returns-value]
    assert not asked and fs.status(0)["stopped"] is False
