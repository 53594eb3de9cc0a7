"""Group commit of local appends: when a file's new bytes are read and shipped (pure).

A local change (the watcher's hint that the writer appended) is read, published and synced at
once when nothing is in flight for that file: a lone write waits for nothing, not even a
window. What the writer appends while that read–publish–sync is under way cannot go in it
(its bytes were read already); it waits, however many appends it is, for the one under way
to finish and then leaves in the next one, together. Under load the batches grow by
themselves, as large as the writer's rate times the time one commit takes, with no timer.

The next commit reads everything new at once and ships it in pieces of at most `chunk_bytes`
(`cut`: whole records, a record larger than that alone), so that no frame outgrows what the
broker takes.

`GroupCommit` only decides; daemon/window.py's CommitGate does what it says (asks the
replica to look, hears when its look is done).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


@dataclass
class Counts:
    """What the group commit did so far (status `group_commit`, metrics)."""

    changes: int = 0  # change notices offered
    reads: int = 0  # commits started: one read of one file each
    joined: int = 0  # notices that went into a commit started for an earlier one
    largest: int = 0  # most notices one commit carried


class GroupCommit(Generic[T]):
    """In flight: a file whose commit was started and is not done. Waiting: a file changed
    again meanwhile; its next commit starts when the one under way is done."""

    def __init__(self) -> None:
        self.counts = Counts()
        # thing -> notices its commit under way carries / its next one will carry
        self._flight: dict[T, int] = {}
        self._waiting: dict[T, int] = {}  # in order of arrival

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def is_in_flight(self, thing: T) -> bool:
        return thing in self._flight

    def offer(self, thing: T) -> bool:
        """`thing` changed. True: start its commit now (nothing in flight for it). False:
        it joins the next one, started when done() is called for the one under way."""
        c = self.counts
        c.changes += 1
        if thing not in self._flight:
            self._start(thing, 1)
            return True
        c.joined += 1
        self._waiting[thing] = self._waiting.get(thing, 0) + 1
        return False

    def done(self, thing: T) -> bool:
        """The commit under way for `thing` finished (or never started: the file is gone).
        True: start the next one now, carrying what changed meanwhile."""
        carried = self._flight.pop(thing, None)
        if carried is None:
            return False
        joined = self._waiting.pop(thing, 0)
        if not joined:
            return False
        self._start(thing, joined)
        return True

    def forget(self, thing: T) -> None:
        """`thing` is no longer replicated: nothing of it is in flight or waits."""
        self._flight.pop(thing, None)
        self._waiting.pop(thing, None)

    def _start(self, thing: T, notices: int) -> None:
        c = self.counts
        c.reads += 1
        c.largest = max(c.largest, notices)
        self._flight[thing] = notices

    def status(self) -> dict[str, object]:
        c = self.counts
        return {"changes": c.changes, "reads": c.reads, "joined": c.joined,
                "largest": c.largest,
                "changes_per_read": round(c.changes / c.reads, 2) if c.reads else None,
                "in_flight": self.in_flight, "waiting": self.waiting}


def cut(sizes: Sequence[int], limit: int, max_items: int | None = None) -> list[range]:
    """Consecutive runs of records (by index) of at most `limit` bytes and `max_items` items:
    every record in exactly one run, in order; a record larger than `limit` alone."""
    out: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        if i > start and (total + size > limit
                          or (max_items is not None and i - start >= max_items)):
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
