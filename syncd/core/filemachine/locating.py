"""Locating a divergence: once our copy and a peer's differ, find the first byte where they
part, block digests first (SUMS probes), then the bytes of that block (a BYTES probe). It
keeps its own state per diverged peer: when we last asked, the probe whose answer we wait
for, and the refusal that tells the peer our copies differ (resent until it shows it knows).
"""

from __future__ import annotations

import dataclasses

from syncd.core.events import Effect, FindLine, LineFound, Send, Snapshot
from syncd.core.filemachine.state import LOCATE_RETRY
from syncd.core.frames import Kind, Probe, Probed, ProbeWhat, Refuse
from syncd.core.ledger import BLOCK, DIGEST_SIZE
from syncd.core.reconcile import first_differing_block, first_differing_byte
from syncd.core.records import Freeze, line_around


class Locator:
    def __init__(self) -> None:
        self.locating: dict[str, float] = {}  # peer -> when we last asked it where we part
        # peer -> (what, start) of the probe we sent it last: only its answer is read (an
        # answer nobody asked for would make us read, and count lines, where a peer likes)
        self.probing: dict[str, tuple[ProbeWhat, int]] = {}
        # peer -> what tells it our copies differ (our digest at an offset both hold): sent
        # again with each locate retry until the peer shows it knows (its announcement names
        # us among its divergences), so that a lost frame never leaves a fork shown on one
        # side only.
        self.refusals: dict[str, Refuse] = {}

    def refuse(self, peer: str, offset: int, digest: bytes) -> Refuse:
        """Remember (and return) what tells `peer` that our prefix of `offset` bytes differs."""
        self.refusals[peer] = Refuse(offset, digest)
        return self.refusals[peer]

    def forget(self, peer: str) -> None:
        """The divergence with `peer` is over (cleared, or the peer retired)."""
        self.refusals.pop(peer, None)
        self.locating.pop(peer, None)
        self.probing.pop(peer, None)

    def clear(self) -> None:
        """A new history here: nothing learned about the old one holds."""
        self.refusals.clear()
        self.locating.clear()
        self.probing.clear()

    def wants(self, peer: str, found: Freeze, knows: bool) -> bool:
        """Whether `peer` is still to be asked: the first differing line is not known yet,
        or it has not shown that it knows of the fork (`knows`) since we refused it."""
        return found.line is None or (not knows and peer in self.refusals)

    def retry_at(self, peer: str) -> float:
        return self.locating.get(peer, float("-inf")) + LOCATE_RETRY

    def due(self, peer: str, now: float) -> bool:
        asked = self.locating.get(peer)
        return asked is None or now >= asked + LOCATE_RETRY

    def locate(self, peer: str, found: Freeze | None, knows: bool, now: float,
               sums: int) -> list[Effect]:
        """Ask `peer` again: our refusal (unless it knows), and our first block digests
        (unless the line is found already)."""
        self.locating[peer] = now
        out: list[Effect] = []
        refusal = self.refusals.get(peer)
        if refusal is not None and not knows:
            out.append(Send(Kind.REFUSE, refusal, to=peer))
        if found is None or found.line is None:
            out.append(self.probe(peer, ProbeWhat.SUMS, 0, sums))
        return out

    def probe(self, peer: str, what: ProbeWhat, start: int, count: int) -> Send:
        self.probing[peer] = (what, start)
        return Send(Kind.PROBE, Probe(what, start, count), to=peer)

    def asked(self, peer: str, p: Probed) -> bool:
        """Whether `p` answers the probe we sent `peer` last: same kind, same start, or the
        start cut to the end of its copy (its blocks, or its bytes)."""
        asked = self.probing.get(peer)
        if asked is None or asked[0] is not p.what:
            return False
        end = p.size // BLOCK if p.what is ProbeWhat.SUMS else p.size
        return p.start == asked[1] or (p.start < asked[1] and p.start == end)

    def narrow(self, peer: str, p: Probed, chain: list[bytes], snap: Snapshot,
               found: Freeze, sums: int) -> tuple[Effect, Freeze | None]:
        """Read the answer `p` to our last probe (`asked` holds) against our block digests
        (`chain`) or our bytes (read for it): the next probe, or the divergence located to a
        byte (the new `found`, and the FindLine that turns it into a line number)."""
        del self.probing[peer]
        if p.what is ProbeWhat.SUMS:
            theirs = [p.data[i: i + DIGEST_SIZE] for i in range(0, len(p.data), DIGEST_SIZE)]
            block = first_differing_block(chain, theirs, p.start)
            if block is None:
                common = min(len(chain) - 1, p.size // BLOCK)
                if p.start + len(theirs) < common:
                    return self.probe(peer, ProbeWhat.SUMS, p.start + len(theirs), sums), None
                block = common  # the full blocks agree: it is in the next one
            return self.probe(peer, ProbeWhat.BYTES, block * BLOCK, BLOCK), None
        # What the file holds, shipped or not: that is what the operator compares.
        ours = snap.get(p.start, p.start + len(p.data))
        i = first_differing_byte(ours, p.data)
        if i is None:
            i = min(len(ours), len(p.data))  # one copy ends where the other goes on
        located = dataclasses.replace(found, offset=p.start + i, ours=line_around(ours, i),
                                      theirs=line_around(p.data, i))
        return FindLine(peer, p.start + i), located


def with_line(found: Freeze | None, ev: LineFound) -> Freeze | None:
    """The divergence with its line number, if `ev` answers the FindLine for it."""
    if found is None or found.offset != ev.offset:
        return None
    return dataclasses.replace(found, line=ev.line)
