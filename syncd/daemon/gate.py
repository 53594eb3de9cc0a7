"""The inbound frame gate: every message from the broker passes here before anything else.

A frame is read only from a node listed in [peers], opened or verified (sealed.py, frames.py),
checked against replay (freshness.ReplayGuard), and its items become events for the file task
of their (key, file), or for the resources (resourcehub.py). What a peer's frames may cost here
is bounded before anything is routed (docs/peer-limits.md): only a writer's bytes and positions
may make a key; every request is charged to the asker's budget by the bytes it makes us send
(budget.py), once per frame; what waits in a file task's queue is held in the sender's account
(`max_peer_bytes`). Past a bound the item is refused, counted by reason and logged at most once
a minute per peer and reason.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Protocol

from syncd.config import Config
from syncd.core import frames, sealed
from syncd.core.budget import (
    ANSWER_OVERHEAD,
    Budgets,
    Holdings,
    Limits,
    probe_cost,
    serve_cost,
)
from syncd.core.events import Event, PeerData, PeerProbe, PeerRefuse, PeerRequest, peer_event
from syncd.core.frames import Channel, FrameError, Kind
from syncd.core.freshness import BEAT_INTERVAL, ReplayGuard
from syncd.core.ledger import BLOCK, DIGEST_SIZE
from syncd.core.pairkeys import PairKeys
from syncd.core.telemetry import Telemetry
from syncd.daemon.filetask import FileTask
from syncd.daemon.outbound import Outbound
from syncd.daemon.presence import Presence
from syncd.daemon.resourcehub import RESOURCE_KINDS, ResourceHub

log = logging.getLogger("syncd.node")

LIMIT_LOG_EVERY = 60.0  # seconds: at most one log line per peer and bound
# Kinds that make us send or read: each is answered once per frame (a duplicate is dropped).
_REQUESTS = frozenset({Kind.REQ, Kind.PROBE, Kind.REFUSE, Kind.RLIST, Kind.RREQ})
# Kinds that claim something of the sender's copy: they may make a key (a writer's word).
_CLAIMS = {Kind.POS, Kind.LIVE, Kind.FILL}


class GateHost(Protocol):
    """What the gate reads of the host that owns it, and the three things it asks of it."""

    node: str
    config: Config
    epoch: int
    pairs: PairKeys | None
    telemetry: Telemetry
    budgets: Budgets
    holdings: Holdings
    resources: ResourceHub
    replicas: dict[tuple[str, str], FileTask]
    outbound: Outbound

    def file_task(self, key: str, file: str, peer: str) -> FileTask | None:
        """The file task of (key, file), made on `peer`'s word if the bounds allow."""

    def presence_changed(self, node: str, online: bool) -> None: ...

    def asked_by(self, peer: str) -> None:
        """`peer` asked us to state every position again."""


class FrameGate:
    def __init__(self, host: GateHost, presence: Presence) -> None:
        self.host = host
        self.presence = presence
        self.prefix = host.config.mqtt.topic_prefix
        self._level = frames.level(host.node)
        self.guard = ReplayGuard()  # again at start, with the runs kept in state_dir
        self.rejected = 0
        self.not_for_us = 0  # sealed frames not for this run of ours to open (sealed.NotForUs)
        self._last_reject_log: dict[str, float] = {}  # sender level ("" for none) -> when
        self._limit_logged: dict[tuple[str, str], float] = {}  # (peer, reason) -> when
        self._listed_for: Config | None = None
        self._listed_cache: dict[str, tuple[str, Any]] = {}
        self._names_for: dict[str, tuple[str, Any]] | None = None
        self._names_cache: dict[str, str] = {}

    @property
    def _listed(self) -> dict[str, tuple[str, Any]]:
        """Topic level -> (node, public key) of every peer in [peers] but us."""
        config = self.host.config
        if self._listed_for is not config:
            self._listed_cache = {frames.level(n): (n, k) for n, k in config.peer_keys().items()
                                  if n != self.host.node}
            self._listed_for = config
        return self._listed_cache

    def on_message(self, topic: str, payload: bytes) -> None:
        if not payload:
            return  # a retained message being cleared (`syncd forget`): says nothing
        try:
            route = frames.parse_topic(self.prefix, topic)
        except FrameError as e:
            self.reject(topic, str(e))
            return
        if route.sender == self._level:
            if frames.own_stale_position(route, self._level, self.host.config.mqtt.hide_names):
                self.host.outbound.clear_stale(topic)  # left by a run with the other setting
            return  # our own presence comes back (n/+), or a frame to ourselves: not news
        if route.channel is Channel.TO and route.to != self._level:
            return
        listed = self._listed.get(route.sender)
        if listed is None:
            name = frames.name_of_level(route.sender) or route.sender
            self.reject(topic, f"from {name!r}, a node not listed in [peers]", route.sender)
            return
        sender, key = listed
        presence = self.presence
        if route.channel is Channel.PRESENCE and presence.last.get(sender) == payload:
            return  # the same retained presence again (a reload resubscribed): no news
        host = self.host
        max_data = max(host.config.chunk_bytes, 16 << 20)
        assert host.pairs is not None
        pairs = host.pairs
        try:
            if route.channel is Channel.PRESENCE:  # always signed: it carries the run key
                frame = frames.decode(route, payload, sender, max_data, key, topic)
            else:
                frame = sealed.decode_any(route, payload, sender, max_data, topic, key,
                                          host.node, host.epoch,
                                          lambda epoch: pairs.receiving(sender, epoch),
                                          presence.opening)
        except sealed.NotForUs as e:
            # Around a restart or a join: the sender restates what matters once it hears our
            # presence (and we asked every peer to, at connect).
            self.not_for_us += 1
            log.debug("%s: %s", topic, e)
            return
        except FrameError as e:
            self.reject(topic, str(e), route.sender)
            return
        if route.channel is Channel.POSITION and self._claimed(sender, frame.items[0]) is None:
            return  # no key of ours, nor one it may make: no replay state kept for it either
        # A keyed position level is the sender's choice: its replay state is kept per file
        # named inside, as for a plain topic (a peer cannot grow it with made-up levels).
        verdict = self.guard.check(route.channel, frames.position_topic(
            self.prefix, sender, frame.items[0].key, frame.items[0].file) if route.keyed
            else topic, frame)
        if verdict.reason is not None:
            self.reject(topic, verdict.reason, route.sender)
            return
        if route.channel is Channel.PRESENCE:
            if not presence.heard(sender, key, frame, pairs):
                self.reject(topic, "unusable run key in presence", route.sender)
                return
            presence.last[sender] = payload
        else:
            presence.heard_version[sender] = sealed.version_of(payload)
        if verdict.online is not None:
            host.presence_changed(sender, verdict.online)
        if frame.lane:
            beat = next((i.payload for i in frame.items if isinstance(i.payload, frames.Beat)),
                        None)
            every = beat.every_ms / 1000 if beat is not None and beat.every_ms else BEAT_INTERVAL
            presence.streams.frame(sender, frame.epoch, frame.lane, time.time(), every)
        asked: set[tuple[Kind, str, str, frames.Payload]] = set()
        for item in frame.items:
            host.telemetry.count("received", item.kind.value, item.size)
            if item.kind is Kind.BEAT:
                assert isinstance(item.payload, frames.Beat)
                if item.payload.restated_from and frame.lane:
                    # After the positions this frame carried were delivered, in item order.
                    presence.streams.restated(sender, item.payload.restated_from)
            elif item.kind is Kind.ASK:
                host.asked_by(sender)
            else:
                if item.kind in _REQUESTS:
                    # One answer per request per frame: 100 copies of a probe cost one.
                    seen = (item.kind, item.key, item.file, item.payload)
                    if seen in asked:
                        # Counted, not logged: a healthy host repeats a refusal when it also
                        # starts locating the fork.
                        host.telemetry.refuse("duplicate")
                        continue
                    asked.add(seen)
                self._deliver(sender, frame, item)

    def _claimed(self, sender: str, item: frames.Item) -> FileTask | None:
        """The file task a claim (a position, bytes) is about, made on a writer's word within
        the bounds of a new key; None: it does not count here. For a position topic this is
        asked before the replay guard, which keeps state per topic: a refused key leaves
        none (an old authentic position may then make the key its writer once had)."""
        if not self.host.config.may_write(item.key, sender):
            # The key's `writers` do not include the sender: its positions (which would make
            # us fetch from it) do not count here, and bytes it sends are refused.
            if item.kind is not Kind.POS:
                self.reject(f"{item.key}/{item.file}", f"{sender} is not among the writers "
                            f"of {item.key}", frames.level(sender))
            return None
        return self.host.file_task(item.key, item.file, sender)

    def _deliver(self, sender: str, frame: frames.Frame, item: frames.Item) -> None:
        host = self.host
        if item.kind in RESOURCE_KINDS:
            host.resources.deliver(sender, item)
            return
        payload = item.payload
        if isinstance(payload, frames.Announce) and payload.diverged:
            payload = self._known_names(payload)
        event = peer_event(item.kind, sender, payload)
        if event is None:
            return
        if item.kind in _CLAIMS:
            replica = self._claimed(sender, item)
        else:
            # Requests, refusals and probes are about a file we hold, or about nothing.
            replica = host.replicas.get((item.key, item.file))
        if replica is None:
            return
        if item.kind is Kind.POS and not self.guard.newest_position(
                sender, item.key, item.file, frame.epoch, frame.seq):
            return  # a retained copy older than a batched one already heard: not news
        if item.kind is Kind.PROBE and not host.config.may_write(item.key, sender) \
                and sender not in replica.machine.diverged:
            # A probe locates a divergence: from a host whose copy cannot count for the key
            # (not among its writers), only once we know that its copy differs from ours.
            self.reject(f"{item.key}/{item.file}", f"{sender} is not among the writers of "
                        f"{item.key} (a probe)", frames.level(sender))
            return
        if (item.kind is Kind.LIVE and replica.machine.frozen is None
                and sender not in replica.machine.diverged):
            assert isinstance(item.payload, frames.Data)
            host.telemetry.expect(item.key, item.file, sender, item.payload.end, frame.ts,
                                  replica.machine.position.size)
        cost = self._request_cost(event, replica)
        if cost is not None and not self.charge(sender, cost):
            return  # dropped and counted; the requester asks again after its timeout
        size = ANSWER_OVERHEAD + (len(event.data.data) if isinstance(event, PeerData) else 0)
        if not host.holdings.take(sender, size):
            # Its events already hold max_peer_bytes here, waiting for file tasks: dropped
            # like a lost frame (anti-entropy asks again once the queues have drained).
            self.refused(sender, "peer_bytes", "queued frames")
            return
        replica.deliver_held(event, sender, size)

    def _known_names(self, a: frames.Announce) -> frames.Announce:
        """`a` with only the names of its `diverged` that this host knows (itself and the
        hosts of [peers]), each once. Another name means nothing here, and each peer's view
        of each file keeps the list: up to MAX_DIVERGED names of 200 characters, ~100 KiB per
        key from a hostile peer, and as much in each announcement queued (docs/peer-limits.md).
        """
        known = self._names
        kept = tuple(dict.fromkeys(known[n] for n in a.diverged if n in known))
        return a if kept == a.diverged else dataclasses.replace(a, diverged=kept)

    @property
    def _names(self) -> dict[str, str]:
        """The node names this host knows, each mapped to one shared string."""
        listed = self._listed
        if self._names_for is not listed:
            self._names_cache = {n: n for n in [self.host.node, *(n for n, _ in listed.values())]}
            self._names_for = listed
        return self._names_cache

    def _request_cost(self, event: Event, replica: FileTask) -> int | None:
        """Bytes a peer's request makes us send or read (None: it is no request)."""
        m = replica.machine
        config = self.host.config
        match event:
            case PeerRequest(request=r):
                return serve_cost(r.have, r.start, r.length, m.held, config.fetch_window_bytes)
            case PeerProbe(probe=p):
                blocks = len(m.ledger.chain) - 1 if m.ledger is not None else 0
                return probe_cost(p.what is frames.ProbeWhat.SUMS, p.start, p.count, m.held,
                                  blocks, max(1, config.chunk_bytes // DIGEST_SIZE), BLOCK,
                                  DIGEST_SIZE)
            case PeerRefuse(refuse=rf):
                # Our digest at its offset: a read of up to one block, then perhaps a refusal
                # and a probe of our own.
                return ANSWER_OVERHEAD + min(rf.offset, m.held) % BLOCK
        return None

    def charge(self, peer: str, cost: int) -> bool:
        """Whether to serve a peer's request that makes us send `cost` bytes (budget.py);
        logs drops once a minute."""
        now = time.monotonic()
        budgets = self.host.budgets
        if budgets.admit(peer, cost, now):
            return True
        self.host.telemetry.refuse("budget")
        line = budgets.report(peer, now)
        if line is not None:
            log.warning("%s", line, extra={"peer": peer})
        return False

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None:
        """`n` items of `peer` refused at a bound: counted by reason; logged at most once a
        minute per peer and bound, so that a peer's flood does not flood the log."""
        telemetry = self.host.telemetry
        telemetry.refuse(reason, n)
        now = time.monotonic()
        if now - self._limit_logged.get((peer, reason), -1e18) < LIMIT_LOG_EVERY:
            return
        if len(self._limit_logged) > 1000:
            self._limit_logged.clear()
        self._limit_logged[(peer, reason)] = now
        log.warning("peer %s: %s refused: %s (%d refused so far for this reason; "
                    "docs/peer-limits.md)", peer, what, bound_of(reason, self.host.config.limits),
                    telemetry.rejected[reason], extra={"peer": peer})

    def reject(self, topic: str, reason: str, sender: str | None = None) -> None:
        self.rejected += 1
        self.host.telemetry.reject(reason)
        now = time.monotonic()
        # One line per sender per minute at most: a hostile client must not flood the log.
        who = sender or ""
        if now - self._last_reject_log.get(who, -60.0) >= 60:
            if len(self._last_reject_log) > 1000:
                self._last_reject_log.clear()
            self._last_reject_log[who] = now
            log.warning("rejected frame on %r: %s (%d rejected so far)", topic[:200], reason,
                        self.rejected)


def bound_of(reason: str, lim: Limits) -> str:
    """The bound a refusal `reason` names, in the words of the log line."""
    return {
        "duplicate": "answered once per frame",
        "parts": "a whole manifest in more parts than [limits] max_resource_files allows",
        "unasked": "a whole manifest this host did not ask for",
        "entries": f"over [limits] max_resource_files ({lim.max_resource_files})",
        "peer_bytes": f"its frames hold [limits] max_peer_bytes ({lim.max_peer_bytes}) "
                      "here already",
        "keys": f"over [limits] max_keys ({lim.max_keys})",
        "nested": "a key inside or above another instance",
        "disk_low": "remote growth stopped: free space below [limits] min_free_bytes "
                    f"({lim.min_free_bytes})",
    }.get(reason, reason)
