"""Replays: an authentic frame sent again later, by someone who recorded it off the broker.

The tag (frames.py) proves who sent a frame and on which topic; this module decides whether it
is new. Pure bookkeeping, no I/O:

- presence: accepted only if newer (ts) than the last one seen from that node; it names the
  node's current session (sid). The connection's will is stamped 1 ms after the online presence
  it follows, so it wins over it, and a replayed old will loses against any later presence.
- positions: accepted only if not older than the last position seen for that node and file
  (a re-delivered retained position carries the same stamp).
- everything else: must belong to the node's current session and carry a sequence number
  above the last one accepted from it. A frame the broker delivers out of order is dropped
  like a lost one, which anti-entropy already repairs.
"""

from __future__ import annotations

from syncd.frames import Kind, Stamp


class ReplayGuard:
    def __init__(self) -> None:
        self._presence: dict[str, tuple[int, str]] = {}  # node -> (ts, sid)
        self._seq: dict[str, int] = {}  # node -> last accepted seq in its current session
        self._positions: dict[tuple[str, str, str], int] = {}  # (node, key, file) -> ts

    def check(self, kind: Kind, sender: str, key: str, file: str, stamp: Stamp) -> str | None:
        """None to accept the frame (and remember it), or why it is refused."""
        if kind is Kind.NODE:
            last = self._presence.get(sender)
            if last is not None and stamp.ts <= last[0]:
                return "presence older than one already seen (replayed?)"
            if last is None or last[1] != stamp.sid:
                self._seq[sender] = -1
            self._presence[sender] = (stamp.ts, stamp.sid)
            return None
        if kind is Kind.POS:
            where = (sender, key, file)
            if stamp.ts < self._positions.get(where, -1):
                return "position older than one already seen (replayed?)"
            self._positions[where] = stamp.ts
            return None
        current = self._presence.get(sender)
        if current is None or current[1] != stamp.sid:
            return "not from the sender's current session (replayed, or presence not seen yet)"
        if stamp.seq <= self._seq.get(sender, -1):
            return "sequence number already seen (replayed or reordered)"
        self._seq[sender] = stamp.seq
        return None
