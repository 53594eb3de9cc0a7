"""Manifests (syncd/core/resources/manifest.py): the digest of a whole manifest, and our view of
a peer's kept within its bounds, driven directly, without the machine."""

from __future__ import annotations

import gc
import hashlib
import os
import tracemalloc

from syncd.core.budget import Holdings
from syncd.core.frames import ResEntry
from syncd.core.resources.manifest import (
    ENTRIES_PER_ITEM,
    Entries,
    Part,
    PeerBounds,
    PeerManifest,
    entry_cost,
    entry_hash,
    in_parts,
    manifest_digest,
)


def entry(name: str, data: bytes = b"x", stamp: int = 0, origin: str = "") -> ResEntry:
    return ResEntry(name, len(data), hashlib.sha256(data).digest(), stamp, origin)


Refusals = list[tuple[str, str, int]]


def bounds(limit: int = 1 << 40, max_files: int = 1 << 40) -> tuple[PeerBounds, Refusals]:
    refused: Refusals = []
    return PeerBounds(Holdings(limit), max_files,
                      lambda peer, reason, n: refused.append((peer, reason, n))), refused


def test_the_digest_ignores_order_and_moves_by_one_hash_per_entry() -> None:
    a, b, c = entry("assets/a"), entry("assets/b"), entry("assets/c.json", b"{}", 3, "h")
    assert manifest_digest([a, b, c]) == manifest_digest([c, a, b])
    assert manifest_digest([]) == bytes(32)
    # What the machine keeps up entry by entry: XOR in, XOR out.
    acc = entry_hash(a) ^ entry_hash(b) ^ entry_hash(c) ^ entry_hash(b)
    assert acc.to_bytes(32, "big") == manifest_digest([a, c])
    assert manifest_digest([a]) != manifest_digest([entry("assets/a", b"y")])
    assert manifest_digest([c]) != manifest_digest([entry("assets/c.json", b"{}", 4, "h")])


def test_a_manifest_goes_in_parts_of_entries_per_item() -> None:
    entries = [entry(f"assets/{i}") for i in range(2 * ENTRIES_PER_ITEM + 1)]
    parts = in_parts(entries)
    assert [len(p) for p in parts] == [ENTRIES_PER_ITEM, ENTRIES_PER_ITEM, 1]
    assert [e for p in parts for e in p] == entries
    assert in_parts([]) == []


def test_what_a_view_holds_is_charged_to_the_peer_and_given_back() -> None:
    b, refused = bounds()
    view = PeerManifest()
    small, big = entry("assets/a"), entry("assets/a", b"x" * 10, origin="host-with-a-name")
    assert view.put("p", small, b)
    assert view.held == entry_cost(small) == b.holdings.held["p"]
    assert view.put("p", big, b)  # a new version of the name: only the difference
    assert view.held == entry_cost(big) == b.holdings.held["p"]
    assert view.put("p", small, b)  # smaller again: the difference is given back
    assert view.held == entry_cost(small) == b.holdings.held["p"]
    view.drop("p", "assets/a", b)
    view.drop("p", "assets/a", b)  # twice: nothing more given back
    assert view.held == 0 and "p" not in b.holdings.held and not view.entries
    assert refused == []


def test_a_view_past_its_bounds_is_refused_and_says_why() -> None:
    b, refused = bounds(max_files=1)
    view = PeerManifest()
    assert view.put("p", entry("assets/a"), b)
    assert not view.put("p", entry("assets/b"), b)
    assert view.put("p", entry("assets/a", b"y"), b)  # a name it holds: not a new entry
    assert refused == [("p", "entries", 1)]
    b, refused = bounds(limit=entry_cost(entry("assets/a")))
    view = PeerManifest()
    assert view.put("p", entry("assets/a"), b)
    assert not view.put("p", entry("assets/b"), b)
    assert refused == [("p", "peer_bytes", 1)] and set(view.entries) == {"assets/a"}


def test_parts_are_kept_only_when_asked_and_within_bounds() -> None:
    b, refused = bounds(max_files=ENTRIES_PER_ITEM + 1)  # a whole manifest in 2 parts at most
    view = PeerManifest()
    one = (entry("assets/a"), entry("assets/b"))
    full = tuple(entry(f"assets/{i}") for i in range(ENTRIES_PER_ITEM))
    assert not view.add_part("p", 0, 2, one, b)  # nobody asked
    view.awaiting = True
    assert not view.add_part("p", 0, 3, one, b)  # more parts than max_files entries fill
    assert view.add_part("p", 0, 2, one, b)
    assert view.held == sum(entry_cost(e) for e in one) == b.holdings.held["p"]
    assert view.add_part("p", 0, 2, one, b)  # part 0 again: a new manifest, not twice the cost
    assert view.held == sum(entry_cost(e) for e in one)
    assert not view.add_part("p", 1, 2, full, b)  # 2002 entries in all, over max_files
    assert view.parts == {} and view.held == 0 and "p" not in b.holdings.held
    assert refused == [("p", "unasked", 1), ("p", "parts", 1),
                       ("p", "entries", ENTRIES_PER_ITEM)]
    assert view.add_part("p", 0, 2, one, b) and view.add_part("p", 1, 2, one[:1], b)
    view.drop_parts("p", b)
    assert view.parts == {} and view.parts_of == 0 and view.held == 0


def test_a_view_keeps_entries_packed_and_gives_back_the_same_entries() -> None:
    kept = Entries()
    es = [entry("artifacts/a.log", b"a"), entry("artifacts/é.json", b"b", 7, "a"),
          ResEntry("assets/big", (1 << 63) - 1, bytes(32), 1 << 62, "x"),
          ResEntry("odd", 1 << 70, b"", 0, "")]  # no frame carries it: kept as it is
    for e in es:
        kept[e.name] = e
    assert [kept[e.name] for e in es] == es and len(kept) == 4
    assert "odd" in kept and "other" not in kept and kept.get("other") is None
    kept["artifacts/a.log"] = entry("artifacts/a.log", b"newer", 1, "b")
    assert kept["artifacts/a.log"] == entry("artifacts/a.log", b"newer", 1, "b")
    del kept["odd"]
    assert sorted(kept) == ["artifacts/a.log", "artifacts/é.json", "assets/big"]


def test_a_view_of_hostile_entries_holds_less_than_it_is_charged() -> None:
    """What max_peer_bytes charges for an entry (ENTRY_COST and its name) is at least what
    the view holds for it, with a hostile peer's numbers (docs/peer-limits.md)."""
    n = 5000
    tracemalloc.start()
    try:
        view = Entries()
        charged = 0
        for i in range(n):
            e = ResEntry(f"artifacts/x/{i:06d}", (1 << 63) - 1 - i, os.urandom(32),
                         (1 << 62) + i, "x")
            charged += entry_cost(e)
            view[e.name] = e
        del e
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(view) == n
    assert held < charged


def test_a_part_keeps_its_entries_packed_and_gives_back_the_same_entries() -> None:
    es = [entry("artifacts/a.log", b"a"), entry("artifacts/é.json", b"b", 7, "a"),
          ResEntry("assets/big", (1 << 63) - 1, bytes(32), 1 << 62, "x"),
          ResEntry("odd", 1 << 70, b"", 0, ""),  # no frame carries it: kept as it is
          ResEntry("artifacts/\udcff", 3, bytes(32), 0, "b")]  # not UTF-8 on disk
    part = Part(es)
    assert list(part) == es and len(part) == 5
    assert part.cost == sum(entry_cost(e) for e in es)


def test_parts_of_hostile_entries_hold_less_than_they_are_charged() -> None:
    """A whole manifest's parts, gathered until all have come, cost what their entries are
    charged at most (as ResEntry objects, each held more: docs/peer-limits.md)."""
    es = [ResEntry(f"artifacts/x/{i:06d}", (1 << 63) - 1 - i, os.urandom(32), (1 << 62) + i,
                   "x") for i in range(ENTRIES_PER_ITEM)]
    charged = sum(entry_cost(e) for e in es)
    tracemalloc.start()
    try:
        part = Part(iter(es))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(part) == len(es)
    assert held < charged // 2
