"""Answering a peer: which bytes a request or a probe needs read, the digest of our prefix at
an offset, and the frames that serve a request or answer a probe. Pure functions of the ledger
and the bytes read for that very answer; the machine decides whether to answer at all."""

from __future__ import annotations

from syncd.core.events import (
    NO_READS,
    Effect,
    LookAgain,
    PeerRequest,
    ReadPlan,
    Redeliver,
    Rehash,
    Send,
    Snapshot,
)
from syncd.core.filemachine.localfile import pieces
from syncd.core.filemachine.state import first_read
from syncd.core.frames import Data, Kind, Probe, Probed, ProbeWhat, Request
from syncd.core.ledger import BLOCK, DIGEST_SIZE, Ledger, block_start


def sums_per_frame(chunk_bytes: int) -> int:
    """How many block digests one probe answer carries."""
    return max(1, chunk_bytes // DIGEST_SIZE)


def partial_plan(ledger: Ledger | None, offset: int) -> ReadPlan:
    """The bytes needed for our digest at `offset` (none if the ledger knows it)."""
    if ledger is None or offset > ledger.size or ledger.digest_known(offset) is not None:
        return NO_READS
    return ReadPlan(((block_start(offset), offset),))


def digest_at(ledger: Ledger | None, offset: int, snap: Snapshot) -> bytes | None:
    """Our digest of the first `offset` bytes, from the bytes `partial_plan` read (None: past
    our end, or the file shrank under us)."""
    if ledger is None or offset > ledger.size:
        return None
    known = ledger.digest_known(offset)
    if known is not None:
        return known
    partial = snap.get(block_start(offset), offset)
    if len(partial) != offset - block_start(offset):
        return None  # the file shrank under us; the next look says how
    return ledger.digest_at(offset, partial)


def serve_range(r: Request, held: int, window: int) -> tuple[int, int]:
    """The bytes [start, end) a request gets, at most a fetch window of what we hold."""
    start = max(r.start, r.have)
    return start, min(held, start + min(r.length, window))


def serve_read(start: int, end: int, held: int) -> tuple[int, int]:
    """The bytes read to serve [start, end): whole blocks (or up to our end), so that
    every byte sent is checked against the ledger first."""
    return block_start(start), min(held, -(-end // BLOCK) * BLOCK)


def step_end(start: int, end: int, step: int | None) -> int:
    """Where the bytes read for one turn of serving [start, end) end: `step` bytes at most
    (None: the whole range). A window is read, cut and sealed a step at a time, the rest
    asked for again by a Redeliver (serve): so one step of it is alive per peer answered,
    not the read window, its items, its frames and its sealed frames all at once."""
    return end if step is None else min(end, start + step)


def request_plan(ledger: Ledger | None, r: Request, window: int,
                 step: int | None = None) -> ReadPlan:
    """What answering `r` reads: the bytes of our digest at its `have`, and what it gets
    (the first `step` bytes of it: step_end)."""
    if ledger is None:
        return NO_READS
    plan = partial_plan(ledger, r.have)
    start, end = serve_range(r, ledger.size, window)
    if start < end:
        plan = ReadPlan((*plan.ranges, serve_read(start, step_end(start, end, step),
                                                  ledger.size)))
    return plan


def probe_plan(ledger: Ledger, p: Probe) -> ReadPlan:
    """The bytes a BYTES probe is answered with (one block at most)."""
    start = min(p.start, ledger.size)
    return ReadPlan(((start, min(ledger.size, start + min(p.count, BLOCK))),))


def serve(ledger: Ledger, r: Request, snap: Snapshot, peer: str, *, seen: tuple[int, int] | None,
          inode: tuple[int, int] | None, window: int, chunk: int, records: str,
          step: int | None = None) -> list[Effect]:
    """The FILL frames that answer `r`, cut at whole records; or, if the bytes read are not
    the ones we recorded, what finds out why (a look, or a full check) and nothing sent.

    With a `step`, only the pieces within the first `step` bytes (as request_plan read them)
    are sent, and the rest of the range follows as a Redeliver of the same request from the
    next piece on (the last effect): the pieces are cut exactly as a whole window's would
    be, and what the request was charged (daemon/gate.py) is not charged again."""
    start, end = serve_range(r, ledger.size, window)
    if start >= end:
        return []
    first, last = serve_read(start, step_end(start, end, step), ledger.size)
    buf = snap.get(first, last)
    st = snap.stat
    # Unchanged since we last wrote or judged it (size, mtime and inode, as git's index
    # trusts a file): the bytes are the ones we recorded. Otherwise check every block.
    untouched = st is not None and (st.size, st.mtime_ns) == seen
    if (len(buf) != last - first or st is None or st.inode != inode
            or not (untouched or ledger.holds(first, buf))):
        # Shorter, another file, or bytes changed since we recorded them: never vouch
        # for them. The look (or a full check) says what happened.
        if len(buf) == last - first and st is not None and st.inode == inode:
            return [Rehash("check", hold=ledger.size, why="bytes asked for by a peer changed")]
        return [LookAgain()]
    out: list[Effect] = []
    pos = start
    for pos, stop in pieces(records, buf, first, start, end, chunk):
        if min(end, pos + chunk) > last:
            if not out:
                raise ValueError(f"a step of serving is smaller than a chunk ({chunk})")
            break  # the piece needs bytes past those read: the next step reads them
        base = ledger.digest_at(pos, buf[block_start(pos) - first: pos - first])
        out.append(Send(Kind.FILL, Data(pos, base, buf[pos - first: stop - first]), to=peer))
        pos = stop
    if pos < end:
        out.append(Redeliver(PeerRequest(peer, rest_of(r, pos, end))))
    return out


def rest_of(r: Request, pos: int, end: int) -> Request:
    """What is left of `r` once [.., pos) of its range [.., end) was sent."""
    return Request(r.have, r.digest, pos, end - pos, r.force, r.ask)


def answer_probe(ledger: Ledger, p: Probe, snap: Snapshot, sums: int) -> Probed:
    """Our block digests (SUMS) or bytes (BYTES, as `probe_plan` read them) from `p.start`."""
    if p.what is ProbeWhat.SUMS:
        blocks = len(ledger.chain) - 1
        start = min(p.start, blocks)
        count = min(p.count, sums, blocks - start)
        body = b"".join(ledger.chain[start + 1: start + 1 + count])
    else:
        start = min(p.start, ledger.size)
        body = first_read(snap)
    return Probed(p.what, start, ledger.size, body)
