"""The watcher on real directories: each kind of change reaches the hint callback, with
inotify read on the loop and with the watchdog fallback."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from syncd.disk import inotify
from syncd.disk.watcher import Watcher


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


BACKENDS = ["inotify", "watchdog"] if inotify.available() else ["watchdog"]


class Hints:
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []
        self.overflows = 0
        self.changed = asyncio.Event()

    def __call__(self, path: str, gone: bool) -> None:
        self.seen.append((path, gone))
        self.changed.set()

    def overflow(self) -> None:
        self.overflows += 1
        self.changed.set()

    async def wait_for(self, path: Path, gone: bool | None = None) -> None:
        await self.until(lambda: any(p == str(path) and (gone is None or g == gone)
                                     for p, g in self.seen))

    async def until(self, cond: Callable[[], bool], within: float = 5) -> None:
        async def met() -> None:
            while not cond():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(met(), within)


def append(path: Path, times: int = 1) -> None:
    with open(path, "ab", buffering=0) as f:
        for _ in range(times):
            f.write(b"{}\n")


def queue_limit() -> int:
    return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())


async def watching(root: Path, backend: str) -> tuple[Watcher, Hints]:
    hints = Hints()
    w = Watcher([root], hints, hints.overflow, backend=backend)
    w.start()  # watchdog's observer, too, has set its watches when start() returns
    return w, hints


@pytest.mark.parametrize("backend", BACKENDS)
@in_loop
async def test_appends_creations_and_deletions_are_hinted(tmp_path: Path, backend: str) -> None:
    (tmp_path / "k").mkdir()
    log = tmp_path / "k" / "events.jsonl"
    log.write_bytes(b"{}\n")
    w, hints = await watching(tmp_path, backend)
    try:
        append(log)
        await hints.wait_for(log, gone=False)
        other = tmp_path / "k" / "other.jsonl"
        other.write_bytes(b"x")
        await hints.wait_for(other, gone=False)
        log.unlink()
        await hints.wait_for(log, gone=True)
    finally:
        w.stop()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.filterwarnings("ignore:Callback with id")  # watchdog's own, about its own watches
@in_loop
async def test_nested_directories_made_later_are_watched(tmp_path: Path, backend: str) -> None:
    w, hints = await watching(tmp_path, backend)
    try:
        deep = tmp_path / "profiles" / "p1" / "runtimes" / "bot"
        deep.mkdir(parents=True)  # faster than the watches can follow: inside is reported too
        log = deep / "events.jsonl"
        log.write_bytes(b"{}\n")
        await hints.wait_for(log)
        hints.seen.clear()
        append(log)
        await hints.wait_for(log, gone=False)
    finally:
        w.stop()


@pytest.mark.parametrize("backend", BACKENDS)
@in_loop
async def test_a_file_renamed_over_the_log_is_hinted_as_gone(tmp_path: Path,
                                                            backend: str) -> None:
    (tmp_path / "k").mkdir()
    log = tmp_path / "k" / "events.jsonl"
    log.write_bytes(b"{}\n")
    w, hints = await watching(tmp_path, backend)
    try:
        tmp = tmp_path / "k" / ".new"
        tmp.write_bytes(b"other\n")
        os.rename(tmp, log)
        await hints.wait_for(log, gone=True)
    finally:
        w.stop()


@in_loop
async def test_a_moved_directory_is_followed_under_its_new_name(tmp_path: Path) -> None:
    if not inotify.available():
        pytest.skip("inotify only")
    (tmp_path / "old" / "k").mkdir(parents=True)
    w, hints = await watching(tmp_path, "inotify")
    try:
        os.rename(tmp_path / "old", tmp_path / "new")
        await hints.wait_for(tmp_path / "old", gone=True)
        await hints.wait_for(tmp_path / "new", gone=True)
        log = tmp_path / "new" / "k" / "events.jsonl"
        log.write_bytes(b"{}\n")
        await hints.wait_for(log, gone=False)
        # Nothing is watched twice or under its old name.
        assert w.watched == 3
    finally:
        w.stop()


@in_loop
async def test_a_burst_of_appends_is_one_hint(tmp_path: Path) -> None:
    if not inotify.available():
        pytest.skip("inotify only")
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    w, hints = await watching(tmp_path, "inotify")
    try:
        append(log, 200)
        await hints.wait_for(log)
        assert hints.seen.count((str(log), False)) < 10
    finally:
        w.stop()


@in_loop
async def test_an_overflowed_queue_asks_for_a_look_at_everything(tmp_path: Path) -> None:
    if not inotify.available():
        pytest.skip("inotify only")
    limit = queue_limit()
    if limit > 100_000:
        pytest.skip("queue too long to overflow quickly")
    w, hints = await watching(tmp_path, "inotify")
    try:
        # Distinct names are not merged by the kernel; the loop does not read meanwhile.
        for i in range(limit + 10):
            (tmp_path / f"f{i}").touch()
        await hints.until(lambda: hints.overflows > 0, within=10)
    finally:
        w.stop()



@in_loop
async def test_a_root_made_after_start_is_watched_from_the_next_sweep(tmp_path: Path) -> None:
    if not inotify.available():
        pytest.skip("inotify only")
    root = tmp_path / "runtimes"
    w, hints = await watching(root, "inotify")  # missing: nothing to watch yet
    try:
        assert w.watched == 0
        (root / "k").mkdir(parents=True)
        w.rewatch()
        log = root / "k" / "events.jsonl"
        log.write_bytes(b"{}\n")
        await hints.wait_for(log, gone=False)
    finally:
        w.stop()


@in_loop
async def test_held_events_wait_in_the_kernel_until_drained(tmp_path: Path) -> None:
    if not inotify.available():
        pytest.skip("inotify only")
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    w, hints = await watching(tmp_path, "inotify")
    try:
        w.hold()
        append(log)
        for _ in range(20):  # loop turns: a reader still registered would have run by now
            await asyncio.sleep(0)
        assert hints.seen == []
        w.drain()  # read now, while still held
        assert hints.seen == [(str(log), False)]
        w.resume()
        append(log)
        await hints.until(lambda: len(hints.seen) == 2)
    finally:
        w.stop()
