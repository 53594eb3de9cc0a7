"""The records the per-file machine decides on, shared by the pure core and the disk layer.

`Stat` is what a look at a file saw; `FileRecord` and `Freeze` are what survives a restart
(written and read by disk/recordfiles.py); `line_around` abridges a line for a divergence report.
Plain data, no I/O, so that the machine and the events never import a module that touches disk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Stat:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @property
    def inode(self) -> tuple[int, int]:
        return (self.dev, self.ino)


@dataclass(frozen=True)
class Freeze:
    """Why a file stopped replicating. Kept until an operator resolves it."""

    reason: str  # "diverged" or "reset"
    detail: str
    since: float
    peer: str | None = None
    offset: int | None = None  # first differing byte, once located
    line: int | None = None  # its 1-based line number (the same on both sides)
    ours: str | None = None  # our line there (abridged)
    theirs: str | None = None  # the peer's line there (abridged)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# The `.appending` note: (peer, start, offset, end, hex SHA-256 of the piece). A kill or a
# power loss can cut the write() of a piece [offset, end) short on a page boundary, leaving
# the start of a line past our end; bytes there from `start` (the start of the unfinished line
# the piece continues, else `offset`) that are exactly what a peer sends for that offset are
# ours if the piece's own bytes among them are too many to be a coincidence (a page), or are
# the whole piece with that digest (filemachine/localfile.py, cut_short_is_ours). Written
# before the append, not synced (a sync per frame doubled the lag): a power loss may keep some
# of the piece's bytes and drop the note; they are then refused as a divergence, never spliced.
Appending = tuple[str, int, int, int, str]


@dataclass
class FileRecord:
    """The ledger's position and the file's identity when that position was recorded."""

    size: int
    digest: bytes
    file_size: int  # the file may hold a torn line past `size`
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int
    partial: bytes
    freeze: Freeze | None = None
    diverged_peers: dict[str, Freeze] = field(default_factory=dict)
    note: str | None = None  # the last local edit noticed, for the operator
    # A peer's bytes we are appending that do not end a line (a piece of a long line):
    # (peer, start, end, hex digest of the prefix of length end). Written durably before the
    # append, so that after a crash the bytes [start, end) past our recorded size are known
    # to be that peer's (when the file's prefix still has that digest), not a local writer's
    # torn line.
    intent: tuple[str, int, int, str] | None = None
    # Not the same guard as `intent`: that one vouches for a piece of a long line, durably;
    # this one, for an append cut short on a page boundary (see Appending). Kept apart from the
    # record, in `<file>.appending` (RecordFiles.note_appending), written (not synced)
    # before each such append.
    appending: Appending | None = None


def line_around(buf: bytes, i: int, limit: int = 160) -> str:
    """The line of `buf` that holds index i, abridged, for a human reading a divergence."""
    start = buf.rfind(b"\n", 0, i) + 1
    end = buf.find(b"\n", i)
    line = buf[start : end if end >= 0 else len(buf)]
    text = line.decode("utf-8", "replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"
