"""An in-memory log file for the machine's unit tests, read the way the shell reads a real one
(syncd/daemon/filetask.py: the machine's read plan, then a snapshot)."""

from __future__ import annotations

from syncd.core import recordkinds
from syncd.core.events import (
    Append,
    Appended,
    Event,
    Loaded,
    Look,
    ReadPlan,
    Redeliver,
    Rehash,
    Rehashed,
    Send,
    Snapshot,
    Sync,
    Synced,
)
from syncd.core.filemachine import FileMachine, Mode, Tuning
from syncd.core.frames import Kind
from syncd.core.ledger import Ledger
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
        return self.read(m.reads_for(event))

    def read(self, plan: ReadPlan) -> Snapshot:
        """The file as the shell reads it for `plan` (for tests that drive one piece)."""
        reads = {(a, b): bytes(self.data[a:b]) for a, b in plan.ranges}
        line_end = None
        if plan.line_end_from is not None:
            line_end = recordkinds.last_end(self.kind, bytes(self.data), plan.line_end_from,
                                            plan.record_start)
        st = Stat(1, self.inode, len(self.data), self.mtime, self.mtime)
        return Snapshot(st, reads, line_end)


File = MemFile  # an in-memory file, read the way the shell reads the real one


def feed(m: FileMachine, f: File | None, event: Event, now: float = 1.0) -> list[object]:
    """Hand one event to the machine and carry out the effects that have results."""
    snap = f.snapshot(m, event) if f is not None else Snapshot()
    effects: list[object] = list(m.handle(event, snap, now, 1e9 + now))
    out = list(effects)
    for e in effects:
        if isinstance(e, Append) and f is not None:
            f.write(e.data)
            out += feed(m, f, Appended(e.peer, e.data, Stat(1, f.inode, len(f.data), f.mtime,
                                                               f.mtime)), now)
        elif isinstance(e, Sync):
            out += feed(m, f, Synced(), now)
        elif isinstance(e, Redeliver):
            out += feed(m, f, e.event, now)  # the shell puts it first in line
        elif isinstance(e, Rehash) and f is not None:
            ledger = Ledger()
            ledger.extend(bytes(f.data[: f.data.rfind(b"\n") + 1]))
            out += feed(m, f, Rehashed(e.purpose, ledger, e.why), now)
    return out


def live(data: bytes = b"", peers: tuple[str, ...] = ("b",)) -> tuple[FileMachine, File]:
    """A machine that holds `data` (already recorded), with peers online."""
    m = FileMachine("a", "k", "events.jsonl", "symmetric", Tuning(),
                online=dict.fromkeys(peers, True))
    f = File(data)
    feed(m, f, Loaded(None, []))
    feed(m, f, Look())
    assert m.mode is Mode.LIVE and m.held == len(data)
    return m, f


def sent(effects: list[object], kind: Kind) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and e.kind is kind]
