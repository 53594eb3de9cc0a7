"""Peer bookkeeping: what each peer announced of its copy, the readiness times kept with it,
which peers a fetch may ask, and how the peers show in status. Pure functions over the
machine's `peers` (node -> LogPeer); judging a peer's copy against ours is the machine's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from syncd.core.filemachine.state import LogPeer
from syncd.core.frames import Announce
from syncd.core.ledger import Position
from syncd.core.reconcile import PeerState
from syncd.core.records import Freeze


def heard(old: LogPeer | None, a: Announce, wall: float) -> LogPeer:
    """The view of a peer after its announcement `a` (heard at `wall`): a new one for a new
    position (nothing verified of it yet), the readiness bookkeeping carried over."""
    pos = Position(a.size, a.digest)
    view = old
    if view is None or view.position != pos:
        view = LogPeer(pos, a.frozen)
    view.heard_at = wall
    if old is not None and view is not old:  # readiness bookkeeping survives a new position
        view.grew_at, view.ahead_since = old.grew_at, old.ahead_since
        view.frozen_since = old.frozen_since
        view.disputes_since = old.disputes_since
    if old is not None and pos.size > old.position.size:
        view.grew_at = wall
    if a.frozen is None:
        view.frozen_since = None
    elif old is None or old.frozen != a.frozen or view.frozen_since is None:
        view.frozen_since = wall
    view.frozen = a.frozen
    if not a.diverged:
        view.disputes_since = None
    elif view.disputes_since is None:
        view.disputes_since = wall
    view.diverged = a.diverged
    return view


def note_ahead(view: LogPeer, our_size: int, wall: float) -> None:
    """Keep since when the peer's copy is ahead of our durable one (readiness)."""
    if view.position.size <= our_size:
        view.ahead_since = None
    elif view.ahead_since is None:
        view.ahead_since = wall


def took_from(view: LogPeer, size: int, digest: bytes, wall: float) -> None:
    """We appended bytes the peer sent: it holds at least our copy now (no announcement
    needed to know it)."""
    view.heard_at = wall
    if view.position.size < size:
        view.position, view.verified = Position(size, digest), True
        view.state = PeerState.IN_SYNC
        view.grew_at = wall


def unverify(peers: Mapping[str, LogPeer], probed: bool = False) -> None:
    """Our history changed: judge every peer's copy again (and ask a frozen one again)."""
    for view in peers.values():
        view.verified = view.forked = False
        if probed:
            view.probed = False


def fork_gone(found: Freeze, view: LogPeer) -> bool:
    """Whether a peer's position, consistent with our copy, covers the point where the
    copies parted. A consistent position short of it says nothing (an old announcement,
    from before its other bytes); one past it holds our bytes there. An adopting peer is
    judged on the copy it ends with."""
    at = found.offset or 0
    # Located: `offset` is the first differing byte. Not yet: the prefixes of length
    # `offset` differ, so some byte below it does.
    need = at + 1 if found.ours is not None else at
    return view.position.size >= need and view.frozen != "adopting"


def knows_of_fork(peers: Mapping[str, LogPeer], peer: str, node: str) -> bool:
    """Whether `peer` announced that its copy and ours (`node`'s) differ."""
    view = peers.get(peer)
    return view is not None and node in view.diverged


def fetch_candidates(peers: Mapping[str, LogPeer], online: Mapping[str, bool],
                     diverged: Mapping[str, Freeze], node: str,
                     adopting: str | None) -> dict[str, tuple[int, bool]]:
    """node -> (size, may be asked) for choose_source: the adopted peer alone while adopting;
    never a frozen or adopting copy, nor one whose history differs from ours (either side may
    know it first: a peer that names us would only refuse)."""
    if adopting is not None:
        view = peers.get(adopting)
        return {adopting: (view.position.size if view else 0, online.get(adopting, False))}
    return {
        n: (v.position.size, v.frozen is None and n not in diverged
            and node not in v.diverged and online.get(n, False))
        for n, v in peers.items()
    }


def peers_status(peers: Mapping[str, LogPeer], online: Mapping[str, bool], our_size: int,
                 state_of: Callable[[str], PeerState]) -> dict[str, dict[str, Any]]:
    return {
        n: {
            "size": v.position.size,
            "state": state_of(n).value,
            "frozen": v.frozen,
            "diverged": list(v.diverged),
            "online": online.get(n, False),
            "lag_bytes": max(0, our_size - v.position.size),
        }
        for n, v in sorted(peers.items())
    }


def sizes_ahead(peers: Mapping[str, LogPeer], our_size: int,
                diverged: Mapping[str, Freeze]) -> dict[str, int]:
    """How far each peer's copy is ahead of ours (diverged peers left out)."""
    return {n: v.position.size - our_size for n, v in peers.items()
            if v.position.size > our_size and n not in diverged}
