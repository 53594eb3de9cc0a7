from __future__ import annotations

import asyncio
from pathlib import Path

from syncd.core.ledger import Ledger
from syncd.daemon.scrub import scrub_file


def test_scrub_finds_an_edit_deep_inside_and_passes_an_intact_file(tmp_path: Path) -> None:
    data = b"".join(b'{"n":%d}\n' % i for i in range(50_000))  # ~500 KB, many blocks
    path = tmp_path / "events.jsonl"
    path.write_bytes(data)
    ledger = Ledger()
    ledger.extend(data)
    assert asyncio.run(scrub_file(path, ledger, rate=0))
    edited = bytearray(data)
    edited[123_456] ^= 1  # same size: only a re-read can see it
    path.write_bytes(bytes(edited))
    assert not asyncio.run(scrub_file(path, ledger, rate=0))
