"""Our frames: sealed or signed for their readers, batched per topic, positions retained, and
our numbered stream on P/a kept provable (freshness.py): a beat when it has been quiet for
the pace our last frame promised, the asks due to peers we doubt, and a restatement of every
position when a peer asks for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable
from typing import Protocol

from syncd.config import Config
from syncd.core import frames, sealed, versions
from syncd.core.frames import Kind
from syncd.core.freshness import ACTIVE_FOR, BEAT_INTERVAL, IDLE_BEAT
from syncd.core.identity import Identity
from syncd.core.pairkeys import PairKeys
from syncd.core.telemetry import Telemetry
from syncd.core.topicnames import PositionTopics
from syncd.daemon.presence import Presence
from syncd.net.link import Link
from syncd.net.outbox import Outbox
from syncd.net.positions import PositionSender

# A peer may ask us to state every position again (freshness.py): at most once a RESTATE_GAP
# seconds, however many ask, so that what asking costs us stays bounded.
RESTATE_GAP = 1.0


class OutboundHost(Protocol):
    """What Outbound reads of the host that owns it."""

    node: str
    config: Config
    epoch: int
    identity: Identity | None
    pairs: PairKeys | None
    telemetry: Telemetry

    def stated_positions(self) -> Iterable[tuple[str, str, frames.Payload | None]]:
        """(key, file, the position it would announce now) of every file, in order."""
        ...


class Outbound:
    def __init__(self, host: OutboundHost, presence: Presence) -> None:
        self.host = host
        self.presence = presence  # readers of a frame, and the peers' streams (asks)
        self.link: Link | None = None  # the host's, given once made (it calls seal_presence)
        self.prefix = host.config.mqtt.topic_prefix
        self._seq = itertools.count()
        self._sealing = sealed.BodyKeys()  # ours, per recipient set (sealed.py)
        # Our frames on P/a are numbered (frames.py, `lane`); theirs are followed by Presence.
        self.lane = 0
        self._lane_sent_at = 0.0  # loop time of our last frame there (a beat follows a quiet)
        self._active_at = 0.0  # loop time of our last frame there other than a lone beat
        self._beat_every = BEAT_INTERVAL  # what our last beat promised
        self._pace = asyncio.Event()  # set when the fast pace is back: the beat loop wakes
        self._restate_timer: asyncio.TimerHandle | None = None
        self._restated_at = -RESTATE_GAP
        self.asks = 0  # asks for a restatement received
        self.restatements = 0
        self._dropped_seen = 0  # link.dropped when the stream loop last looked
        self.outbox = Outbox(self._publish_batch, host.config.chunk_bytes)
        self.positions = PositionSender(
            lambda item: self.outbox.add(self._all_topic(), "", item), self._publish_retained)
        self._position_topics: PositionTopics | None = None  # made once the identity is read
        self._loop: asyncio.AbstractEventLoop | None = None  # found at the first live frame

    def _all_topic(self) -> str:
        return frames.all_topic(self.prefix, self.host.node)

    def _link(self) -> Link:
        assert self.link is not None
        return self.link

    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None:
        """Queue one item; positions go out at once (retained, one topic per file), the rest
        in a batch per topic at the end of this turn of the event loop."""
        item = frames.Item(kind, payload, key, file)
        self.host.telemetry.count("sent", kind.value, item.size)
        if kind is Kind.POS:  # in the batch, and retained for later hosts (net/positions.py)
            self.positions.announce(key, file, item)
            return
        if not to:  # live bytes, and resource summaries and changes: for everyone
            self.outbox.add(self._all_topic(), "", item)
        else:
            self.outbox.add(frames.to_topic(self.prefix, to, self.host.node), to, item)

    def flush(self) -> None:
        self.outbox.flush()

    @property
    def position_topics(self) -> PositionTopics:
        if self._position_topics is None:
            assert self.host.identity is not None
            self._position_topics = PositionTopics(self.prefix, self.host.node,
                                                   self.host.identity.key,
                                                   self.host.config.mqtt.hide_names)
        return self._position_topics

    def _publish_retained(self, key: str, file: str, item: frames.Item) -> None:
        self.outbox.flush()  # keep order: bytes announced are sent before the position
        link = self._link()
        if not link.connected.is_set():
            # The link would drop it: not sealed for nothing. At start-up every file
            # announces itself before the broker answers (1000 keys: 1000 seals), and a
            # connection announces every file again anyway (Host._on_connected).
            return
        topic = self.position_topics.of(key, file)
        link.publish(topic, self.seal(topic, (item,)), retain=True)

    def clear_position(self, key: str, file: str) -> None:
        """A file no longer replicated here, under hide_names: its retained position goes (by
        hand nobody could find its topic; a plain one stays, harmless, docs/operations.md)."""
        self.positions.drop(key, file)
        topics = self.position_topics
        if topics.hide:
            self._link().publish(topics.of(key, file), b"", retain=True)
        topics.drop(key, file)

    def clear_stale(self, topic: str) -> None:
        """A retained position of ours in the form we no longer use (hide_names was switched
        since it was published): cleared, so that it does not outlive the switch."""
        self._link().publish(topic, b"", retain=True)

    def _publish_batch(self, topic: str, to: str, items: tuple[frames.Item, ...]) -> None:
        # Live batches at QoS 0: a lost one is a gap the next batch or position reveals (and
        # fetched again), and QoS 1 costs a PUBACK each way per write (docs/protocol.md, QoS).
        lane = 0
        if not to:
            # Numbered even if the publish is dropped: the peers then see the gap.
            self.lane += 1
            lane = self.lane
            loop = self._loop
            if loop is None:  # once: asyncio's lookup costs a getpid(2) (its fork check)
                loop = self._loop = asyncio.get_running_loop()
            self._lane_sent_at = loop.time()
            lone = items[0].payload if len(items) == 1 else None
            if not (isinstance(lone, frames.Beat) and lone.every_ms):
                # Not a beat promising its own pace: the next frame comes within
                # BEAT_INTERVAL (a peer assumes so of any frame but such a beat).
                self._active_at = self._lane_sent_at
                if self._beat_every != BEAT_INTERVAL:
                    self._beat_every = BEAT_INTERVAL
                    self._pace.set()
        self._link().publish(topic, self.seal(topic, items, to=to, lane=lane),
                             qos=1 if to else 0, to=to)

    def seal(self, topic: str, items: tuple[frames.Item, ...], to: str = "",
             conn: int | None = None, lane: int = 0, signed: bool = False) -> bytes:
        """Encode a frame for `topic`, stamped with our run, connection and order: sealed for
        its readers (version 6) when they all speak it, else signed (5); `signed`: always 5
        (presence: every release reads it, and it carries the run key)."""
        host = self.host
        assert host.identity is not None and host.pairs is not None
        frame = frames.Frame(host.node, host.epoch, next(self._seq),
                             time.time_ns() // 1_000_000, items, to,
                             self._link().conn if conn is None else conn, lane)
        if not signed:
            peers = host.config.peers
            readers = [to] if to else [n for n, o in self.presence.online.items()
                                       if o and n != host.node and n in peers]
            speaks = self.presence.speaks
            if versions.for_everyone(speaks.get(n, versions.LEGACY)
                                     for n in readers) == versions.SEALED:
                recipients = []
                for n in sorted(readers):
                    pair = host.pairs.sending(n)
                    if pair is None:  # a run key that did not make a pair key: refused
                        break
                    recipients.append((n, *pair))
                else:
                    return sealed.encode(frame, topic, recipients, self._sealing)
        return frames.encode(frame, host.identity, topic)

    def seal_presence(self, topic: str, online: bool, conn: int) -> bytes:
        assert self.host.pairs is not None
        presence = frames.Presence(online, speaks=versions.SPEAKS,
                                   run_key=self.host.pairs.run_public)
        return self.seal(topic, (frames.Item(Kind.NODE, presence),), conn=conn, signed=True)

    # --- the numbered stream (freshness.py, PeerStreams) -----------------------------------

    async def stream_forever(self) -> None:
        """A beat on P/a when nothing else went there for the interval our last frame promised
        (so that a peer can tell a quiet host from a stream it no longer hears): BEAT_INTERVAL,
        or IDLE_BEAT once only beats went for ACTIVE_FOR; and the asks that are due."""
        loop = asyncio.get_running_loop()
        link = self._link()
        streams = self.presence.streams
        while True:
            now = loop.time()
            if now >= self._lane_sent_at + self._beat_every:
                if link.connected.is_set():
                    # Promise the slow pace once this beat ends ACTIVE_FOR of quiet; a frame
                    # sent meanwhile brings the fast pace back at once.
                    quiet = now + BEAT_INTERVAL - self._active_at >= ACTIVE_FOR
                    every = IDLE_BEAT if quiet else BEAT_INTERVAL
                    self.outbox.add(self._all_topic(), "",
                                    frames.Item(Kind.BEAT, frames.Beat(
                                        every_ms=round(every * 1000))))
                    self.outbox.flush()
                    self._beat_every = every
                else:
                    self._lane_sent_at = now
            dropped = link.dropped
            if dropped != self._dropped_seen:
                # Our publishes are being dropped (the connection is congested, or went):
                # what reaches us may be short too, and our asks may be among them.
                streams.doubt_all(time.time(), f"{dropped - self._dropped_seen} "
                                  "publishes of ours were dropped (a congested link)")
                self._dropped_seen = dropped
            if link.connected.is_set():
                online = {n for n, o in self.presence.online.items() if o}
                self.ask(streams.asks_due(time.time(), online))
            wait = self._lane_sent_at + self._beat_every - loop.time()
            if streams.in_doubt():
                wait = min(wait, BEAT_INTERVAL)  # asks are due every ASK_RETRY
            self._pace.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, wait)):
                    await self._pace.wait()

    def ask(self, nodes: list[str]) -> None:
        for node in nodes:
            if node in self.host.config.peers:
                self.send(Kind.ASK, "", "", frames.Ask(), to=node)

    def asked_by(self, peer: str) -> None:
        """A peer doubts what it knows of us: state every position again, soon (at most once
        a RESTATE_GAP, for everyone who asked meanwhile)."""
        self.asks += 1
        if self._restate_timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._restate_timer = loop.call_at(max(loop.time(), self._restated_at + RESTATE_GAP),
                                           self._restate)

    def _restate(self) -> None:
        """Every position, on P/a, then a beat naming the lane where they began: a peer that
        got every frame from that lane to the beat knows all our positions again."""
        self._restate_timer = None
        self._restated_at = asyncio.get_running_loop().time()
        self.restatements += 1
        self.positions.release_held()  # older ones first, not after
        self.outbox.flush()
        topic = self._all_topic()
        first = self.lane + 1
        for key, file, ann in self.host.stated_positions():
            if ann is not None:
                item = frames.Item(Kind.POS, ann, key, file)
                self.host.telemetry.count("sent", Kind.POS.value, item.size)
                self.outbox.add(topic, "", item)
        self.outbox.add(topic, "", frames.Item(Kind.BEAT, frames.Beat(first)))
        self.outbox.flush()  # more than a lone beat: the fast pace follows
