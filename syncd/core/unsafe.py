"""Entries below a runtimes root that syncd refused to follow: counted, logged once, shown.

The local bot may put anything under its directories: a symbolic link to syncd's state, a
device, a directory where a file should be, a tree deeper than anyone walks, a directory
syncd cannot read. Each one is refused where it is met (disk/tree.py) and reported here,
whoever met it (the resources scan, serving, installing, the log's replica, the archive):
the first report of a (path, kind) is new (the caller logs it, once), and counts; the last
SHOWN stay listed for `syncd status`.

Pure bookkeeping (no I/O). Bounded: at most REMEMBERED (path, kind) pairs are remembered, so
a bot that makes millions of links costs a fixed amount of memory; past it a report is
counted again whenever it is made (the count then says "at least"), and logged no more.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

SHOWN = 20
REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Unsafe:
    path: str
    kind: str  # tree.LINK, "fifo", "character device", tree.UNREADABLE, tree.TOO_DEEP, ...
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "kind": self.kind, "reason": self.reason}


class UnsafePaths:
    def __init__(self) -> None:
        self.by_kind: dict[str, int] = {}
        self._seen: OrderedDict[tuple[str, str], Unsafe] = OrderedDict()
        self.full = False  # REMEMBERED reached: counts are lower bounds of distinct paths

    def note(self, path: str, kind: str, reason: str) -> bool:
        """Report one refusal; True when it is new (log it)."""
        key = (path, kind)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if len(self._seen) >= REMEMBERED:
            self.full = True
            self._seen.popitem(last=False)
            self._seen[key] = Unsafe(path, kind, reason)
            return False
        self._seen[key] = Unsafe(path, kind, reason)
        return True

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def status(self) -> dict[str, object]:
        recent = list(self._seen.values())[-SHOWN:]
        return {"total": self.total, "by_kind": dict(sorted(self.by_kind.items())),
                "at_least": self.full, "recent": [u.to_json() for u in reversed(recent)]}
