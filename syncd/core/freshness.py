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
- positions (retained, one topic per file): accepted if not older, by (epoch, seq), than the
  last one accepted on that topic (a re-delivered retained position is equal).
- batches: from the sender's newest run only, each topic's sequence numbers increasing. A
  batch the broker delivers out of order is dropped like a lost one, which anti-entropy
  repairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncd.core.frames import Channel, Frame, Kind, Presence


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str | None = None  # None: accept
    online: bool | None = None  # the sender's presence changed to this


class ReplayGuard:
    def __init__(self) -> None:
        self._epoch: dict[str, int] = {}  # node -> newest run seen
        self._presence: dict[str, tuple[int, int, bool]] = {}  # node -> (epoch, conn, online)
        # (node, batch topic) -> last accepted seq in the node's newest run
        self._seq: dict[tuple[str, str], int] = {}
        self._positions: dict[str, tuple[int, int]] = {}  # position topic -> (epoch, seq)
        # (node, key, file) -> (epoch, seq) of the newest position heard, retained or batched
        self._newest: dict[tuple[str, str, str], tuple[int, int]] = {}

    def online(self, node: str) -> bool | None:
        last = self._presence.get(node)
        return None if last is None else last[2]

    def check(self, channel: Channel, topic: str, frame: Frame) -> Verdict:
        sender = frame.sender
        if channel is Channel.PRESENCE:
            return self._presence_frame(frame)
        if channel is Channel.POSITION:
            last = self._positions.get(topic)
            if last is not None and (frame.epoch, frame.seq) < last:
                return Verdict("position older than one already seen (replayed?)")
            self._positions[topic] = (frame.epoch, frame.seq)
            return Verdict(online=self._proves_online(frame))
        newest = self._epoch.get(sender, -1)
        if frame.epoch < newest:
            return Verdict(f"from an earlier run of {sender} (epoch {frame.epoch} < {newest}; "
                           "replayed?)")
        if frame.epoch > newest:
            self._new_run(sender, frame.epoch)
        if frame.seq <= self._seq.get((sender, topic), -1):
            return Verdict("sequence number already seen (replayed or reordered)")
        self._seq[(sender, topic)] = frame.seq
        return Verdict(online=self._proves_online(frame))

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

    def _presence_frame(self, frame: Frame) -> Verdict:
        item = frame.items[0]
        assert item.kind is Kind.NODE and isinstance(item.payload, Presence)
        online = item.payload.online
        last = self._presence.get(frame.sender)
        if last is not None and (frame.epoch, frame.conn, not online) <= (last[0], last[1],
                                                                          not last[2]):
            return Verdict("presence older than one already seen (replayed?)")
        if frame.epoch < self._epoch.get(frame.sender, -1):
            return Verdict("presence from an earlier run (replayed?)")
        if frame.epoch > self._epoch.get(frame.sender, -1):
            self._new_run(frame.sender, frame.epoch)
        self._presence[frame.sender] = (frame.epoch, frame.conn, online)
        return Verdict(online=online if last is None or last[2] != online else None)

    def _proves_online(self, frame: Frame) -> bool | None:
        """A frame from a newer connection than the last presence: the sender is up."""
        last = self._presence.get(frame.sender)
        if last is not None and (frame.epoch, frame.conn) <= (last[0], last[1]):
            return None
        self._presence[frame.sender] = (frame.epoch, frame.conn, True)
        return True if last is None or not last[2] else None

