"""The pure resource machine (syncd/core/resources/): scripted events in, expected effects out."""

from __future__ import annotations

import hashlib

from syncd.core import frames
from syncd.core.budget import Holdings
from syncd.core.frames import Kind, ResEntry
from syncd.core.resources import (
    BACKOFF,
    ENTRY_WIRE,
    PRESENCE_PASS,
    REFUSED_SHOWN,
    Compare,
    Compared,
    Conflict,
    Discard,
    Effect,
    FileKind,
    Install,
    Installed,
    InstallFailed,
    LocalFile,
    LocalGone,
    PeerBounds,
    PeerItem,
    PeerPresence,
    Refused,
    ResourceMachine,
    Rules,
    Send,
    Serve,
    Tick,
    Write,
    entry_cost,
)


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def machine(node: str = "b", writers: frozenset[str] | None = None, **kw: int) -> ResourceMachine:
    m = ResourceMachine(node, Rules(max_file_bytes=kw.pop("max_file_bytes", 32 << 20)), writers,
                        chunk_bytes=4, window=8, timeout=3.0)
    m.handle(PeerPresence("a", True), 0)
    return m


def have(m: ResourceMachine, *entries: ResEntry, peer: str = "a", now: float = 1) -> list[Effect]:
    return m.handle(PeerItem(peer, frames.res_have(False, entries)), now)


def sends(effects: list[Effect], kind: Kind) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and e.kind is kind]


BLOB = "artifacts/shake/shake-1.log"
SIDE = BLOB + ".json"


def test_rules_classify_the_ishiki_layout() -> None:
    r = Rules()
    assert r.kind(BLOB) is FileKind.ONCE
    assert r.kind(SIDE) is FileKind.REPLACED
    assert r.kind("artifacts/shake/shake-1.log.view") is FileKind.REPLACED
    assert r.kind("assets/0190f9f3") is FileKind.ONCE
    assert r.kind("assets/0190f9f3.json") is FileKind.REPLACED
    assert r.kind("artifacts/shake/.shake-1.log.5f1c.tmp") is None  # the writer's temp
    assert r.kind("artifacts/shake/shake-1.log.json.5f1c.tmp") is None
    assert r.kind("artifacts/shake/.shake-1.log.syncd.tmp") is None  # ours
    assert r.kind("other/x") is None
    assert r.kind("../x") is None
    custom = Rules(include=("assets/**",), exclude=("*.png",))
    assert custom.kind(BLOB) is None
    assert custom.kind("assets/a.png") is None
    assert custom.kind("assets/a.jpg") is FileKind.ONCE
    # The temp patterns hold whatever the config says.
    assert Rules(exclude=()).kind("assets/x.tmp") is None


def test_a_missing_blob_is_fetched_in_windows_of_chunks_and_installed_without_overwrite() -> None:
    m = machine()
    data = b"0123456789ab"
    entry = ResEntry(BLOB, len(data), sha(data))
    fx = have(m, entry)
    assert sends(fx, Kind.RREQ) == [Send(Kind.RREQ, frames.ResAsk(BLOB, sha(data), 0, 8), "a")]
    fx = m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 0, data[:4])), 2)
    assert fx == [Write(BLOB, 0, data[:4], True)]
    # A duplicate or an out-of-order chunk changes nothing.
    assert m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 0, data[:4])), 2) == []
    assert m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 8, data[8:])), 2) == []
    fx = m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 4, data[4:8])), 2)
    assert fx == [Write(BLOB, 4, data[4:8], False),
                  Send(Kind.RREQ, frames.ResAsk(BLOB, sha(data), 8, 4), "a")]
    fx = m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 8, data[8:])), 2)
    assert fx == [Write(BLOB, 8, data[8:], False), Install(entry, None)]
    fx = m.handle(Installed(entry), 3)
    assert m.local[BLOB] == entry
    assert sends(fx, Kind.RHAVE)[0].payload == frames.res_have(False, (entry,))


def test_a_stalled_transfer_resumes_from_the_last_byte_from_another_holder() -> None:
    m = machine()
    m.handle(PeerPresence("c", True), 0)
    data = b"0123456789ab"
    entry = ResEntry(BLOB, len(data), sha(data))
    have(m, entry)
    have(m, entry, peer="c")
    m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 0, data[:4])), 2)
    m.handle(PeerPresence("a", False), 3)
    fx = m.handle(Tick(), 10)
    assert sends(fx, Kind.RREQ) == [Send(Kind.RREQ, frames.ResAsk(BLOB, sha(data), 4, 8), "c")]
    fx = m.handle(PeerItem("c", frames.ResChunk(BLOB, sha(data), 12, 4, data[4:8])), 11)
    assert fx[0] == Write(BLOB, 4, data[4:8], False)


def test_a_write_once_name_with_other_bytes_is_compared_never_fetched_and_shown() -> None:
    m = machine()
    ours, theirs = b"same-AAAA", b"same-BBBB"
    m.handle(LocalFile(BLOB, len(ours), sha(ours)), 0)
    fx = have(m, ResEntry(BLOB, len(theirs), sha(theirs)))
    assert not [e for e in fx if isinstance(e, Write | Install)]
    assert sends(fx, Kind.RREQ) == [Send(Kind.RREQ, frames.ResAsk(BLOB, sha(theirs), 0, 8), "a")]
    assert m.frozen(BLOB)
    fx = m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(theirs), 9, 0, theirs[:4])), 2)
    assert fx == [Compare(BLOB, sha(theirs), 0, theirs[:4])]
    assert m.handle(Compared(BLOB, sha(theirs), 4, None), 2) == []
    fx = m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(theirs), 9, 4, theirs[4:8])), 2)
    fx = m.handle(Compared(BLOB, sha(theirs), 8, 5), 2)
    assert next(e for e in fx if isinstance(e, Conflict)).offset == 5
    [c] = m.conflicts()
    assert (c.name, c.peer, c.offset) == (BLOB, "a", 5)
    assert m.status()["conflicts"] == [c.to_json()]
    # Nothing more is asked for it; a Tick starts nothing either.
    assert not sends(m.handle(Tick(), 100), Kind.RREQ)
    # A prefix of the other: the first difference is the shorter one's end.
    m2 = machine()
    m2.handle(LocalFile(BLOB, 3, sha(b"abc")), 0)
    fx = have(m2, ResEntry(BLOB, 0, sha(b"")))
    assert next(e for e in fx if isinstance(e, Conflict)).offset == 0


def test_peers_that_disagree_about_a_name_we_lack_give_no_winner() -> None:
    m = machine()
    m.handle(PeerPresence("c", True), 0)
    have(m, ResEntry(BLOB, 1, sha(b"x")))
    m.transfers.clear()
    fx = have(m, ResEntry(BLOB, 1, sha(b"y")), peer="c")
    assert not sends(fx, Kind.RREQ)
    assert not sends(m.handle(Tick(), 50), Kind.RREQ)


def test_serving_answers_only_for_the_bytes_held() -> None:
    m = machine()
    m.handle(LocalFile(BLOB, 10, sha(b"0123456789")), 0)
    fx = m.handle(PeerItem("a", frames.ResAsk(BLOB, sha(b"0123456789"), 4, 100)), 1)
    assert fx == [Serve("a", BLOB, sha(b"0123456789"), 10, 4, 6)]
    fx = m.handle(PeerItem("a", frames.ResAsk(BLOB, sha(b"other"), 0, 100)), 1)
    assert fx == [Send(Kind.RREFUSE, frames.ResRefuse(BLOB, sha(b"other"), sha(b"0123456789"),
                                                      "other bytes held here"), "a")]
    fx = m.handle(PeerItem("a", frames.ResAsk(SIDE, sha(b"x"), 0, 1)), 1)
    assert fx[0] == Send(Kind.RREFUSE, frames.ResRefuse(SIDE, sha(b"x"), None, "not held here"),
                         "a")


def test_the_highest_sidecar_version_wins_and_equal_bytes_only_move_the_number() -> None:
    m = machine()
    m.handle(LocalFile(SIDE, 2, sha(b"v1")), 0)
    assert m.local[SIDE] == ResEntry(SIDE, 2, sha(b"v1"), 1, "b")
    # An older version from a peer changes nothing.
    assert not sends(have(m, ResEntry(SIDE, 2, sha(b"v0"), 0, "a")), Kind.RREQ)
    newer = ResEntry(SIDE, 2, sha(b"v2"), 2, "a")
    fx = have(m, newer)
    assert sends(fx, Kind.RREQ)[0].payload == frames.ResAsk(SIDE, sha(b"v2"), 0, 2)
    fx = m.handle(PeerItem("a", frames.ResChunk(SIDE, sha(b"v2"), 2, 0, b"v2")), 2)
    assert fx[-1] == Install(newer, ResEntry(SIDE, 2, sha(b"v1"), 1, "b"))
    m.handle(Installed(newer), 3)
    # The next local write numbers itself above every version known.
    m.handle(LocalFile(SIDE, 2, sha(b"v3")), 4)
    assert m.local[SIDE].stamp == 3
    # Same bytes, higher number: no transfer.
    fx = have(m, ResEntry(SIDE, 2, sha(b"v3"), 7, "a"))
    assert not sends(fx, Kind.RREQ)
    assert m.local[SIDE] == ResEntry(SIDE, 2, sha(b"v3"), 7, "a")


def test_a_sidecar_from_a_host_that_is_not_a_writer_never_counts() -> None:
    m = machine(node="b", writers=frozenset({"a"}))
    m.handle(PeerPresence("c", True), 0)
    assert not sends(have(m, ResEntry(SIDE, 1, sha(b"c"), 99, "c"), peer="c"), Kind.RREQ)
    # Our own rewrite (b is no writer) loses to the writer's next version.
    m.handle(LocalFile(SIDE, 1, sha(b"b")), 1)
    fx = have(m, ResEntry(SIDE, 1, sha(b"a"), 1, "a"))
    assert sends(fx, Kind.RREQ)


def test_a_local_write_during_a_fetch_wins_and_discards_the_temp_file() -> None:
    m = machine()
    have(m, ResEntry(BLOB, 8, sha(b"12345678")))
    fx = m.handle(LocalFile(BLOB, 8, sha(b"12345678")), 1)
    assert Discard(BLOB) in fx and not m.transfers
    fx = m.handle(InstallFailed(BLOB, "a file took this name"), 2)
    assert fx == []


def test_too_big_files_are_refused_once_and_named() -> None:
    m = machine(max_file_bytes=10)
    fx = have(m, ResEntry(BLOB, 11, sha(b"x")))
    assert fx.count(Refused(BLOB, "11 bytes, over max_file_bytes (10)")) == 1
    assert not sends(fx, Kind.RREQ)
    assert not [e for e in have(m, ResEntry(BLOB, 11, sha(b"x"))) if isinstance(e, Refused)]
    fx = m.handle(LocalFile(SIDE, 50, b""), 1)
    assert Refused(SIDE, "50 bytes, over max_file_bytes (10)") in fx
    assert SIDE not in m.local


def test_summaries_ask_for_a_manifest_once_and_deleted_files_come_back() -> None:
    m = machine()
    fx = m.handle(PeerItem("a", frames.ResSum(sha(b"m1"), 3)), 1)
    assert fx == [Send(Kind.RLIST, frames.ResList(sha(b"m1")), "a"),
                  Send(Kind.RSUM, frames.ResSum(m.digest, 0))]  # ours in return
    assert m.handle(PeerItem("a", frames.ResSum(sha(b"m1"), 3)), 1.5) == []
    m.handle(PeerItem("a", frames.ResHave(True, (), b"[]")), 2)
    assert m.handle(PeerItem("a", frames.ResSum(sha(b"m1"), 3)), 9) == []  # answered
    # A list request is answered with the whole manifest.
    m.handle(LocalFile(BLOB, 1, sha(b"x")), 3)
    fx = m.handle(PeerItem("a", frames.ResList(sha(b"?"))), 4)
    assert fx == [Send(Kind.RHAVE, frames.res_have(True, (ResEntry(BLOB, 1, sha(b"x")),)),
                       "a")]
    # Deleted here while a peer holds it: fetched back (deletions do not travel).
    have(m, ResEntry(BLOB, 1, sha(b"x")))
    fx = m.handle(LocalGone(BLOB), 5)
    assert sends(fx, Kind.RREQ)


def test_missing_names_the_files_references_need() -> None:
    m = machine()
    have(m, ResEntry("assets/i1", 1, sha(b"i")))
    m.transfers.clear()
    m.handle(LocalFile("artifacts/t/x", 1, sha(b"x")), 1)
    missing, unheld = m.missing(["artifact://t/x", "asset://i1", "asset://i2"])
    assert missing == ["artifacts/t/x.json", "assets/i1"]
    assert unheld == ["assets/i1.json", "assets/i2", "assets/i2.json"]


def test_when_disagreeing_peers_agree_again_the_name_is_fetched() -> None:
    m = machine()
    m.handle(PeerPresence("c", True), 0)
    have(m, ResEntry(BLOB, 1, sha(b"x")))
    have(m, ResEntry(BLOB, 1, sha(b"y")), peer="c")
    m.transfers.clear()
    m.handle(PeerItem("c", frames.ResSum(sha(b"c's"), 0)), 4)  # we ask for its manifest
    # c's whole manifest no longer holds it (moved away there): a's copy is fetched.
    fx = m.handle(PeerItem("c", frames.res_have(True, (), 0, 1)), 5)
    assert sends(fx, Kind.RREQ) == [Send(Kind.RREQ, frames.ResAsk(BLOB, sha(b"x"), 0, 1), "a")]


def test_small_files_are_fetched_together_big_ones_one_at_a_time() -> None:
    m = machine()  # window 8 bytes
    small = [ResEntry(f"assets/s{i}", 2, sha(b"%d" % i)) for i in range(3)]
    fx = have(m, *small)
    assert len(sends(fx, Kind.RREQ)) == 3  # 2 + 2 + 2 bytes fit in one window
    m2 = machine()
    big = [ResEntry(f"assets/b{i}", 100, sha(b"%d" % i)) for i in range(3)]
    fx = have(m2, *big)
    assert len(sends(fx, Kind.RREQ)) == 1
    assert m2.waiting == {"assets/b1", "assets/b2"}


# --- bounds (issue #23 case 2, docs/peer-limits.md) ---------------------------------------------

def bounded(max_files: int = 100, held: int = 1 << 30) -> tuple[ResourceMachine, Holdings,
                                                                 list[tuple[str, str, int]]]:
    refused: list[tuple[str, str, int]] = []
    holdings = Holdings(held)
    m = ResourceMachine("b", Rules(), None, chunk_bytes=4, window=8, timeout=3.0,
                        bounds=PeerBounds(holdings, max_files,
                                          lambda p, r, n: refused.append((p, r, n))))
    m.handle(PeerPresence("a", True), 0)
    return m, holdings, refused


def entries(n: int, prefix: str = "x") -> tuple[ResEntry, ...]:
    return tuple(ResEntry(f"artifacts/{prefix}/{i}", 1, sha(b"%d" % i)) for i in range(n))


def asked(m: ResourceMachine, peer: str = "a", now: float = 1) -> None:
    """We hear a summary we were not answered for: we ask for the whole manifest."""
    fx = m.handle(PeerItem(peer, frames.ResSum(sha(b"its %f" % now), 9)), now)
    assert sends(fx, Kind.RLIST)


def test_a_whole_manifest_in_more_parts_than_max_files_allows_keeps_nothing() -> None:
    m, holdings, refused = bounded(max_files=4000)  # two parts of 2000 at most
    m.handle(PeerItem("a", frames.res_have(True, entries(10, "p"), 1, 2)), 1)
    assert refused == [("a", "unasked", 1)]  # nobody asked for it: nothing kept
    refused.clear()
    asked(m)
    for part in range(1, 50):  # the issue: 2**62 parts, part 0 never sent
        m.handle(PeerItem("a", frames.res_have(True, entries(10, f"p{part}"), part, 2**62)), 1)
    assert m.peers["a"].parts == {} and holdings.held == {}
    assert refused == [("a", "parts", 1)] * 49


def test_parts_of_a_manifest_are_held_until_whole_then_given_back() -> None:
    m, holdings, refused = bounded(max_files=4000)
    asked(m)
    m.handle(PeerItem("a", frames.res_have(True, entries(3, "one"), 1, 2)), 1)
    held = holdings.held["a"]
    assert held == sum(entry_cost(e) for e in entries(3, "one"))
    m.handle(PeerItem("a", frames.res_have(True, entries(3, "one"), 1, 2)), 1)  # again
    assert holdings.held["a"] == held  # replaced, not added
    m.handle(PeerItem("a", frames.res_have(True, entries(2, "zero"), 0, 2)), 1)  # starts anew
    assert set(m.peers["a"].parts) == {0}
    m.handle(PeerItem("a", frames.res_have(True, entries(3, "one"), 1, 2)), 1)
    view = m.peers["a"]
    assert view.parts == {} and len(view.entries) == 5
    assert holdings.held["a"] == sum(entry_cost(e) for e in view.entries.values()) == view.held
    asked(m, now=5)
    m.handle(PeerItem("a", frames.res_have(True, entries(1, "zero"), 0, 1)), 5)  # shrinks
    assert len(view.entries) == 1 and holdings.held["a"] == view.held
    assert not refused


def test_a_peers_manifest_holds_at_most_max_files_and_max_peer_bytes() -> None:
    m, holdings, refused = bounded(max_files=10)
    m.handle(PeerItem("a", frames.res_have(False, entries(25))), 1)
    assert len(m.peers["a"].entries) == 10 and ("a", "entries", 1) in refused
    small, holdings, refused = bounded(held=5 * entry_cost(entries(1)[0]))
    small.handle(PeerItem("a", frames.res_have(False, entries(8))), 1)
    assert len(small.peers["a"].entries) == 5
    assert refused.count(("a", "peer_bytes", 1)) == 3
    small.forget_peer("a")  # [peers] no longer lists it: its account is emptied
    assert holdings.held == {} and "a" not in small.peers


def test_a_request_is_answered_with_one_window_at_most() -> None:
    m, _, _ = bounded()
    data = b"0123456789abcdefghij"
    m.handle(LocalFile(BLOB, len(data), sha(data)), 1)
    fx = m.handle(PeerItem("a", frames.ResAsk(BLOB, sha(data), 2, 1 << 40)), 2)
    assert [e for e in fx if isinstance(e, Serve)] == [Serve("a", BLOB, sha(data), 20, 2, 8)]
    assert m.manifest_bytes == ENTRY_WIRE + len(BLOB)
    m.handle(LocalGone(BLOB), 3)
    assert m.manifest_bytes == 0


def test_refusals_of_too_big_files_are_named_for_a_hundred_then_counted() -> None:
    m = machine(max_file_bytes=10)
    for i in range(150):
        have(m, ResEntry(f"artifacts/big/{i}", 11, sha(b"%d" % i)))
    assert len(m.refused) == REFUSED_SHOWN and m.refused_more == 50


def test_a_peers_name_deeper_than_max_depth_is_ignored() -> None:
    """#23: no peer's name makes us create a tree deeper than our own scans go."""
    r = Rules(max_depth=3)
    assert r.kind("artifacts/a/b/c") is FileKind.ONCE  # three directories down
    assert r.kind("artifacts/a/b/c/d") is None
    m = machine()
    fx = have(m, ResEntry("artifacts/" + "d/" * 40 + "f", 1, sha(b"x")))
    assert not sends(fx, Kind.RREQ) and not m.peers["a"].entries


def test_a_presence_storm_costs_one_paced_pass_over_the_peers_names() -> None:
    # A listed host that flips online/offline hundreds of times (each flip well signed, with
    # a new connection counter) made every instance send a summary and reconsider every name
    # at each flip, on the event loop (the hostile long mode's 20 s stalls). Now a flip does
    # nothing at once; the next Tick looks at that peer's names, once per PRESENCE_PASS.
    m = machine()
    m.handle(PeerPresence("x", False), 0)
    names = [f"artifacts/x/{i}" for i in range(200)]
    have(m, *(ResEntry(n, 4, sha(n.encode()), 0, "") for n in names), peer="x")
    m.handle(Tick(), 1)
    flips = []
    for i in range(501):  # ends online
        flips += m.handle(PeerPresence("x", i % 2 == 0), 1 + i / 1000)
    assert flips == []  # no summary, no request, no pass per flip
    assert m.due(2)
    first = m.handle(Tick(), 2)
    assert len(sends(first, Kind.RSUM)) == 1
    assert len(sends(first, Kind.RREQ)) == 2  # the window's worth of 4-byte files (8 bytes)
    for i in range(500):  # ends online
        m.handle(PeerPresence("x", i % 2 == 1), 2 + i / 1000)
    assert not sends(m.handle(Tick(), 3), Kind.RSUM)  # within PRESENCE_PASS: no second pass
    assert sends(m.handle(Tick(), 2 + PRESENCE_PASS), Kind.RSUM)  # then one, for all flips


def test_a_holder_that_never_answers_is_asked_less_and_less_often() -> None:
    # x announced a file and sends nothing: asking again every `timeout` (3 s) for each of 64
    # transfers of each of hundreds of instances was a flood of requests from the victim.
    m = machine()
    data = b"0123456789ab"
    entry = ResEntry(BLOB, len(data), sha(data))
    asks = sends(have(m, entry), Kind.RREQ)
    for now in range(2, 300):
        asks += sends(m.handle(Tick(), now), Kind.RREQ)
    assert 5 <= len(asks) <= 1 + 300 / (BACKOFF * 3.0) + 5, len(asks)  # doubling up to 48 s
    m.handle(PeerItem("a", frames.ResChunk(BLOB, sha(data), 12, 0, data[:4])), 300)
    fx = m.handle(Tick(), 303)  # bytes came: back to the plain timeout
    assert sends(fx, Kind.RREQ) == [Send(Kind.RREQ, frames.ResAsk(BLOB, sha(data), 4, 8), "a")]


def test_the_rules_cache_names_up_to_a_bound_and_start_again_when_full() -> None:
    """The rule of a name is cached (asked at every sweep), but a peer's stream of new names
    cannot make the cache hold more than CACHED_NAMES of them."""
    from syncd.core.resources import rules as rules_module

    r = Rules()
    assert r.kind("artifacts/a.log") is FileKind.ONCE and r.kind("x.tmp") is None
    assert r.kind("assets/s.json") is FileKind.REPLACED
    kinds = r.__dict__["_kinds"]
    assert set(kinds) == {"artifacts/a.log", "x.tmp", "assets/s.json"}
    for i in range(rules_module.CACHED_NAMES + 10):
        assert r.kind(f"assets/{i:x}") is FileKind.ONCE
    assert len(kinds) <= rules_module.CACHED_NAMES
    assert r == Rules() and hash(r) == hash(Rules())  # the cache is no part of the rules
    assert r.kind("n" * (rules_module.CACHED_NAME + 1)) is None
    assert "n" * (rules_module.CACHED_NAME + 1) not in kinds
