"""Background scrub: re-read shipped bytes at a bounded rate and compare with the ledgers.

The watcher and the pre-ship check catch edits near the end of a file at once; an edit deep
inside a file that does not change its size is caught here. Worst case, an edit in the middle
stays unnoticed for (total bytes of all files) / scrub_bytes_per_second + scrub_interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from syncd.config import Config
from syncd.core.ledger import Ledger
from syncd.core.spot import Spot
from syncd.disk import logfile

log = logging.getLogger("syncd.scrub")
STEP = 1 << 20


def _read_into(ledger: Ledger, path: logfile.Where, offset: int, n: int) -> int:
    # Read and hash in the worker thread: the event loop keeps its millisecond latency.
    data = logfile.read_range(path, offset, offset + n)
    ledger.extend(data)
    return len(data)


async def scrub_file(path: logfile.Where, ledger: Ledger, rate: int) -> bool:
    """True if the first ledger.size bytes on disk still match the ledger.

    Size and digest are taken at the start: the ledger may grow meanwhile, but the digest of a
    prefix never changes, so the comparison stays valid.
    """
    size = ledger.size
    expected = ledger.digest()
    fresh = Ledger()
    loop = asyncio.get_running_loop()
    pos = 0
    while pos < size:
        t0 = loop.time()
        n = await asyncio.to_thread(_read_into, fresh, path, pos, min(STEP, size - pos))
        if not n:
            return False
        pos += n
        if rate > 0:
            await asyncio.sleep(max(0.0, n / rate - (loop.time() - t0)))
    return fresh.digest() == expected


class Scrubbed(Protocol):
    """One replicated file, as the scrub sees it (daemon/filetask.py)."""

    spot: Spot

    @property
    def name(self) -> str: ...

    @property
    def ledger(self) -> Ledger | None: ...

    def scrub_failed(self) -> None: ...


class ScrubHost(Protocol):
    config: Config

    def scrubbed(self) -> Iterable[Scrubbed]: ...


async def scrub_forever(node: ScrubHost) -> None:
    rate = node.config.scrub_bytes_per_second
    if rate <= 0:
        return
    while True:
        await asyncio.sleep(node.config.scrub_interval)
        for replica in list(node.scrubbed()):
            ledger = replica.ledger
            if ledger is None or ledger.size == 0:
                continue
            try:
                ok = await scrub_file(replica.spot, ledger, rate)
            except OSError as e:
                log.debug("scrub of %s skipped: %s", replica.name, e)
                continue
            if not ok:
                replica.scrub_failed()
