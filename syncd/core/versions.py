"""Which wire version each frame goes out in, so that a cluster upgrades one host at a time.

A host announces in its (signed) presence the versions it speaks, SPEAKS; a presence without
the field is a release that speaks version 5 only. A frame for one host goes out in the
highest version both speak; a frame for everyone (P/a, retained positions P/p) in the highest
that every listed peer online speaks, so that nobody online is left unable to read it. Each
release speaks the version before its own too, for one release (docs/protocol.md,
Compatibility): 5 is the signed clear format, 6 the sealed one (sealed.py).
"""

from __future__ import annotations

from collections.abc import Iterable

SIGNED = 5  # frames.py: Ed25519-signed, in clear
SEALED = 6  # sealed.py: encrypted to each listed recipient, authenticated per pair
SPEAKS: tuple[int, ...] = (SIGNED, SEALED)
LEGACY: tuple[int, ...] = (SIGNED,)  # what a presence without `speaks` means


def spoken(announced: Iterable[int]) -> tuple[int, ...]:
    """What a peer's presence says it speaks (its `speaks`; empty: a version-5 release)."""
    versions = tuple(sorted(set(announced)))
    return versions or LEGACY


def common(theirs: Iterable[int], ours: Iterable[int] = SPEAKS) -> int | None:
    """The highest version both ends speak; None: none (the peer is too old or too new)."""
    both = set(theirs) & set(ours)
    return max(both) if both else None


def for_everyone(peers: Iterable[Iterable[int]], ours: Iterable[int] = SPEAKS) -> int:
    """The version of a frame every one of `peers` (what each speaks) can read: the lowest of
    the pairwise highest; our highest with nobody to read it. A peer sharing no version with
    us is left out: it cannot read any frame of ours anyway."""
    best = max(ours)
    for theirs in peers:
        v = common(theirs, ours)
        if v is not None:
            best = min(best, v)
    return best
