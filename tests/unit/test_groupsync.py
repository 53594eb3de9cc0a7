from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from syncd.disk import groupsync, logfile
from syncd.disk.groupsync import INLINE_WAIT, GroupSync, sync_files


def test_many_waiting_files_are_made_durable_together(tmp_path: Path) -> None:
    paths = []
    for i in range(20):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x\n")
        paths.append(p)
    assert sync_files(paths, [tmp_path]) == {}

    async def main() -> None:
        g = GroupSync()
        await asyncio.gather(*(g.sync(p, [tmp_path]) for p in paths),
                             g.sync(paths[0], inline=True))
        await g.close()

    asyncio.run(main())


def test_a_failure_reaches_every_waiter(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_bytes(b"")

    async def main() -> list[object]:
        g = GroupSync()
        results = await asyncio.gather(g.sync(tmp_path / "missing-a"),
                                       g.sync(tmp_path / "b", [blocked / "x"]),
                                       return_exceptions=True)
        await g.close()
        return results

    # A missing file is no error (nothing of ours to make durable); a directory that cannot
    # be synced fails the file that needed it, and only that one.
    results = asyncio.run(main())
    assert results[0] is None
    assert isinstance(results[1], OSError)


def test_only_the_files_and_directories_syncd_wrote_are_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, Path]] = []
    monkeypatch.setattr(logfile, "sync", lambda p: synced.append(("file", p)))
    monkeypatch.setattr(logfile, "sync_dir", lambda p: synced.append(("dir", p)))
    a, b = tmp_path / "k1" / "events.jsonl", tmp_path / "k2" / "events.jsonl"

    async def main() -> None:
        g = GroupSync()
        await asyncio.gather(g.sync(a, [a.parent, tmp_path]), g.sync(b), g.sync(a))
        await g.close()

    asyncio.run(main())
    # (a is synced twice: asked for again while its first batch was in the worker.)
    assert set(synced) == {("file", a), ("file", b), ("dir", a.parent), ("dir", tmp_path)}


def test_a_slow_disk_never_holds_the_loop_past_a_small_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file sync that takes 0.4 s (another process filling the disk): the loop waits for a
    # lone small sync at most INLINE_WAIT, then goes on; the sync still completes.
    monkeypatch.setattr(logfile, "sync", lambda p: time.sleep(0.4))
    monkeypatch.setattr(groupsync, "_sync_ns", 0)  # the disk looked fast until now
    path = tmp_path / "f"
    path.write_bytes(b"x\n")

    async def main() -> float:
        g = GroupSync()
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        await g.sync(path, inline=True)
        ticker.cancel()
        await g.close()
        return max(gaps)

    # Generous for a loaded machine: the old inline fdatasync held the loop for the whole 0.4 s.
    assert asyncio.run(main()) < 0.2
    assert INLINE_WAIT <= 0.01


def test_the_files_of_one_turn_are_synced_on_several_threads_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent fdatasyncs share a journal commit and a cache flush; one after another each
    waits for its own. So the eight files of one turn (a frame's) are synced by two threads at
    least, at the same time (the barrier lets a sync through only once another thread is in
    one too)."""
    import threading

    meet = threading.Barrier(2, timeout=5)
    threads: set[str] = set()

    def sync(path: object) -> None:
        name = threading.current_thread().name
        if name not in threads:
            threads.add(name)
            meet.wait()  # BrokenBarrierError (the sync fails) when no other thread comes

    monkeypatch.setattr(logfile, "sync", sync)
    paths = [tmp_path / f"f{i}" for i in range(8)]

    async def main() -> None:
        g = GroupSync()
        await asyncio.gather(*(g.sync(p) for p in paths))
        await g.close()

    asyncio.run(main())
    assert len(threads) >= 2
