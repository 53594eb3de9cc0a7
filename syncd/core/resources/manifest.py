"""Manifests: what an entry costs (here and on the wire), the digest of a whole manifest, and
our view of each peer's manifest, kept within the bounds that peer is allowed here
(docs/peer-limits.md).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field

from syncd.core.budget import Holdings
from syncd.core.frames import ResEntry

ENTRIES_PER_ITEM = 2000  # entries per RHAVE item: a whole manifest goes in parts this big
# What one manifest entry heard from a peer costs here, in bytes (measured: ~220 besides its
# name, as a ResEntry in a dict; names count twice, for non-ASCII text): charged to the
# peer's Holdings while kept.
ENTRY_COST = 240
ENTRY_WIRE = 110  # bytes of an entry in a manifest sent, besides its name and origin


def entry_cost(e: ResEntry) -> int:
    return ENTRY_COST + 2 * (len(e.name) + len(e.origin))


@dataclass
class PeerBounds:
    """What peers' manifests may hold here (docs/peer-limits.md): `max_files` entries per
    peer's manifest of this instance, within each peer's Holdings; `refuse(peer, reason, n)`
    counts what was refused."""

    holdings: Holdings = field(default_factory=lambda: Holdings(1 << 62))
    max_files: int = 1 << 62
    refuse: Callable[[str, str, int], None] = lambda peer, reason, n: None

    @property
    def max_parts(self) -> int:
        """Parts a whole manifest of at most `max_files` entries is sent in."""
        return max(1, -(-self.max_files // ENTRIES_PER_ITEM))


def entry_hash(e: ResEntry) -> int:
    line = f"{e.name}\0{e.size}\0{e.digest.hex()}\0{e.stamp}\0{e.origin}"
    return int.from_bytes(hashlib.sha256(line.encode("utf-8", "surrogateescape")).digest(),
                          "big")


def manifest_digest(entries: Iterable[ResEntry]) -> bytes:
    """The XOR of the entries' SHA-256: equal manifests, equal digests, and one entry's
    change costs one hash (a sorted hash of the whole manifest cost O(n) per file fetched).
    Peers are authenticated, so nobody crafts colliding manifests."""
    acc = 0
    for e in entries:
        acc ^= entry_hash(e)
    return acc.to_bytes(32, "big")


def wire_size(e: ResEntry) -> int:
    return ENTRY_WIRE + len(e.name.encode("utf-8", "surrogateescape")) + len(e.origin)


def in_parts(entries: list[ResEntry]) -> list[tuple[ResEntry, ...]]:
    return [tuple(entries[i:i + ENTRIES_PER_ITEM])
            for i in range(0, len(entries), ENTRIES_PER_ITEM)]


_PACKED = struct.Struct(">QQB")  # size, stamp, the digest's length; then digest and origin
_U64 = 1 << 64
_NAME = struct.Struct(">H")  # a part's entry: the name's length and the name go first


def _pack(e: ResEntry) -> bytes | ResEntry:
    """One entry but its name in one bytes object; numbers no frame carries: as it is."""
    if not (0 <= e.size < _U64 and 0 <= e.stamp < _U64 and len(e.digest) < 256):
        return e
    return b"".join((_PACKED.pack(e.size, e.stamp, len(e.digest)), e.digest,
                     e.origin.encode("utf-8", "surrogateescape")))


def _unpack(name: str, v: bytes, at: int = 0) -> ResEntry:
    """The entry `_pack` put at `v[at:]`."""
    size, stamp, n = _PACKED.unpack_from(v, at)
    at += _PACKED.size
    return ResEntry(name, size, v[at : at + n], stamp,
                    v[at + n :].decode("utf-8", "surrogateescape"))


class Part:
    """One part of a whole manifest being received: its entries packed one bytes object
    each (name included), and what they are charged. As ResEntry objects, with the digest,
    two large ints and the name apart, each held more than it is charged (ENTRY_COST):
    five objects instead of one (docs/peer-limits.md)."""

    __slots__ = ("_packed", "cost")

    def __init__(self, entries: Iterable[ResEntry]) -> None:
        packed: list[bytes | ResEntry] = []
        cost = 0
        for e in entries:
            cost += entry_cost(e)
            name = e.name.encode("utf-8", "surrogateescape")
            v = _pack(e)
            packed.append(b"".join((_NAME.pack(len(name)), name, v))
                          if isinstance(v, bytes) and len(name) < 1 << 16 else e)
        self._packed = tuple(packed)
        self.cost = cost

    def __len__(self) -> int:
        return len(self._packed)

    def __iter__(self) -> Iterator[ResEntry]:
        at = _NAME.size
        for v in self._packed:
            if isinstance(v, ResEntry):
                yield v
                continue
            (m,) = _NAME.unpack_from(v)
            yield _unpack(v[at : at + m].decode("utf-8", "surrogateescape"), v, at + m)


class Entries(MutableMapping[str, ResEntry]):
    """Name -> entry, each entry kept packed in one bytes object (size, stamp, digest and
    origin) and made again when read. A view of a peer's manifest holds up to that peer's
    `max_peer_bytes` of entries: as ResEntry objects, with their digest and two large ints
    apart, an entry took about 300 bytes besides its name, more than ENTRY_COST charges
    (18.6 MB held for 16 MiB charged in the hostile long mode); packed, about 140, so what
    is held stays below what is charged (docs/peer-limits.md)."""

    __slots__ = ("_packed",)

    def __init__(self) -> None:
        self._packed: dict[str, bytes | ResEntry] = {}

    def __getitem__(self, name: str) -> ResEntry:
        v = self._packed[name]
        return v if isinstance(v, ResEntry) else _unpack(name, v)

    def __setitem__(self, name: str, e: ResEntry) -> None:
        if e.name != name:
            raise ValueError("an entry is kept under its own name")
        self._packed[name] = _pack(e)

    def __delitem__(self, name: str) -> None:
        del self._packed[name]

    def __contains__(self, name: object) -> bool:
        return name in self._packed

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


@dataclass
class PeerManifest:
    """What we heard of one peer's manifest of this instance, and where asking it for its
    whole manifest stands. The entries and parts kept are charged to the peer's Holdings."""

    entries: Entries = field(default_factory=Entries)
    online: bool = False
    heard: bytes | None = None  # its last summary
    asked: bytes | None = None  # the summary we last asked its manifest for
    asked_at: float = -1e18
    answered: bytes | None = None  # the summary a whole manifest came for
    # Parts of a whole manifest being received (part number -> entries): complete, it
    # replaces `entries`, so a file the peer no longer holds leaves our view of it.
    parts: dict[int, Part] = field(default_factory=dict)
    parts_of: int = 0  # how many parts that manifest has
    awaiting: bool = False  # we asked for its whole manifest and it has not come whole yet
    revisit: bool = False  # it came online: its names are looked at again (PRESENCE_PASS)
    revisited_at: float = -1e18
    held: int = 0  # bytes of entries and parts taken from the peer's Holdings

    def put(self, peer: str, e: ResEntry, bounds: PeerBounds) -> bool:
        """Keep `e` in our view of `peer`'s manifest, if its bounds allow."""
        old = self.entries.get(e.name)
        if old is None and len(self.entries) >= bounds.max_files:
            bounds.refuse(peer, "entries", 1)
            return False
        cost = entry_cost(e) - (entry_cost(old) if old is not None else 0)
        if cost > 0 and not bounds.holdings.take(peer, cost):
            bounds.refuse(peer, "peer_bytes", 1)
            return False
        if cost < 0:
            bounds.holdings.give(peer, -cost)
        self.entries[e.name] = e
        self.held += cost
        return True

    def drop(self, peer: str, name: str, bounds: PeerBounds) -> None:
        old = self.entries.pop(name, None)
        if old is not None:
            cost = entry_cost(old)
            bounds.holdings.give(peer, cost)
            self.held -= cost

    def drop_parts(self, peer: str, bounds: PeerBounds) -> None:
        cost = sum(part.cost for part in self.parts.values())
        bounds.holdings.give(peer, cost)
        self.held -= cost
        self.parts = {}
        self.parts_of = 0

    def add_part(self, peer: str, part: int, parts: int, entries: tuple[ResEntry, ...],
                 bounds: PeerBounds) -> bool:
        """Keep one part of a whole manifest until all have come, within the bounds."""
        if not self.awaiting:
            # Nobody asked: a whole manifest answers our RLIST only (a late second answer
            # to a repeated one is dropped too, harmlessly).
            bounds.refuse(peer, "unasked", 1)
            return False
        if parts > bounds.max_parts:
            # More parts than a manifest of max_files entries is sent in: none is kept (the
            # issue's 2**62 parts, part 0 never sent, held every other one for good).
            bounds.refuse(peer, "parts", 1)
            return False
        if part == 0 or parts != self.parts_of:
            self.drop_parts(peer, bounds)  # a new manifest: what was gathered is stale
            self.parts_of = parts
        if part in self.parts:
            cost = self.parts.pop(part).cost
            bounds.holdings.give(peer, cost)
            self.held -= cost
        if sum(len(p) for p in self.parts.values()) + len(entries) > bounds.max_files:
            bounds.refuse(peer, "entries", len(entries))
            self.drop_parts(peer, bounds)
            return False
        kept = Part(entries)
        if not bounds.holdings.take(peer, kept.cost):
            bounds.refuse(peer, "peer_bytes", len(entries))
            self.drop_parts(peer, bounds)
            return False
        self.parts[part] = kept
        self.held += kept.cost
        return True
