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

import heapq

from syncd.core.frames import Announce

# Seconds between two retained announcements of one file under appends. Hosts online get
# every announcement in the batches, and a host coming online gets every held-back one at
# once (`due(everything=True)`): the retained copy under appends only serves a host whose
# arrival we did not see, so it may be old. Every retained message is one MQTT message and
# one signature per file: with a thousand busy files, 5 s cost a frame per 5 writes.
RETAIN_GAP = 30.0

Where = tuple[str, str]  # (key, file)


class RetainPacer:
    def __init__(self, gap: float = RETAIN_GAP) -> None:
        self.gap = gap
        self._sent: dict[Where, tuple[Announce, float]] = {}  # last retained, and when
        self._pending: dict[Where, Announce] = {}  # newer than the retained one, held back
        # (when due, file) of the files held back, oldest first: with thousands of busy
        # files, finding the next due one must not look at each (stale entries are skipped).
        self._due: list[tuple[float, Where]] = []

    def offer(self, where: Where, ann: Announce, now: float) -> bool:
        """True: publish `ann` retained now. False: held back; `due()` returns it later."""
        last = self._sent.get(where)
        if last is None or _urgent(last[0], ann) or now >= last[1] + self.gap:
            self._sent[where] = (ann, now)
            self._pending.pop(where, None)
            return True
        if where not in self._pending:
            heapq.heappush(self._due, (last[1] + self.gap, where))
        self._pending[where] = ann
        return False

    def next_due(self) -> float | None:
        self._drop_stale()
        return self._due[0][0] if self._due else None

    def due(self, now: float, everything: bool = False) -> list[tuple[Where, Announce]]:
        """The held-back announcements whose time has come (`everything`: all of them, e.g.
        for a host that has just come online), now recorded as sent."""
        if everything:
            out = list(self._pending.items())
            self._pending.clear()
            self._due.clear()
        else:
            out = []
            while self._drop_stale() and self._due[0][0] <= now:
                where = heapq.heappop(self._due)[1]
                out.append((where, self._pending.pop(where)))
        for w, a in out:
            self._sent[w] = (a, now)
        return out

    def _drop_stale(self) -> bool:
        """Skip entries of files no longer held back, or held back since a later send;
        whether any entry is left."""
        heap = self._due
        while heap:
            when, where = heap[0]
            if where in self._pending and when == self._sent[where][1] + self.gap:
                return True
            heapq.heappop(heap)
        return False

    def latest(self) -> list[tuple[Where, Announce]]:
        """The newest announcement of every file announced on this connection (retained, or
        held back), in no particular order."""
        return [(w, self._pending.get(w, sent)) for w, (sent, _at) in self._sent.items()]

    def drop(self, where: Where) -> None:
        """A file no longer replicated: nothing of it is due any more (its heap entry goes
        stale and is skipped)."""
        self._sent.pop(where, None)
        self._pending.pop(where, None)

    def forget(self) -> None:
        """A new connection (the broker may have lost its retained messages): the next
        announcement of every file goes at once."""
        self._sent.clear()
        self._pending.clear()
        self._due.clear()


def _urgent(last: Announce, ann: Announce) -> bool:
    return (ann.frozen != last.frozen or ann.diverged != last.diverged or ann.answers != 0
            or ann.size < last.size)
