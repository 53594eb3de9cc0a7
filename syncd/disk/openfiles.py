"""Descriptors on replicated files kept open between one operation and the next.

A look at a file used to cost three safe opens (tree.py: the top, an openat2 below it, an
fstat, two fcntl calls and a close each): one for the stat, one for the read, one for the
fdatasync, and a standby's append one more. Here the descriptors of the read and of the
append stay open, the least recently used closed first past a limit sized from the process's
RLIMIT_NOFILE (core/oslimits.kept_descriptors: 32 640 under the unit's LimitNOFILE=65536, 384
under a shell's 1024), so that a host's thousands of busy files each keep theirs. (A fixed 64
made every write of 1000 busy keys reopen its file on both hosts: open, fstat, fcntl, close,
and the eviction's close.)

What keeps the attacker model (tree.py) intact: a descriptor enters only from a safe open
(tree.open_file), so it names an inode that was a regular file below its root, reached
through no symbolic link. It is used again only where the name still means that inode:

- a read (snapshot) uses it only right after logfile.stat resolved the name through
  directory descriptors, no link followed, to the same (dev, inode); once per such stat
  (`vouch`, then `take_read`). Any other read opens by name, as before. A stat that finds
  another inode, or nothing, closes the entries (a deleted file's space is not held).
- an append likewise, and only when that inode is also the one the caller expects
  (append_at checks that same inode on a fresh descriptor too).
- an fdatasync uses the descriptor the bytes were last read or appended through: the inode
  whose bytes were shipped or written, whatever the name means now (a name reopened then
  could be another file, and those bytes would go unsynced).
- the log check's reads of those bytes (logfile.read_known) likewise: it checks the bytes of
  the inode the machine shipped or wrote, not of whatever file the name means by then (the
  machine's next stat notices a replacement, and the check starts over on the new file).

Thread-safe: syncs run on groupsync's threads. A descriptor in use is closed only once its
last user gives it back.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from syncd.core.oslimits import kept_descriptors
from syncd.core.spot import Spot


def _limit() -> int:
    """Descriptors kept at most (reads and appends together), from RLIMIT_NOFILE."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return kept_descriptors(None if soft == resource.RLIM_INFINITY else soft)


LIMIT = _limit()
READ, APPEND = "read", "append"


@dataclass(slots=True)
class Held:
    fd: int
    inode: tuple[int, int]
    users: int = 0
    retired: bool = False  # out of the table: closed when the last user gives it back
    vouched: bool = False  # a stat found the name at this inode since the last use


class OpenFiles:
    def __init__(self, limit: int | None = None) -> None:
        """`limit`: None sizes it from RLIMIT_NOFILE now."""
        self.limit = _limit() if limit is None else limit
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[Spot, str], Held] = OrderedDict()

    def vouch(self, spot: Spot, inode: tuple[int, int] | None) -> None:
        """logfile.stat resolved `spot` safely to `inode` (None: nothing there) just now."""
        with self._lock:
            for kind in (READ, APPEND):
                h = self._held.get((spot, kind))
                if h is None:
                    continue
                if h.inode != inode:
                    self._drop((spot, kind), h)
                else:
                    h.vouched = True

    def take_read(self, spot: Spot) -> Held | None:
        """The read descriptor, if a stat vouched for it since its last use (give it back)."""
        with self._lock:
            h = self._held.get((spot, READ))
            if h is None or not h.vouched:
                return None
            h.vouched = False
            h.users += 1
            self._held.move_to_end((spot, READ))
            return h

    def take_append(self, spot: Spot, inode: tuple[int, int]) -> Held | None:
        """The append descriptor, if a stat vouched for it since its last use and it is at
        `inode` (give it back)."""
        with self._lock:
            h = self._held.get((spot, APPEND))
            if h is None or not h.vouched:
                return None
            if h.inode != inode:
                self._drop((spot, APPEND), h)
                return None
            h.vouched = False
            h.users += 1
            self._held.move_to_end((spot, APPEND))
            return h

    def take_any(self, spot: Spot) -> Held | None:
        """The descriptor the file's bytes were last appended or read through (for a sync)."""
        with self._lock:
            for kind in (APPEND, READ):
                h = self._held.get((spot, kind))
                if h is not None:
                    h.users += 1
                    return h
        return None

    def keep(self, spot: Spot, kind: str, fd: int, inode: tuple[int, int]) -> Held:
        """A descriptor just opened safely (tree.open_file) joins the table, in use."""
        h = Held(fd, inode, users=1)
        with self._lock:
            old = self._held.pop((spot, kind), None)
            if old is not None:
                self._retire(old)
            self._held[(spot, kind)] = h
            while len(self._held) > self.limit:
                _, oldest = self._held.popitem(last=False)
                self._retire(oldest)
        return h

    def give_back(self, h: Held) -> None:
        with self._lock:
            h.users -= 1
            if h.retired and h.users == 0:
                os.close(h.fd)

    @contextmanager
    def using(self, h: Held) -> Iterator[int]:
        try:
            yield h.fd
        finally:
            self.give_back(h)

    def forget(self, spot: Spot) -> None:
        with self._lock:
            for kind in (READ, APPEND):
                h = self._held.get((spot, kind))
                if h is not None:
                    self._drop((spot, kind), h)

    def close_all(self) -> None:
        with self._lock:
            while self._held:
                _, h = self._held.popitem()
                self._retire(h)

    def __len__(self) -> int:
        return len(self._held)

    def _drop(self, key: tuple[Spot, str], h: Held) -> None:
        del self._held[key]
        self._retire(h)

    @staticmethod
    def _retire(h: Held) -> None:
        h.retired = True
        h.vouched = False
        if h.users == 0:
            os.close(h.fd)


OPEN = OpenFiles(LIMIT)  # the process's table (logfile.py uses it for every Spot)
