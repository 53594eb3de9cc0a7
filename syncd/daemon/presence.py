"""What this host has heard of each peer: online or not and since when, the wire versions and
run key its presence announced, and whether its numbered stream is provably complete here.

The host owns one Presence and fans a change out (file tasks, resources, retained positions);
this module only keeps the facts and answers questions about them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from syncd.core import frames, sealed, versions
from syncd.core.freshness import PeerStreams
from syncd.core.pairkeys import PairKeyError, PairKeys
from syncd.core.readiness import Unconfirmed

log = logging.getLogger("syncd.node")


class Presence:
    def __init__(self) -> None:
        # node -> online; the file machines read this very dict (never replaced).
        self.online: dict[str, bool] = {}
        # node -> wall time its presence last changed as heard here (first heard, at start):
        # readiness says how long a peer has been offline.
        self.since: dict[str, float] = {}
        # node -> the wire versions its newest presence says it speaks (versions.py)
        self.speaks: dict[str, tuple[int, ...]] = {}
        self.heard_version: dict[str, int] = {}  # node -> the version of its last frame here
        self.last: dict[str, bytes] = {}  # node -> its last presence accepted
        self.opening = sealed.BodyKeys()  # the peers' body keys, as unwrapped
        self.streams = PeerStreams()  # their numbered streams (freshness.py)
        self.connected_at: float | None = None  # wall time of the last broker connection

    def heard(self, sender: str, key: Any, frame: frames.Frame, pairs: PairKeys) -> bool:
        """Note the versions and run key a fresh presence announces; False: an unusable key."""
        p = frame.items[0].payload
        assert isinstance(p, frames.Presence)
        if p.retired:
            pairs.forget(sender)
            return True
        self.speaks[sender] = versions.spoken(p.speaks)
        if p.run_key:
            try:
                if pairs.learn(sender, frame.epoch, key, p.run_key):
                    # Its last run's body keys die with that run's pair keys.
                    self.opening.clear()
            except PairKeyError:
                pairs.forget(sender)
                self.speaks[sender] = versions.LEGACY  # nothing sealed for it: signed frames
                return False
        return True

    def change(self, node: str, online: bool) -> bool:
        """Note `node` online or offline; False: it already was (nothing to fan out)."""
        if self.online.get(node) == online:
            return False
        self.online[node] = online
        self.since[node] = time.time()
        log.info("peer %s is %s", node, "online" if online else "offline",
                 extra={"peer": node})
        return True

    def forget(self, node: str) -> None:
        """A node removed from [peers]: nothing of it is kept."""
        self.online.pop(node, None)
        self.speaks.pop(node, None)
        self.heard_version.pop(node, None)
        self.last.pop(node, None)
        self.streams.forget(node)
        self.since.pop(node, None)

    def wire_version(self, node: str) -> int | None:
        """The version of our frames for `node` alone (versions.py); None: none in common."""
        return versions.common(self.speaks.get(node, versions.LEGACY))

    def is_online(self, node: str) -> bool:
        return self.online.get(node, False)

    def offline_since(self, node: str) -> float | None:
        if self.online.get(node, True):
            return None
        return self.since.get(node)

    def unconfirmed(self, may_write: Callable[[str], bool]) -> list[Unconfirmed]:
        """Online peers that `may_write` accepts whose positions are not provably fresh."""
        now = time.time()
        out = []
        for node, online in self.online.items():
            if not online or not may_write(node):
                continue
            c = self.streams.confirmation(node, now)
            if not c.confirmed:
                out.append(Unconfirmed(node, c.since, c.why or "unknown"))
        return out

    def status(self) -> dict[str, dict[str, Any]]:
        """Status `peers`: each peer heard of, in name order."""
        now = time.time()
        return {n: self._peer_status(n, o, now) for n, o in sorted(self.online.items())}

    def _peer_status(self, node: str, online: bool, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"online": online, "since": self.since.get(node),
                               "speaks": list(self.speaks.get(node, versions.LEGACY)),
                               "wire_version": self.wire_version(node),
                               "heard_version": self.heard_version.get(node)}
        c = self.streams.confirmation(node, now)
        out["confirmed"] = c.confirmed
        if not c.confirmed:
            out["unconfirmed_since"], out["unconfirmed"] = c.since, c.why
        return out
