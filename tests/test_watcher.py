"""The watcher's hints (inotify read on the event loop): what each change of the runtimes
directory is reported as, and the fallback to watchdog where inotify cannot be used."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from syncd import watcher
from syncd.watcher import Inotify, Watcher

Hints = set[tuple[str, bool]]


async def _hints_of(root: Path, steps: list[Callable[[], object]]) -> list[Hints]:
    """The hints (path relative to root, gone) that each step gives, in order."""
    seen: list[tuple[str, bool]] = []
    w = Watcher(root, lambda path, gone: seen.append((os.path.relpath(path, root), gone)))
    w.start()
    out = []
    try:
        for step in steps:
            seen.clear()
            step()
            await asyncio.sleep(0.15)
            out.append(set(seen))
    finally:
        w.stop()
    return out


def test_hints_for_appends_creations_removals_and_renames(tmp_path: Path) -> None:
    root = tmp_path / "runtimes"
    (root / "k1").mkdir(parents=True)
    f = root / "k1" / "events.jsonl"

    def append(path: Path) -> Callable[[], object]:
        return lambda: path.open("ab").write(b"x\n")

    def new_key() -> None:
        (root / "k2").mkdir()
        (root / "k2" / "events.jsonl").write_bytes(b"a\n")

    def rename_over() -> None:
        (root / "k1" / "tmp").write_bytes(b"b\n")
        os.rename(root / "k1" / "tmp", f)

    def move_in() -> None:
        (tmp_path / "outside").write_bytes(b"c\n")
        os.rename(tmp_path / "outside", f)

    hints = asyncio.run(_hints_of(root, [
        append(f),
        new_key,
        append(root / "k2" / "events.jsonl"),
        rename_over,
        lambda: f.unlink(),
        move_in,
        lambda: os.rename(root / "k2", root / "k3"),
        append(root / "k3" / "events.jsonl"),
    ]))
    assert hints == [
        {("k1/events.jsonl", False)},
        # The file may be made before the new directory's watch: it is hinted all the same.
        {("k2", False), ("k2/events.jsonl", False)},
        {("k2/events.jsonl", False)},
        {("k1/tmp", False), ("k1/tmp", True), ("k1/events.jsonl", True)},
        {("k1/events.jsonl", True)},
        {("k1/events.jsonl", False)},  # moved in from elsewhere: a creation
        {("k2", True), ("k3", True), ("k2/events.jsonl", True), ("k3/events.jsonl", True)},
        {("k3/events.jsonl", False)},  # the renamed key is still watched, under its new name
    ]


def test_falls_back_to_watchdog_without_inotify(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(self: Inotify) -> None:
        raise OSError("inotify is not available")

    monkeypatch.setattr(watcher.Inotify, "start", unavailable)
    (tmp_path / "k").mkdir()
    f = tmp_path / "k" / "events.jsonl"
    f.write_bytes(b"a\n")

    async def watch() -> list[tuple[str, bool]]:
        seen: list[tuple[str, bool]] = []
        w = Watcher(tmp_path, lambda path, gone: seen.append((path, gone)))
        w.start()
        try:
            await asyncio.sleep(0.2)
            with f.open("ab") as out:
                out.write(b"b\n")
            for _ in range(100):  # watchdog's threads hand the event on in their own time
                if seen:
                    break
                await asyncio.sleep(0.05)
        finally:
            w.stop()
        return seen

    assert (str(f), False) in asyncio.run(watch())
