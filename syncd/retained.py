"""Which position announcements are also published retained, and when (pure: time is given).

Every announcement travels at once in the batch for everyone (`P/a/<node>`): the peers online
now learn it with the bytes, many files per frame and one signature. The retained copy
(`P/p/<node>/<key>/<file>`, one MQTT message and one signature per file) is for hosts that
connect later; under a stream of appends it is refreshed at most every `gap` seconds per
file, always ending on the latest announcement. What a later host must not miss goes at once:
the first announcement of a connection, a freeze or a divergence, an answer to an adopting
peer, a copy that got shorter (its history was replaced).
"""

from __future__ import annotations

from syncd.frames import Announce

RETAIN_GAP = 5.0  # seconds between two retained announcements of one file under appends

Where = tuple[str, str]  # (key, file)


class RetainPacer:
    def __init__(self, gap: float = RETAIN_GAP) -> None:
        self.gap = gap
        self._sent: dict[Where, tuple[Announce, float]] = {}  # last retained, and when
        self._pending: dict[Where, Announce] = {}  # newer than the retained one, held back

    def offer(self, where: Where, ann: Announce, now: float) -> bool:
        """True: publish `ann` retained now. False: held back; `due()` returns it later."""
        last = self._sent.get(where)
        if last is None or _urgent(last[0], ann) or now >= last[1] + self.gap:
            self._sent[where] = (ann, now)
            self._pending.pop(where, None)
            return True
        self._pending[where] = ann
        return False

    def next_due(self) -> float | None:
        if not self._pending:
            return None
        return min(self._sent[w][1] for w in self._pending) + self.gap

    def due(self, now: float, everything: bool = False) -> list[tuple[Where, Announce]]:
        """The held-back announcements whose time has come (`everything`: all of them, e.g.
        for a host that has just come online), now recorded as sent."""
        out = [(w, a) for w, a in self._pending.items()
               if everything or now >= self._sent[w][1] + self.gap]
        for w, a in out:
            del self._pending[w]
            self._sent[w] = (a, now)
        return out

    def forget(self) -> None:
        """A new connection (the broker may have lost its retained messages): the next
        announcement of every file goes at once."""
        self._sent.clear()
        self._pending.clear()


def _urgent(last: Announce, ann: Announce) -> bool:
    return (ann.frozen != last.frozen or ann.diverged != last.diverged or ann.answers != 0
            or ann.size < last.size)
