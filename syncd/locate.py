"""Where two diverged copies part, found without shipping either file.

A host that froze a file because a peer's copy differs asks that peer for its block digests
(32 bytes per 64 KiB block), compares them with its own chain (chains, once different, stay
different), then asks for the bytes of the one block that differs and compares those. The
result, the first differing byte and its line (the same on both sides, as everything before
it is equal), goes into the divergence record that `syncd status` shows.

Probes are answered even by a frozen copy: reading one's own bytes changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from syncd import frames, store
from syncd.frames import Probe, Probed, ProbeWhat
from syncd.ledger import BLOCK, DIGEST_SIZE
from syncd.reconcile import first_differing_block, first_differing_byte

if TYPE_CHECKING:
    from syncd.replica import Replica

log = logging.getLogger("syncd.replica")


def ask(r: Replica, peer: str) -> None:
    """Ask a diverged peer for its block digests; the answers narrow it down to a byte."""
    if r.ledger is None or not r.host.is_online(peer):
        return
    r._locating[peer] = time.monotonic()
    r.host.send(
        frames.Kind.PROBE, r.key, r.file, Probe(ProbeWhat.SUMS, 0, sums_per_frame(r)), to=peer
    )


def sums_per_frame(r: Replica) -> int:
    return max(1, r.host.chunk_bytes // DIGEST_SIZE)


def answer(r: Replica, sender: str, p: Probe) -> None:
    # Answered even when frozen: reading our own copy changes nothing.
    ledger = r.ledger
    if ledger is None:
        return
    if p.what is ProbeWhat.SUMS:
        blocks = len(ledger.chain) - 1
        start = min(p.start, blocks)
        count = min(p.count, sums_per_frame(r), blocks - start)
        body = b"".join(ledger.chain[start + 1 : start + 1 + count])
    else:
        start = min(p.start, ledger.size)
        body = store.read_range(r.path, start, min(ledger.size, start + min(p.count, BLOCK)))
    r.host.send(
        frames.Kind.PROBED, r.key, r.file, Probed(p.what, start, ledger.size, body), to=sender
    )


async def narrow(r: Replica, sender: str, p: Probed) -> None:
    ledger = r.ledger
    found = r.diverged.get(sender)
    if ledger is None or found is None or found.line is not None:
        return
    if p.what is ProbeWhat.SUMS:
        theirs = [p.data[i : i + DIGEST_SIZE] for i in range(0, len(p.data), DIGEST_SIZE)]
        block = first_differing_block(ledger.chain, theirs, p.start)
        if block is None:
            common = min(len(ledger.chain) - 1, p.size // BLOCK)
            if p.start + len(theirs) < common:
                r.host.send(
                    frames.Kind.PROBE,
                    r.key,
                    r.file,
                    Probe(ProbeWhat.SUMS, p.start + len(theirs), sums_per_frame(r)),
                    to=sender,
                )
                return
            block = common  # the full blocks agree: it is in the next one
        r.host.send(
            frames.Kind.PROBE,
            r.key,
            r.file,
            Probe(ProbeWhat.BYTES, block * BLOCK, BLOCK),
            to=sender,
        )
        return
    # What the file holds, shipped or not: that is what the operator compares.
    ours = store.read_range(r.path, p.start, p.start + len(p.data))
    i = first_differing_byte(ours, p.data)
    if i is None:
        i = min(len(ours), len(p.data))  # one copy ends where the other goes on
    offset = p.start + i
    line = await asyncio.to_thread(store.line_number, r.path, offset)
    r.diverged[sender] = dataclasses.replace(
        found,
        offset=offset,
        line=line,
        ours=store.line_around(ours, i),
        theirs=store.line_around(p.data, i),
    )
    log.warning(
        "%s: copies of %s and %s first differ at byte %d (line %d)",
        r.name,
        r.host.node,
        sender,
        offset,
        line,
    )
    r.record_dirty = True
    r.persist(force=True)
