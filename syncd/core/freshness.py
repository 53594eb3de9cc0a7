"""Replays and sessions: is an authentic frame new, and what does it say about its sender's run?

The signature (frames.py) proves who sent a frame and on which topic; this module decides
whether it is new. Order comes from the sender's own counters, never from clocks:

- `epoch`: the sender's run, persisted in its state_dir and increased at every start
  (disk/epoch.py), so a host whose clock was wrong, or that restarted, is ordered correctly.
- `conn`: which broker connection of that run; `seq`: a counter over the run's frames.

Rules, pure bookkeeping without I/O:
- presence: accepted if its (epoch, conn) is newer than the last presence seen from the node,
  or the same with "offline" following "online" (the connection's will describes the end of
  the connection the online presence began). A replayed old presence is older: ignored.
- presence is bound to the live connection: any frame from a newer (epoch, conn) than the
  last presence proves that connection is up, so the sender counts as online even if the
  presence we were handed is an old "offline" (a replay, or a lagging broker).
- positions (retained, one topic per file): accepted if they come from the sender's newest
  run heard of (an authentic old position re-published as retained by someone holding that
  host's broker login says nothing about its copy now), and if not older, by (epoch, seq),
  than the last one accepted on that topic (a re-delivered retained position is equal).
  The newest runs outlive a restart of this host (`epochs()`, kept in state_dir by the
  node): a host that restarts is handed only what the broker retains, which such a login
  may have replaced, presence included. The price: a position a sender announced in an
  earlier run, for a file its newest run has not announced yet (its start-up check of that
  file still running), is not heard until it is.
- batches: from the sender's newest run only, each topic's sequence numbers increasing. A
  batch the broker delivers out of order is dropped like a lost one, which anti-entropy
  repairs.

PeerStreams (below) answers another question about the same frames: whether what we know of
a peer's copies is complete and recent, which READY rests on (readiness.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from syncd.core.frames import Channel, Frame, Kind, Presence


@dataclass(frozen=True, slots=True)
class Admission:
    reason: str | None = None  # None: accept
    online: bool | None = None  # the sender's presence changed to this


class ReplayGuard:
    def __init__(self, epochs: Mapping[str, int] | None = None) -> None:
        """`epochs`: each sender's newest run as heard before this host restarted."""
        self._epoch: dict[str, int] = dict(epochs or {})  # node -> newest run seen
        self._presence: dict[str, tuple[int, int, bool]] = {}  # node -> (epoch, conn, online)
        # (node, batch topic) -> last accepted seq in the node's newest run
        self._seq: dict[tuple[str, str], int] = {}
        self._positions: dict[str, tuple[int, int]] = {}  # position topic -> (epoch, seq)
        # (node, key, file) -> (epoch, seq) of the newest position heard, retained or batched
        self._newest: dict[tuple[str, str, str], tuple[int, int]] = {}

    def online(self, node: str) -> bool | None:
        last = self._presence.get(node)
        return None if last is None else last[2]

    def check(self, channel: Channel, topic: str, frame: Frame) -> Admission:
        sender = frame.sender
        if channel is Channel.PRESENCE:
            return self._presence_frame(frame)
        if channel is Channel.POSITION:
            newest = self._epoch.get(sender, -1)
            if frame.epoch < newest:
                return Admission(f"position from an earlier run of {sender} (epoch "
                               f"{frame.epoch} < {newest}; replayed?)")
            if frame.epoch > newest:
                self._new_run(sender, frame.epoch)
            last = self._positions.get(topic)
            if last is not None and (frame.epoch, frame.seq) < last:
                return Admission("position older than one already seen (replayed?)")
            self._positions[topic] = (frame.epoch, frame.seq)
            return Admission(online=self._proves_online(frame))
        newest = self._epoch.get(sender, -1)
        if frame.epoch < newest:
            return Admission(f"from an earlier run of {sender} (epoch {frame.epoch} < {newest}; "
                           "replayed?)")
        if frame.epoch > newest:
            self._new_run(sender, frame.epoch)
        if frame.seq <= self._seq.get((sender, topic), -1):
            return Admission("sequence number already seen (replayed or reordered)")
        self._seq[(sender, topic)] = frame.seq
        return Admission(online=self._proves_online(frame))

    def epochs(self) -> dict[str, int]:
        """Each sender's newest run heard of (to be kept across a restart of this host)."""
        return dict(self._epoch)

    def newest_position(self, sender: str, key: str, file: str, epoch: int, seq: int) -> bool:
        """A position travels twice (batched at once, retained later and paced): whether this
        one is newer than every other heard of that file from that sender."""
        where = (sender, key, file)
        last = self._newest.get(where)
        if last is not None and (epoch, seq) < last:
            return False
        self._newest[where] = (epoch, seq)
        return True

    def _new_run(self, sender: str, epoch: int) -> None:
        self._epoch[sender] = epoch
        for where in [w for w in self._seq if w[0] == sender]:
            del self._seq[where]

    def _presence_frame(self, frame: Frame) -> Admission:
        item = frame.items[0]
        assert item.kind is Kind.NODE and isinstance(item.payload, Presence)
        online = item.payload.online
        last = self._presence.get(frame.sender)
        if last is not None and (frame.epoch, frame.conn, not online) <= (last[0], last[1],
                                                                          not last[2]):
            return Admission("presence older than one already seen (replayed?)")
        if frame.epoch < self._epoch.get(frame.sender, -1):
            return Admission("presence from an earlier run (replayed?)")
        if frame.epoch > self._epoch.get(frame.sender, -1):
            self._new_run(frame.sender, frame.epoch)
        self._presence[frame.sender] = (frame.epoch, frame.conn, online)
        return Admission(online=online if last is None or last[2] != online else None)

    def _proves_online(self, frame: Frame) -> bool | None:
        """A frame from a newer connection than the last presence: the sender is up."""
        last = self._presence.get(frame.sender)
        if last is not None and (frame.epoch, frame.conn) <= (last[0], last[1]):
            return None
        self._presence[frame.sender] = (frame.epoch, frame.conn, True)
        return True if last is None or not last[2] else None



# --- is what we know of a peer's copies complete? -------------------------------------------

# A host sends a beat on P/a/<node> when it has sent nothing there for BEAT_INTERVAL seconds,
# or IDLE_BEAT once it has sent nothing but beats for ACTIVE_FOR (a beat says which: a beat
# costs a signature here and a verification on every peer, four a second were five times an
# idle daemon's CPU). After any other frame the next comes within BEAT_INTERVAL. A peer whose
# next frame is SLACK late is not confirmed. READY rests on this: bytes a peer made durable
# BEAT_INTERVAL + SLACK (plus the broker's delay) before a READY yes travelled in a frame sent
# before one we got, with no frame lost in between; IDLE_BEAT + SLACK for the first write
# after a quiet while.
BEAT_INTERVAL = 0.25
IDLE_BEAT = 1.0
ACTIVE_FOR = 5.0
SLACK = 0.5
STALE_AFTER = BEAT_INTERVAL + SLACK  # the usual limit: a peer that wrote or beat fast
ASK_RETRY = 1.0  # seconds before an unanswered ask is sent again (it or its answer was lost)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """Whether everything a peer has sent us on P/a since we last knew all its positions has
    arrived, and recently; if not, since when and why."""

    confirmed: bool
    since: float | None = None
    why: str | None = None


@dataclass(slots=True)
class _Stream:
    epoch: int
    lane: int  # the last frame's number
    run_start: int  # the first frame of the run without a gap that ends with `lane`
    heard_at: float
    expect: float  # seconds within which its next frame is due (what its last one said)
    doubt: str | None = None  # why its positions may be stale, until it states them again
    doubt_since: float | None = None
    asked_at: float | None = None


class PeerStreams:
    """The numbered frames each peer sends on P/a (frames.py, `lane`), as they arrive here.

    Our knowledge of a peer's positions is in doubt from the first frame we hear of it (or of
    a new run of it), at a gap in its numbers (frames the broker dropped: a full queue, a
    publish it could not make), after a silence longer than promised (what comes then may
    be what a broker held back) and at a reconnection of ours, until the peer has stated every
    position again in frames that all reached us: a beat naming the lane its restatement
    began with, that lane not before the start of our run without gaps. While in doubt, the
    peer is asked (`asks_due`) every ASK_RETRY seconds. Pure: times are given (wall clock).
    """

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}

    def frame(self, node: str, epoch: int, lane: int, now: float,
              expect: float = BEAT_INTERVAL) -> None:
        """A numbered frame of `node` arrived (authentic and new: ReplayGuard passed it),
        saying its next one comes within `expect` seconds (a beat's every_ms)."""
        s = self._streams.get(node)
        if s is None or epoch > s.epoch:
            why = "first heard" if s is None else "it restarted"
            self._streams[node] = _Stream(epoch, lane, lane, now, expect,
                                          f"{why}: waiting for it to state its positions", now)
            return
        if epoch < s.epoch or lane <= s.lane:
            return  # an earlier run's, or late: nothing it says is news
        if now - s.heard_at > s.expect + SLACK and s.doubt is None:
            # After a silence, frames that come may be old ones a broker held (a partition
            # that healed): they prove nothing about now, and the ones after them may be
            # lost. Only a restatement made after our ask does.
            s.doubt = f"nothing heard from it for {now - s.heard_at:.1f} s"
            s.doubt_since = s.heard_at
            s.asked_at = None
        if lane > s.lane + 1:
            lost = lane - s.lane - 1
            if s.doubt is None:
                s.doubt = (f"{lost} of its frames did not reach us (a broker queue overflowed, "
                           "or it could not publish them)")
                s.doubt_since = now
                s.asked_at = None  # ask at once
            s.run_start = lane
        s.lane = lane
        s.heard_at = now
        s.expect = expect

    def restated(self, node: str, restated_from: int) -> None:
        """The frame just passed to `frame` ends a restatement that began at `restated_from`:
        if every frame of it reached us, what we know of `node` is complete again."""
        s = self._streams.get(node)
        if s is not None and s.doubt is not None and s.run_start <= restated_from <= s.lane:
            s.doubt = s.doubt_since = s.asked_at = None

    def reconnected(self, now: float, when: str) -> None:
        """Our own connection was new: what every peer sent meanwhile is unknown."""
        self.doubt_all(now, f"we reconnected to the broker at {when}")

    def doubt_all(self, now: float, why: str) -> None:
        """Something on our side may have cost us frames (a reconnection; publishes of ours
        dropped: the connection is congested): doubt every peer, and ask each at once."""
        for s in self._streams.values():
            if s.doubt is None:
                s.doubt = why
                s.doubt_since = now
            s.asked_at = None

    def forget(self, node: str) -> None:
        self._streams.pop(node, None)

    def confirmation(self, node: str, now: float) -> Confirmation:
        s = self._streams.get(node)
        if s is None:
            return Confirmation(False, None, "nothing heard from it yet")
        if s.doubt is not None:
            asked = " (asked again)" if s.asked_at is not None else ""
            return Confirmation(False, s.doubt_since, s.doubt + asked)
        if now - s.heard_at > s.expect + SLACK:
            return Confirmation(False, s.heard_at, f"nothing heard from it for "
                                f"{now - s.heard_at:.1f} s (a link or broker in trouble?)")
        return Confirmation(True)

    def in_doubt(self) -> bool:
        return any(s.doubt is not None for s in self._streams.values())

    def asks_due(self, now: float, online: set[str]) -> list[str]:
        """The online peers in doubt to ask (again) now; recorded as asked."""
        due = []
        for node, s in self._streams.items():
            if (node in online and s.doubt is not None
                    and (s.asked_at is None or now - s.asked_at >= ASK_RETRY)):
                s.asked_at = now
                due.append(node)
        return sorted(due)
