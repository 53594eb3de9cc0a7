from __future__ import annotations

import asyncio
from pathlib import Path

from syncd.disk.groupsync import GroupSync, sync_many


def test_many_waiting_files_are_made_durable_together(tmp_path: Path) -> None:
    paths = []
    for i in range(20):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x\n")
        paths.append(p)
    sync_many(paths)  # one syncfs for the filesystem, no error

    async def main() -> None:
        g = GroupSync()
        await asyncio.gather(*(g.sync(p) for p in paths))
        await g.close()

    asyncio.run(main())


def test_a_failure_reaches_every_waiter(tmp_path: Path) -> None:
    async def main() -> list[object]:
        g = GroupSync()
        results = await asyncio.gather(g.sync(tmp_path / "missing-a"),
                                       g.sync(tmp_path / "missing-b"), return_exceptions=True)
        await g.close()
        return results

    # Missing files are skipped by syncfs grouping, or fail alone with fdatasync: no hang.
    results = asyncio.run(main())
    assert len(results) == 2
