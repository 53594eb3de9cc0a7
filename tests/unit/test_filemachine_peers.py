"""Peer bookkeeping (syncd/core/filemachine/peers.py), driven directly: announcements in, the
views the machine keeps (and readiness reads) out; which peers a fetch may ask; status."""

from __future__ import annotations

from syncd.core.filemachine import peers
from syncd.core.filemachine.state import LogPeer
from syncd.core.frames import Announce
from syncd.core.ledger import Position
from syncd.core.reconcile import PeerState
from syncd.core.records import Freeze

D1, D2 = b"1" * 32, b"2" * 32


def test_a_new_position_is_a_new_view_that_keeps_the_readiness_times() -> None:
    first = peers.heard(None, Announce(10, D1, None), wall=100.0)
    assert first.position == Position(10, D1) and first.heard_at == 100.0
    assert first.grew_at is None
    first.verified, first.ahead_since = True, 90.0
    grown = peers.heard(first, Announce(20, D2, None), wall=105.0)
    assert grown is not first and not grown.verified  # nothing known of the new position
    assert grown.grew_at == 105.0 and grown.ahead_since == 90.0 and grown.heard_at == 105.0
    same = peers.heard(grown, Announce(20, D2, None), wall=110.0)
    assert same is grown and same.heard_at == 110.0 and same.grew_at == 105.0


def test_frozen_and_disputing_since_are_first_heard_times() -> None:
    v = peers.heard(None, Announce(10, D1, "reset", 0, ("a",)), wall=100.0)
    assert v.frozen == "reset" and v.frozen_since == 100.0 and v.disputes_since == 100.0
    v = peers.heard(v, Announce(10, D1, "reset", 0, ("a",)), wall=200.0)
    assert v.frozen_since == 100.0 and v.disputes_since == 100.0
    v = peers.heard(v, Announce(10, D1, "diverged", 0, ()), wall=300.0)
    assert v.frozen_since == 300.0 and v.disputes_since is None
    v = peers.heard(v, Announce(10, D1, None), wall=400.0)
    assert v.frozen is None and v.frozen_since is None


def test_ahead_since_is_kept_while_the_peer_is_ahead() -> None:
    v = LogPeer(Position(50, D1), None)
    peers.note_ahead(v, 40, wall=1.0)
    peers.note_ahead(v, 45, wall=2.0)
    assert v.ahead_since == 1.0
    peers.note_ahead(v, 50, wall=3.0)
    assert v.ahead_since is None


def test_bytes_taken_from_a_peer_tell_its_position() -> None:
    v = LogPeer(Position(10, D1), None)
    peers.took_from(v, 30, D2, wall=5.0)
    assert v.position == Position(30, D2) and v.verified and v.state is PeerState.IN_SYNC
    assert v.grew_at == 5.0
    peers.took_from(v, 20, D1, wall=6.0)  # it announced more already: kept
    assert v.position == Position(30, D2) and v.heard_at == 6.0


def test_a_fork_is_gone_only_once_a_consistent_copy_covers_where_we_parted() -> None:
    located = Freeze("diverged", "x", 1.0, peer="b", offset=100, ours="our line")
    unlocated = Freeze("diverged", "x", 1.0, peer="b", offset=100)
    assert not peers.fork_gone(located, LogPeer(Position(100, D1), None))
    assert peers.fork_gone(located, LogPeer(Position(101, D1), None))
    assert peers.fork_gone(unlocated, LogPeer(Position(100, D1), None))
    assert not peers.fork_gone(located, LogPeer(Position(500, D1), "adopting"))


def test_a_fetch_asks_no_frozen_diverged_disputing_or_offline_peer() -> None:
    views = {
        "b": LogPeer(Position(90, D1), None),
        "c": LogPeer(Position(99, D1), "reset"),
        "d": LogPeer(Position(99, D1), None),
        "e": LogPeer(Position(99, D1), None, diverged=("a",)),
        "f": LogPeer(Position(99, D1), None),
    }
    online = {"b": True, "c": True, "d": True, "e": True, "f": False}
    diverged = {"d": Freeze("diverged", "x", 1.0, peer="d")}
    got = peers.fetch_candidates(views, online, diverged, "a", adopting=None)
    assert {n for n, (_, ok) in got.items() if ok} == {"b"}
    assert got["c"] == (99, False)
    # Adopting: the adopted peer only, whatever it says of itself.
    assert peers.fetch_candidates(views, online, diverged, "a", adopting="d") == {"d": (99, True)}
    assert peers.fetch_candidates(views, online, {}, "a", adopting="z") == {"z": (0, False)}


def test_knowing_of_a_fork_is_what_the_peer_announced() -> None:
    views = {"b": LogPeer(Position(1, D1), None, diverged=("a", "c"))}
    assert peers.knows_of_fork(views, "b", "a")
    assert not peers.knows_of_fork(views, "b", "x") and not peers.knows_of_fork(views, "q", "a")


def test_status_and_sizes_ahead() -> None:
    views = {"c": LogPeer(Position(30, D1), None), "b": LogPeer(Position(5, D1), "reset")}
    got = peers.peers_status(views, {"c": True}, 20, lambda n: views[n].state)
    assert list(got) == ["b", "c"]
    assert got["b"] == {"size": 5, "state": "ahead", "frozen": "reset", "diverged": [],
                        "online": False, "lag_bytes": 15}
    assert got["c"]["lag_bytes"] == 0 and got["c"]["online"] is True
    assert peers.sizes_ahead(views, 20, {}) == {"c": 10}
    assert peers.sizes_ahead(views, 20, {"c": Freeze("diverged", "x", 1.0)}) == {}


def test_unverify_forgets_what_was_judged() -> None:
    views = {"b": LogPeer(Position(1, D1), None, verified=True, forked=True, probed=True)}
    peers.unverify(views)
    assert not views["b"].verified and not views["b"].forked and views["b"].probed
    peers.unverify(views, probed=True)
    assert not views["b"].probed
