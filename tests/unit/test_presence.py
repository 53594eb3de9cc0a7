"""What a host has heard of each peer (syncd/daemon/presence.py)."""

from __future__ import annotations

from syncd.core import versions
from syncd.daemon.presence import Presence


def test_a_change_is_noted_once_with_its_time() -> None:
    p = Presence()
    assert p.change("b", True)
    assert not p.change("b", True)  # no news: nothing to fan out
    assert p.is_online("b") and p.offline_since("b") is None
    assert p.change("b", False)
    assert not p.is_online("b")
    assert p.offline_since("b") == p.since["b"]
    assert p.offline_since("never-heard") is None and not p.is_online("never-heard")


def test_the_machines_dict_is_never_replaced() -> None:
    p = Presence()
    online = p.online
    p.change("b", True)
    p.forget("b")
    p.change("c", False)
    assert p.online is online and online == {"c": False}


def test_forget_drops_everything_heard_of_a_node() -> None:
    p = Presence()
    p.change("b", True)
    p.speaks["b"] = (5, 6)
    p.heard_version["b"] = 6
    p.last["b"] = b"presence"
    p.forget("b")
    assert not (p.online or p.since or p.speaks or p.heard_version or p.last)
    assert p.wire_version("b") == versions.common(versions.LEGACY)


def test_unconfirmed_names_online_peers_that_may_write_only() -> None:
    p = Presence()
    for n, o in (("b", True), ("c", True), ("d", False)):
        p.change(n, o)
    out = p.unconfirmed(lambda node: node != "c")
    assert [u.name for u in out] == ["b"]  # nothing heard on its stream yet
    assert out[0].why == "nothing heard from it yet"


def test_status_lists_each_peer_in_name_order() -> None:
    p = Presence()
    p.change("c", False)
    p.change("b", True)
    p.speaks["b"] = (5, 6)
    s = p.status()
    assert list(s) == ["b", "c"]
    assert s["b"]["online"] and s["b"]["speaks"] == [5, 6]
    assert s["b"]["wire_version"] == versions.common((5, 6))
    assert s["c"]["confirmed"] is False and s["c"]["unconfirmed"] == "nothing heard from it yet"
