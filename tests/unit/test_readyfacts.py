"""The facts READY is decided on, gathered for one file (syncd/daemon/readyfacts.py)."""

from __future__ import annotations

from collections.abc import Iterable

from syncd.core import frames
from syncd.core.events import PeerData, PeerOnline, PeerPos
from syncd.core.filemachine import FileMachine, Tuning
from syncd.core.logcheck import LogChecker
from syncd.core.readiness import Unconfirmed
from syncd.daemon.readyfacts import Unhandled, gather

POS = PeerPos("b", frames.Announce(10, b"\0" * 32))
DATA = PeerData("b", frames.Data(0, b"\0" * 32, b"x\n"))


def test_a_peers_events_count_until_each_is_handled_and_since_the_first() -> None:
    u = Unhandled()
    u.arrived(POS, now=100.0)
    u.arrived(DATA, now=105.0)
    u.arrived(PeerOnline("b", True), now=106.0)  # not a position or bytes: not counted
    assert u.count["b"] == 2 and u.since["b"] == 100.0
    u.handled(POS)
    assert u.count["b"] == 1 and u.since["b"] == 100.0
    u.handled(DATA)
    assert "b" not in u.count and "b" not in u.since
    u.handled(DATA)  # one more than arrived: no negative count
    assert "b" not in u.count


def test_waiting_events_make_an_online_peer_unconfirmed_once() -> None:
    u = Unhandled()
    u.arrived(POS, now=100.0)
    u.arrived(PeerPos("c", frames.Announce(1, b"\0" * 32)), now=101.0)
    u.arrived(PeerPos("d", frames.Announce(1, b"\0" * 32)), now=102.0)
    out = u.unconfirmed({"b": True, "c": True, "d": False}, doubted={"c"})
    assert [(x.name, x.since) for x in out] == [("b", 100.0)]
    assert "1 of its positions or pieces of data" in out[0].why


class Host:
    def __init__(self, connected: float | None) -> None:
        self.connected = connected
        self.asked: list[tuple[str, list[str]]] = []

    def offline_since(self, node: str) -> float | None:
        return None

    def is_listed(self, node: str) -> bool:
        return True

    def connected_since(self) -> float | None:
        return self.connected

    def missing_resources(self, key: str, refs: Iterable[str]) -> tuple[list[str], int, int]:
        self.asked.append((key, list(refs)))
        return ["resources/a.png"], 2, 1

    def unconfirmed_peers(self, key: str) -> list[Unconfirmed]:
        return [Unconfirmed("c", 50.0, "its stream has a gap")]


class Checks:
    size = 7
    caught_up_at = 123.0

    def references(self) -> dict[str, tuple[int, int]]:
        return {"artifact://a.png": (1, 0)}


def test_gather_takes_the_machine_the_checks_and_the_host_as_they_are() -> None:
    m = FileMachine("a", "k", "events.jsonl", "standby", Tuning(),
                    online={"b": True, "c": True})
    host = Host(connected=42.0)
    u = Unhandled()
    u.arrived(POS, now=99.0)
    status = m.status()
    report = LogChecker().report()
    f = gather(m, status, Checks(), report, host, "k", u)
    assert f.state == str(status["state"]) and f.role == "standby" and f.node == "a"
    assert f.connected and f.connected_since == 42.0
    assert (f.checked, f.checked_at, f.report) == (7, 123.0, report)
    assert host.asked == [("k", ["artifact://a.png"])]
    assert f.missing_resources == ("resources/a.png",)
    assert (f.unheld_resources, f.resource_conflicts) == (2, 1)
    # The host's doubts first, then the peers with events waiting here (not twice).
    assert [x.name for x in f.unconfirmed] == ["c", "b"]
    assert gather(m, status, Checks(), None, Host(None), "k", Unhandled()).connected is False
