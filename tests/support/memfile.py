"""An in-memory log file for the machine's unit tests, read the way the shell reads a real one
(syncd/daemon/filetask.py: the machine's read plan, then a snapshot)."""

from __future__ import annotations

from syncd.core import recordkinds
from syncd.core.events import Event, Snapshot
from syncd.core.filemachine import FileMachine
from syncd.core.records import Stat


class MemFile:
    def __init__(self, data: bytes = b"", inode: int = 1,
                 kind: str = recordkinds.LINES) -> None:
        self.data, self.inode, self.mtime, self.kind = bytearray(data), inode, 1, kind

    def write(self, data: bytes) -> None:
        self.data += data
        self.mtime += 1

    def truncate(self, size: int) -> None:
        del self.data[size:]
        self.mtime += 1

    def snapshot(self, m: FileMachine, event: Event) -> Snapshot:
        plan = m.reads_for(event)
        reads = {(a, b): bytes(self.data[a:b]) for a, b in plan.ranges}
        line_end = None
        if plan.line_end_from is not None:
            line_end = recordkinds.last_end(self.kind, bytes(self.data), plan.line_end_from,
                                            plan.record_start)
        st = Stat(1, self.inode, len(self.data), self.mtime, self.mtime)
        return Snapshot(st, reads, line_end)
