"""What READY is decided on, gathered for one file: its machine, its log checks, the host's
connection and peers, and the peers' events that arrived and wait in the file's queue.

The one definition of READY is core/readiness.decide; this only gathers what it needs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol

from syncd.core.events import Event, PeerData, PeerPos
from syncd.core.filemachine import FileMachine
from syncd.core.logreport import Report
from syncd.core.readiness import Facts, PeerFacts, Unconfirmed


class FactsHost(Protocol):
    """The host, as readiness sees it (a part of filetask.HostServices)."""

    def offline_since(self, node: str) -> float | None: ...

    def is_listed(self, node: str) -> bool: ...

    def connected_since(self) -> float | None: ...

    def missing_resources(self, key: str, refs: Iterable[str]) -> tuple[list[str], int, int]:
        ...

    def unconfirmed_peers(self, key: str) -> list[Unconfirmed]:
        """Online peers that may write `key` whose positions are not provably fresh."""
        ...


_PEER_EVENTS = (PeerPos, PeerData)  # a tuple: `PeerPos | PeerData` made a union per call


class Unhandled:
    """Positions and bytes of each peer delivered to the file and not handled yet, and since
    when: until they are, what the machine knows of that peer is older than what arrived."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.since: dict[str, float] = {}

    def arrived(self, event: Event, now: float | None = None) -> None:
        if isinstance(event, _PEER_EVENTS):
            peer = event.peer
            count = self.count.get(peer, 0)
            if not count:
                self.since[peer] = time.time() if now is None else now
            self.count[peer] = count + 1

    def handled(self, event: Event) -> None:
        if isinstance(event, _PEER_EVENTS):
            peer = event.peer
            count = self.count.get(peer, 0)
            if count > 1:
                self.count[peer] = count - 1
            elif count == 1:
                del self.count[peer]
                self.since.pop(peer, None)

    def unconfirmed(self, online: Mapping[str, bool], doubted: set[str]) -> list[Unconfirmed]:
        """Online peers not `doubted` already that have events waiting here."""
        return [Unconfirmed(peer, self.since.get(peer),
                            f"{count} of its positions or pieces of data arrived and "
                            "are not handled here yet")
                for peer, count in sorted(self.count.items())
                if peer not in doubted and online.get(peer, False)]


class Checks(Protocol):
    """The file's log checks, as readiness sees them (logchecks.py)."""

    @property
    def size(self) -> int: ...

    @property
    def caught_up_at(self) -> float | None: ...

    def references(self) -> dict[str, tuple[int, int]]: ...


def gather(m: FileMachine, machine_status: Mapping[str, object], checks: Checks,
           report: Report | None, host: FactsHost, key: str, unhandled: Unhandled) -> Facts:
    """The facts of one file now; `machine_status`: m.status(), `report`: the checks'."""
    now = time.time()
    state = str(machine_status["state"])
    trouble = machine_status["error"] or (
        machine_status["paused"] if state == "paused" else None)
    connected_since = host.connected_since()
    missing, unheld, conflicts = host.missing_resources(key, checks.references())
    unconfirmed = host.unconfirmed_peers(key)
    unconfirmed += unhandled.unconfirmed(m.online, {u.name for u in unconfirmed})
    return Facts(
        now=now, state=state, freeze=m.freeze.reason if m.freeze else None,
        freeze_since=m.freeze.since if m.freeze else None,
        freeze_detail=m.freeze.detail if m.freeze else None,
        size=m.ledger.size if m.ledger else m.position.size,
        checked=checks.size, report=report, checked_at=checks.caught_up_at,
        connected=connected_since is not None,
        connected_since=connected_since,
        trouble=str(trouble) if trouble else None,
        adopting=m.adoption.peer if m.adoption else None, role=m.role, note=m.note,
        node=m.node,
        peers=tuple(
            PeerFacts(
                name=node, online=m.online.get(node, False),
                offline_since=host.offline_since(node), size=v.position.size,
                ahead_by=(0 if node in m.diverged
                          else max(0, v.position.size - m.position.size)),
                ahead_since=v.ahead_since, frozen=v.frozen, frozen_since=v.frozen_since,
                diverged=node in m.diverged,
                diverged_since=m.diverged[node].since if node in m.diverged else None,
                grew_at=v.grew_at, heard_at=v.heard_at,
                # A host unlisted here counts for nothing, in a peer's words neither.
                disputes=tuple(n for n in v.diverged if n == m.node or host.is_listed(n)),
                disputes_since=v.disputes_since)
            for node, v in sorted(m.peers.items())),
        missing_resources=tuple(missing), unheld_resources=unheld,
        resource_conflicts=conflicts, unconfirmed=tuple(unconfirmed),
    )
