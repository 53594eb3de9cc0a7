"""The reconcile rule, stated once: the longer tail wins, and the shared prefix must agree.

Every decision syncd takes about bytes lives here, as pure functions of positions and digests.
They never ask where bytes came from (the local writer or a peer) and never touch files,
sockets or clocks: the caller reads what a decision needs and carries out what it returns.

Theory of operation
-------------------
A host's copy is described by a Position (size, digest of that prefix). Two positions are
*consistent* when the shorter is a prefix of the longer, which we check by comparing the
longer host's digest of its prefix at the shorter size with the shorter host's digest.
- Data for [offset, end) is appended only when offset equals our size and the sender's digest
  of its prefix at offset equals ours (fast-forward only).
- Data that starts below our size is a duplicate (or an overlap) and is ignored: our position
  announcement makes the sender, or anyone, send what we still lack.
- Data that starts past our size is a gap: we ask for the range.
- Any digest mismatch at equal offsets is a divergence: nothing is written, and nothing more
  moves between the two hosts for that file (each keeps replicating with the others).
"""

from __future__ import annotations

from enum import Enum

from syncd.core.ledger import BLOCK, Position, block_start


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    GAP = "gap"
    DIVERGED = "diverged"


def judge_data(local: Position, offset: int, base: bytes) -> Verdict:
    """What to do with bytes that start at `offset` after a prefix with digest `base`."""
    if offset == local.size:
        return Verdict.APPEND if base == local.digest else Verdict.DIVERGED
    if offset < local.size:
        return Verdict.DUPLICATE
    return Verdict.GAP


class PeerState(Enum):
    """A peer's copy as seen from here."""

    IN_SYNC = "in_sync"
    AHEAD = "ahead"  # the peer holds more; consistency is checked when it answers a request
    BEHIND = "behind"  # the peer holds a prefix of our copy
    DIVERGED = "diverged"


def judge_peer(local: Position, peer: Position, ours_at_peer_size: bytes | None) -> PeerState:
    """Compare a peer's announced position with ours.

    `ours_at_peer_size` is our digest of the prefix of length peer.size; it is needed (and
    only computable) when peer.size <= local.size.
    """
    if peer.size > local.size:
        return PeerState.AHEAD
    if ours_at_peer_size is None:
        raise ValueError("our digest at the peer's size is needed when the peer is not ahead")
    if ours_at_peer_size != peer.digest:
        return PeerState.DIVERGED
    return PeerState.IN_SYNC if peer.size == local.size else PeerState.BEHIND


def judge_request(local_size: int, have: int, theirs: bytes, ours_at_have: bytes | None) -> Verdict:
    """Whether to answer a request from a host that holds `have` bytes with digest `theirs`.

    APPEND means: send it what we hold past `have`. DUPLICATE: we hold nothing it lacks.
    """
    if have >= local_size:
        if have == local_size and ours_at_have is not None and ours_at_have != theirs:
            return Verdict.DIVERGED
        return Verdict.DUPLICATE
    if ours_at_have is None:
        raise ValueError("our digest at the requester's size is needed")
    return Verdict.APPEND if ours_at_have == theirs else Verdict.DIVERGED


def choose_source(local_size: int, peers: dict[str, tuple[int, bool]]) -> str | None:
    """The peer to fetch missing bytes from: the one holding the most, among usable ones.

    `peers` maps node -> (announced size, usable); usable means online, not frozen and not
    diverged from us. Ties go to the lowest node id, so the choice is stable.
    """
    best: tuple[int, str] | None = None
    for node, (size, usable) in sorted(peers.items()):
        if usable and size > local_size and (best is None or size > best[0]):
            best = (size, node)
    return best[1] if best else None


class LocalChange(Enum):
    """What a fresh look at the local file says happened to the history we recorded."""

    NONE = "none"
    GROWTH = "growth"  # more bytes than we hold (maybe only a torn line)
    TOUCHED = "touched"  # same size, new mtime: possibly an in-place edit, check every byte
    EDITED = "edited"  # the bytes just below our end are no longer the ones we recorded
    SHRUNK = "shrunk"  # fewer bytes than we hold: a truncation, or an edit that shortened it
    REPLACED = "replaced"  # deleted, or another file (inode) under the same name


def judge_local(
    held: int,
    known_inode: tuple[int, int] | None,
    seen: tuple[int, int] | None,
    now: tuple[int, int, int, int] | None,
    tail_intact: bool | None,
) -> LocalChange:
    """Is the history we recorded (`held` bytes) still a prefix of the file? The one answer,
    used for the writer's looks, before applying a peer's bytes, and at start-up.

    known_inode: (dev, ino) our ledger describes, or None when no file was ever seen.
    seen: (size, mtime_ns) at the previous look. now: (dev, ino, size, mtime_ns), or None if
    the file is missing. tail_intact: whether the bytes just below `held` (see
    Ledger.recheck_start) still equal what we recorded; None when they were not read.
    """
    if now is None:
        return LocalChange.REPLACED if held > 0 else LocalChange.NONE
    dev, ino, size, mtime = now
    if known_inode is not None and (dev, ino) != known_inode and held > 0:
        return LocalChange.REPLACED
    if size < held:
        return LocalChange.SHRUNK
    if tail_intact is False:
        return LocalChange.EDITED
    if size > held and (seen is None or (size, mtime) != seen):
        return LocalChange.GROWTH
    if seen is not None and (size, mtime) != seen:
        return LocalChange.TOUCHED
    return LocalChange.NONE


def file_state(frozen: str | None, verifying: bool, peers: list[PeerState],
               trouble: str | None = None, diverged: bool = False) -> str:
    """One word for status: verifying, a freeze reason, a trouble (paused, error), diverged,
    behind, ahead, in_sync, alone. Never in_sync while something we need keeps failing.

    `diverged`: our copy differs from some peer's (even one that has not announced this file
    since): the file replicates on with the others, and the word says a fork is in view."""
    if verifying:
        return "verifying"
    if frozen is not None:
        return frozen
    if trouble is not None:
        return trouble
    if diverged or PeerState.DIVERGED in peers:
        return "diverged"
    if PeerState.AHEAD in peers:
        return "behind"
    if PeerState.BEHIND in peers:
        return "ahead"
    if not peers:
        return "alone"
    return "in_sync"


def first_differing_block(ours: list[bytes], theirs: list[bytes], start: int) -> int | None:
    """The block whose chain value differs first, comparing theirs[j] with ours[start + 1 + j].

    `ours` is a full chain (ours[0] is the empty chain); `theirs` holds a peer's chain values
    for blocks start, start + 1, ... Chains, once different, stay different, so the first
    mismatch names the first block whose bytes differ. None if all compared values agree.
    """
    for j, value in enumerate(theirs):
        i = start + 1 + j
        if i >= len(ours):
            return None
        if ours[i] != value:
            return start + j
    return None


def first_differing_byte(ours: bytes, theirs: bytes) -> int | None:
    """Index of the first differing byte; None if one is a prefix of the other."""
    n = min(len(ours), len(theirs))
    lo = 0
    # Halve the range on equal halves: each comparison is a C-speed memcmp.
    while n - lo > 64:
        mid = (lo + n) // 2
        if ours[lo:mid] == theirs[lo:mid]:
            lo = mid
        else:
            n = mid
    for i in range(lo, n):
        if ours[i] != theirs[i]:
            return i
    return None


def first_change(old_chain: list[bytes], old_tail: bytes | None, old_size: int,
                 fresh_chain: list[bytes], fresh_tail: bytes, fresh_size: int) -> int:
    """Where two versions of a file first differ: the byte, when the old partial block is
    known (`old_tail`) and both versions end in the same block; else the start of the first
    differing block."""
    n = min(len(old_chain), len(fresh_chain))
    for i in range(1, n):
        if old_chain[i] != fresh_chain[i]:
            return (i - 1) * BLOCK
    start = block_start(min(old_size, fresh_size))
    if old_tail is not None and block_start(old_size) == block_start(fresh_size):
        at = first_differing_byte(old_tail, fresh_tail)
        return start + (at if at is not None else min(len(old_tail), len(fresh_tail)))
    return start
