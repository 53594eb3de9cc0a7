"""A deterministic world around the real per-file machine: simulated disks, broker and clock.

FoundationDB and TigerBeetle's VOPR test the real code this way: one thread, a seeded random
source decides every fault and every interleaving, and invariants are checked after every
step, so any failure replays exactly from its seed. Here each simulated host runs the real
`syncd.core.filemachine.FileMachine` behind a small shell that does what `syncd/daemon/filetask.py`
does with real files (reads planned bytes, performs effects, feeds results back), on a disk
that keeps written-but-unsynced bytes apart from durable ones (a power loss drops them).

Blocks are shrunk to BLOCK_SIM bytes while a world runs (`small_blocks`), so that a few lines
cross block boundaries, where the re-check of the end is most delicate.

A world's records are lines, or Zstandard frames (`records="zstd-frames"`: each "line" the
writer makes is then one checksummed frame holding it, as dsh-session writes; every rule
below that speaks of lines then speaks of frames: core/recordkinds.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import random
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from syncd.core import ledger as ledger_mod
from syncd.core import reconcile as reconcile_mod
from syncd.core import recordkinds, zstdframes
from syncd.core.events import (
    EMPTY,
    AdoptDone,
    AdoptRequested,
    Append,
    Appended,
    AppendFailed,
    Archive,
    Archived,
    Drained,
    Durable,
    Event,
    FindLine,
    IoFailed,
    LineFound,
    Loaded,
    Log,
    LogCheck,
    Look,
    LookAgain,
    NoteAppending,
    PeerData,
    PeerOnline,
    PeerPos,
    PeerRequest,
    Persist,
    Reassess,
    Reconnected,
    Redeliver,
    Rehash,
    Rehashed,
    Reload,
    ScrubMismatch,
    Send,
    Snapshot,
    Sync,
    Synced,
    Tick,
    peer_event,
)
from syncd.core.filemachine import (
    FileMachine,
    Mode,
    Tuning,
    loading,
    localfile,
    locating,
    serving,
)
from syncd.core.frames import Announce, Kind
from syncd.core.ledger import Ledger, digest_of
from syncd.core.reconcile import PeerState
from syncd.core.records import Appending, FileRecord, Stat
from tests.support import zstd

BLOCK_SIM = 64
PAGE_SIM = 16  # the page size for writes cut short (filemachine.PAGE)
KEY, FILE = "k", "events.jsonl"


@contextlib.contextmanager
def small_blocks(size: int = BLOCK_SIM) -> Iterator[None]:
    """Run with blocks of `size` bytes (the modules bound BLOCK at import: patch each)."""
    mods = (ledger_mod, loading, locating, serving, reconcile_mod)
    saved = [m.BLOCK for m in mods]
    pages = (localfile,)  # and the page size for writes cut short
    saved_pages = [m.PAGE for m in pages]
    for m in mods:
        m.BLOCK = size  # type: ignore[attr-defined]
    for m in pages:
        m.PAGE = PAGE_SIM
    try:
        yield
    finally:
        for m, v in zip(mods, saved, strict=True):
            m.BLOCK = v  # type: ignore[attr-defined]
        for m, v in zip(pages, saved_pages, strict=True):
            m.PAGE = v


class Violation(AssertionError):
    pass


class Killed(Exception):
    """The host's process died between two effects (kill -9 or a power loss mid-batch)."""


@dataclass
class SimFile:
    inode: int
    data: bytearray
    synced: bytes  # what survives a power loss
    mtime: int
    # Per byte: 1 if syncd appended it for a peer, 0 if a writer (or an operator) put it there.
    origin: bytearray = field(default_factory=bytearray)

    def stat(self) -> Stat:
        return Stat(1, self.inode, len(self.data), self.mtime, self.mtime)


@dataclass
class Stored:
    record: FileRecord
    chain: list[bytes]


@dataclass
class SimHost:
    name: str
    world: World
    file: SimFile | None = None
    machine: FileMachine | None = None
    alive: bool = False
    connected: bool = False
    inbox: deque[Event] = field(default_factory=deque)
    look_pending: bool = False
    look_full: bool = False  # the pending look is the commit gate's (FileTask.released)
    stored: Stored | None = None  # the record as written (survives a crash of the process)
    stored_durable: Stored | None = None  # what survives a power loss
    noted: Appending | None = None  # the `.appending` note (survives a crash)
    noted_durable: Appending | None = None  # what surely survives a power loss (synced)
    # [start, end) of the unsynced bytes the last power cut kept while it dropped the note
    # that covered them: a torn line of a peer's bytes there is refused (a false divergence,
    # accepted: the note is not synced per frame), never spliced.
    unvouched: tuple[int, int] | None = None
    # The file the log's directory names durably (a power loss brings that one back): set
    # by syncd's syncs (the shell fsyncs the directory at the first sync of each inode).
    entry: SimFile | None = None
    fail_reads: int = 0  # the next reads fail (EMFILE)
    fail_appends: int = 0  # the next appends fail (ENOSPC)
    look_failing: bool = False
    torn: bytes | None = None  # the rest of a line this host's writer has half written
    archives: list[bytes] = field(default_factory=list)
    announced: tuple[int, bytes] | None = None  # last position announced (durable)
    # An operator or writer changed bytes in place, truncated or replaced the file: what it
    # announced may have been edited away, not lost (the power-loss check then skips it).
    tampered: bool = False
    wakeup: float | None = None
    spins: int = 0  # wake-ups in a row that asked for a time already past
    checked_file: SimFile | None = None  # the file as check_always last read it
    checked_size: int = -1
    checked_mtime: int = -1
    # kill_mid: the process dies just before its crash_in-th next Append, Sync or Persist
    # (between an intent and its append, an append and its sync, a sync and its record...).
    crash_in: int = 0
    crash_power: bool = False
    # A busy shell: events pile up in the inbox and are handled back to back later, with no
    # Drained (and so no sync) between them, as when a burst of frames arrives at once.
    busy: bool = False

    # --- the shell: what daemon/filetask.py does, on simulated parts ------------------------------

    @property
    def m(self) -> FileMachine:
        assert self.machine is not None
        return self.machine

    def start(self) -> None:
        w = self.world
        self.alive = True
        self.machine = FileMachine(self.name, KEY, FILE, "symmetric", w.tuning,
                               online={h: w.hosts[h].connected for h in w.hosts if h != self.name},
                               records=w.records, settle=w.settle)
        self.inbox.clear()
        self.look_pending = False
        self.look_full = False
        self.busy = False
        try:
            self.handle(self.loaded())
        except Killed:
            return
        self.look_pending = True
        self.drain()
        w.connect(self)

    def deliver(self, event: Event) -> None:
        if not self.alive:
            return
        self.inbox.append(event)
        if self.busy:
            return
        w = self.world
        if w.faults and w.rng.random() < 0.2:
            self.busy = True
            machine = self.machine

            def later() -> None:
                if self.machine is machine:
                    self.busy = False
                    self.drain()
            w.at(w.now + w.rng.uniform(0.001, 0.01), later)
            return
        self.drain()

    def drain(self) -> None:
        if not self.alive:
            return
        guard = 0
        try:
            while self.inbox or self.look_pending:
                guard += 1
                if guard > 10_000:
                    raise Violation(f"{self.name}: the shell never drains (effects loop)")
                if self.inbox:
                    event = self.inbox.popleft()
                else:
                    self.look_pending = False
                    event = Look(full=self.look_full)
                    self.look_full = False
                self.handle(event)
            self.handle(Drained())
        except Killed:
            return
        self.world.arm(self)

    def handle(self, event: Event) -> None:
        w = self.world
        m = self.m
        plan = m.reads_for(event)
        f = self.file
        if isinstance(event, Look | PeerData) and self.fail_reads > 0:
            self.fail_reads -= 1
            if isinstance(event, Look):
                self.look_failing = True
            effects = m.handle(IoFailed(event, "Too many open files"), EMPTY, w.now, w.wall())
        else:
            reads = {}
            line_end = None
            if f is not None:
                for a, b in plan.ranges:
                    reads[(a, b)] = bytes(f.data[a:b]) if b > a else b""
                if plan.line_end_from is not None:
                    line_end = w.last_end(bytes(f.data), plan.line_end_from, plan.record_start)
            if isinstance(event, Look):
                self.look_failing = False
            snap = Snapshot(f.stat() if f else None, reads, line_end)
            effects = m.handle(event, snap, w.now, w.wall())
        self.check_isolation(event, effects)
        self.perform(effects)

    def check_isolation(self, event: Event, effects: list[Any]) -> None:
        """A peer whose copy diverged from ours gets nothing and gives nothing: no byte of it
        is appended here, none is served to it (unless an operator there adopts ours)."""
        m = self.m
        for e in effects:
            if (isinstance(e, Append) and e.peer in m.diverged
                    and m.mode is not Mode.ADOPTING):
                raise Violation(f"{self.name} appends bytes of {e.peer}, diverged from it")
            if (isinstance(e, Send) and e.kind is Kind.FILL and e.to in m.diverged
                    and not (isinstance(event, PeerRequest) and event.request.force)):
                raise Violation(f"{self.name} serves {e.to}, diverged from it")

    def perform(self, effects: list[Any]) -> None:
        w = self.world
        for e in effects:
            if self.crash_in and isinstance(e, Append | Sync | Persist):
                self.crash_in -= 1
                if not self.crash_in:
                    what = (f" of {len(e.data)} at {e.offset}" if isinstance(e, Append) else
                            f" (intent {e.record.intent})" if isinstance(e, Persist) else "")
                    power = " (power loss)" if self.crash_power else ""
                    torn = self.tear(e) if isinstance(e, Append) else 0
                    w.log(f"  {self.name} dies {'in' if torn else 'before'} "
                          f"{type(e).__name__}{what}"
                          f"{f' ({torn} bytes written)' if torn else ''}, "
                          f"{self.m.unsynced} unsynced{power}")
                    w._crash(self, power=self.crash_power)
                    raise Killed
            match e:
                case Send():
                    if e.kind is Kind.POS:
                        a = e.payload
                        assert isinstance(a, Announce)
                        # A frozen copy announces the history it held, not its file.
                        self.announced = (a.size, a.digest) if a.frozen is None else None
                    w.publish(self, e)
                case Append():
                    w.log(f"  {self.name} appends {len(e.data)} at {e.offset} from {e.peer}: "
                          f"{e.data[:12]!r}..{e.data[-12:]!r}")
                    self.handle(self.append(e))
                case Sync():
                    if self.file is not None:
                        self.file.synced = bytes(self.file.data)
                        if w.sync_new_entries:
                            self.entry = self.file
                    self.handle(Synced())
                case Persist():
                    chain = e.chain if e.chain is not None else (
                        self.stored.chain if self.stored else [])
                    self.stored = Stored(e.record, list(chain))
                    if e.durable and w.sync_record_dirs:  # else the rename is not durable
                        self.stored_durable = self.stored
                case Rehash():
                    self.handle(Rehashed(e.purpose, self.rehash(e), e.why))
                case Archive():
                    f = self.file
                    self.archives.append(bytes(f.data) if f else b"")
                    self.file = self.entry = None  # moved away, its directories synced
                    self.unvouched = None
                    self.torn = None  # the operator stopped this host's bot before adopting
                    self.tampered = True  # its history is replaced by another
                    self.handle(Archived(f"archive/{len(self.archives)}"))
                case FindLine():
                    data = bytes(self.file.data) if self.file else b""
                    self.handle(LineFound(e.peer, e.offset, self.world.record_number(data,
                                                                                     e.offset)))
                case LookAgain():
                    self.look_pending = True
                case Redeliver():
                    self.inbox.appendleft(e.event)
                case Reassess():
                    self.inbox.append(e)
                case Reload():
                    self.handle(self.loaded())
                case NoteAppending():
                    self.noted = e.appending
                    if e.durable or w.sync_notes:
                        self.noted_durable = e.appending
                case AdoptDone():
                    w.check_adopted(self, e)
                case Log():
                    self.check_torn_verdict(e.message)
                case Durable() | LogCheck():
                    pass
                case _:
                    raise Violation(f"unknown effect {e!r}")

    def check_torn_verdict(self, message: str) -> None:
        """Bytes syncd appended for a peer are never taken for a local writer's torn line
        (unless this host's history was tampered with: a wiped state forgets the intent)."""
        found = re.search(r"unfinished local line past offset (\d+) \((\d+) bytes\)", message)
        f = self.file
        if found is None or f is None or self.tampered:
            return
        at, n = int(found[1]), int(found[2])
        if n and all(f.origin[at: at + n]):
            if self.unvouched and self.unvouched[0] < at + n <= self.unvouched[1]:
                # Ends in a tail a power cut kept without its note: allowed, and counted.
                self.world.unvouched += 1
                self.world.log(f"  {self.name} refuses a page-cut tail whose note a power cut "
                               f"dropped: {n} bytes at {at} (allowed)")
                return
            raise Violation(f"{self.name} took {n} bytes it had appended for a peer at {at} "
                            f"for a local torn line (a false divergence): {message}")

    def append(self, e: Append) -> Event:
        w = self.world
        w.maybe_race(self)  # a writer or an operator may act between the look and the write
        f = self.file
        if e.inode is None:
            if f is not None:
                return AppendFailed("replaced", "created meanwhile")
            f = self.file = w.new_file()
        elif f is None or f.inode != e.inode[1]:
            return AppendFailed("replaced", "another file")
        if len(f.data) != e.offset:
            return AppendFailed("concurrent", f"size {len(f.data)}, expected {e.offset}")
        if self.fail_appends > 0:
            self.fail_appends -= 1
            return AppendFailed("full", "No space left on device")
        f.data += e.data
        f.origin += b"\x01" * len(e.data)
        f.mtime = w.tick_ns()
        return Appended(e.peer, e.data, f.stat())

    def loaded(self) -> Loaded:
        """What RecordFiles.load returns: the record, with the `.appending` note."""
        st = self.stored
        if st is None:
            return Loaded(None, [], appending=self.noted)
        return Loaded(dataclasses.replace(st.record, appending=self.noted), list(st.chain))

    def tear(self, e: Append) -> int:
        """Killed in the middle of the write() of an append: the kernel stops between two
        pages, so the bytes up to a page boundary inside it are in the file (half the time).
        Returns how many."""
        f = self.file
        if (f is None or len(f.data) != e.offset or (e.inode is not None and f.inode !=
                                                      e.inode[1])
                or self.world.rng.random() < 0.5):
            return 0
        first = e.offset - e.offset % PAGE_SIM + PAGE_SIM
        cuts = range(first, e.offset + len(e.data), PAGE_SIM)
        if not cuts:
            return 0
        n = self.world.rng.choice(cuts) - e.offset
        f.data += e.data[:n]
        f.origin += b"\x01" * n
        f.mtime = self.world.tick_ns()
        return n

    def rehash(self, e: Rehash) -> Ledger | None:
        f = self.file
        if f is None:
            return None
        end = len(f.data)
        if e.whole_lines:
            end = max(self.world.last_end(bytes(f.data)), min(e.hold, len(f.data)))
        led = Ledger(self.world.records)
        led.extend(bytes(f.data[:end]))
        return led


class World:
    # Issue #23 cases 9 and 10, each a switch for the tests that show the simulator catches
    # its absence: a durable record's rename made durable (its directory fsynced); the log's
    # directory entry synced with it. `sync_notes`: the `.appending` note before an append
    # survives every power cut (as if synced); off, as syncd does (no sync per frame), a
    # power cut keeps it or drops it (the kernel writes it back in its own time).
    sync_notes = False
    sync_record_dirs = True
    sync_new_entries = True
    # A power cut while syncd is down loses what was unsynced too (the writer's bytes, the
    # notes); False: it is a no-op, as when seed 7027257 was found (its replay needs that).
    cut_while_down = True

    def __init__(self, seed: int, hosts: int, steps: int, faults: bool = True,
                 records: str = recordkinds.LINES) -> None:
        self.seed = seed
        self.records = records
        self.frames = records == recordkinds.ZSTD_FRAMES
        self.rng = random.Random(seed)
        # What a power cut leaves of unsynced pages: drawn apart, so that a seed's faults and
        # interleavings stay what they were before power cuts kept a tail.
        self.disk_rng = random.Random(seed ^ 0x5EED_D15C)
        # A frames world's writer is dsh-session: its records wait for the file to settle.
        self.settle = self.rng.choice([0.0, 0.05]) if self.frames else 0.0
        self.steps = steps
        self.faults = faults
        self.now = 0.0
        self.clock_offset = 1_800_000_000.0
        self._ns = 0
        self._inode = 100
        self._seq = 0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.tuning = Tuning(chunk_bytes=self.rng.choice([40, 64, 4096]), fetch_window=256,
                             request_timeout=1.0, persist_interval=2.0, reannounce=4.0)
        names = [chr(ord("a") + i) for i in range(hosts)]
        self.hosts = {n: SimHost(n, self) for n in names}
        self.written: set[bytes] = set()  # every whole line any writer (or operator) made
        self.active = names[0]
        self.broker_up = True
        self.retained: dict[str, Announce] = {}
        self.loss = self.rng.choice([0.0, 0.02, 0.1])
        self.dup = self.rng.choice([0.0, 0.02])
        self.history: list[str] = []
        self.unvouched = 0  # torn-line verdicts allowed in a tail whose note a power cut lost
        self.link_clock: dict[tuple[str, str], float] = {}
        self.line_no = 0

    # --- time and scheduling ------------------------------------------------------------------

    def wall(self) -> float:
        return self.now + self.clock_offset

    def tick_ns(self) -> int:
        self._ns += 1
        return int(self.wall() * 1e9) + self._ns

    def at(self, t: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (t, self._seq, action))

    def arm(self, h: SimHost) -> None:
        due = h.m.deadline() if h.machine else None
        if due is None or due == h.wakeup:
            return
        h.wakeup = due
        machine = h.machine

        if due <= self.now:
            h.spins += 1
            if h.spins > 1000:
                m = h.m
                raise Violation(f"{h.name} asks to be woken at {due:.4f} again and again and "
                                f"does nothing (mode {m.mode.value}, fetch {m.fetch}, trouble "
                                f"{m.failing}, settle {m.settle}, unsettled {m.unsettled}, "
                                f"locating {m.locating}, "
                                f"reload {m.reload_at}, announce {m.announce_due}, persist "
                                f"{m.last_persist} {m.record_dirty} {m.unsynced} "
                                f"{m.position.size} {m.held})")
        else:
            h.spins = 0

        def fire() -> None:
            if h.alive and h.machine is machine and h.wakeup == due:
                h.wakeup = None
                h.deliver(Tick())
        self.at(max(due, self.now), fire)

    def run_until(self, t: float) -> None:
        while self.queue and self.queue[0][0] <= t:
            when, _, action = heapq.heappop(self.queue)
            self.now = max(self.now, when)
            action()
            self.check_always()
        self.now = max(self.now, t)

    # --- disk ---------------------------------------------------------------------------------

    def new_file(self, data: bytes = b"") -> SimFile:
        self._inode += 1
        return SimFile(self._inode, bytearray(data), b"", self.tick_ns(), bytearray(len(data)))

    def line(self, host: str) -> bytes:
        self.line_no += 1
        pad = "x" * self.rng.randrange(0, 60)
        line = f'{{"id":"{host}-{self.line_no}","p":"{pad}"}}\n'.encode()
        if self.frames:
            line = zstd.frame(line)  # a record: one frame (its bytes hold 0x0A now and then)
        self.written.add(line)
        return line

    # --- records: lines, or frames ------------------------------------------------------------

    def last_end(self, data: bytes, start: int = 0, record_start: int | None = None) -> int:
        return recordkinds.last_end(self.records, data, start, record_start)

    def ends_record(self, data: bytes | bytearray) -> bool:
        return self.last_end(bytes(data)) == len(data) if self.frames else \
            data.endswith(b"\n")

    def records_of(self, data: bytes) -> list[bytes]:
        """The whole records of `data`, from its start (frames: up to any damage)."""
        if self.frames:
            return zstdframes.split(data)[0]
        return [r for r in data.splitlines(keepends=True) if r.endswith(b"\n")]

    def record_number(self, data: bytes, offset: int) -> int:
        if self.frames:
            return zstdframes.record_number(lambda at, n: data[at: at + n], offset)
        return 1 + data.count(b"\n", 0, offset)

    def record_ends(self, data: bytes) -> list[int]:
        ends, at = [], 0
        for r in self.records_of(data):
            at += len(r)
            ends.append(at)
        return ends

    def write(self, h: SimHost, data: bytes) -> None:
        if h.file is None:
            h.file = self.new_file()
        f = h.file
        if f.data and not f.data.endswith(b"\n") and not self.frames:
            # The bot appends whatever the file ends with (it does not look): onto a piece of
            # a peer's long line, say, after a failover mid-line. That line is the writer's
            # doing, not syncd's.
            start = f.data.rfind(b"\n") + 1
            cut = data.find(b"\n")
            if cut >= 0:
                self.written.add(bytes(f.data[start:]) + data[: cut + 1])
        h.file.data += data
        if self.frames and not self.ends_record(h.file.data[: len(h.file.data) - len(data)]):
            # The bot appends whatever the file ends with: onto a piece of a peer's long
            # frame, say. Whatever whole records that makes are the writer's doing.
            self._register_lines(h.file)
        h.file.origin += bytes(len(data))
        h.file.mtime = self.tick_ns()
        self.hint(h)

    def hint(self, h: SimHost, replaced: bool = False) -> None:
        # inotify: usually right away, sometimes late, sometimes never (the sweep finds it)
        r = self.rng.random()
        if replaced:
            self.at(self.now + 0.0005, lambda: h.deliver(Look(replaced=True)))
        elif r < 0.85:
            self.at(self.now + 0.0004, lambda: self.look(h, full=True))
        elif r < 0.95:
            self.at(self.now + 0.5, lambda: self.look(h, full=True))

    def look(self, h: SimHost, full: bool = False) -> None:
        """`full`: inotify's hint, released by the commit gate (FileTask.released), reads the
        bytes at once; the sweep's starts with the stat."""
        if h.alive and h.machine is not None:
            h.look_full = h.look_full or full
            h.look_pending = True
            h.drain()

    def sweep(self) -> None:
        for h in self.hosts.values():
            self.look(h)
        self.at(self.now + 1.0, self.sweep)

    # --- broker -------------------------------------------------------------------------------

    def publish(self, h: SimHost, e: Send) -> None:
        if not (self.broker_up and h.connected):
            return
        if e.retain:
            assert isinstance(e.payload, Announce)
            self.retained[h.name] = e.payload
        for other in self.hosts.values():
            if other is h or (e.to and e.to != other.name):
                continue
            self._send(h.name, other, e)

    def _send(self, sender: str, to: SimHost, e: Send) -> None:
        if self.faults and self.rng.random() < self.loss:
            return
        copies = 2 if self.faults and self.rng.random() < self.dup else 1
        for _ in range(copies):
            # One broker keeps each sender's frames in order for each receiver; now and then
            # (a bridge, a redelivery) one is late and overtaken.
            link = (sender, to.name)
            when = max(self.now + self.rng.uniform(0.0002, 0.003), self.link_clock.get(link, 0))
            if self.faults and self.rng.random() < 0.05:
                when += self.rng.uniform(0.01, 0.3)
            else:
                self.link_clock[link] = when
            event = peer_event(e.kind, sender, e.payload)
            if event is None:
                continue
            self.at(when, lambda ev=event: to.connected and to.deliver(ev))

    def connect(self, h: SimHost) -> None:
        if not self.broker_up or not h.alive or h.connected:
            return
        h.connected = True
        for other in self.hosts.values():
            if other is not h and other.connected:
                self.at(self.now + 0.001, lambda o=other: self._presence(o, h, True))
                h.inbox.append(PeerOnline(other.name, True))
        for sender, a in self.retained.items():
            if sender != h.name:
                h.inbox.append(PeerPos(sender, a))
        h.inbox.append(Reconnected())
        h.drain()

    def disconnect(self, h: SimHost) -> None:
        if not h.connected:
            return
        h.connected = False
        for other in self.hosts.values():
            if other is not h and other.connected:
                self.at(self.now + 0.001, lambda o=other: self._presence(o, h, False))

    def _presence(self, to: SimHost, about: SimHost, online: bool) -> None:
        # The node orders presence by connection (core/freshness.py): news that `about` went
        # offline arriving after it is back (a broker restart shorter than the delivery) is
        # stale, and dropped; so is news of a connection that ended meanwhile.
        if about.connected == online:
            to.deliver(PeerOnline(about.name, online))

    # --- faults -------------------------------------------------------------------------------

    def step(self) -> None:
        """One random action of the world: mostly the writer, now and then a fault."""
        r = self.rng.random()
        hosts = list(self.hosts.values())
        act = self.hosts[self.active]
        if r < 0.45 or not self.faults:
            if act.torn is not None:
                self.fault_torn(act)  # a writer finishes its line before writing another
            elif act.alive or self.rng.random() < 0.5:
                data = b"".join(self.line(act.name) for _ in range(self.rng.randrange(1, 4)))
                self.log(f"write {act.name} {len(data)}")
                self.write(act, data)
            return
        kind = self.rng.choice(FAULTS)
        target = self.rng.choice(hosts)
        self.log(f"{kind} {target.name}")
        getattr(self, "fault_" + kind)(target)

    def fault_torn(self, h: SimHost) -> None:
        if h.torn is not None:
            self.write(h, h.torn)
            h.torn = None
            return
        line = self.line(h.name)
        cut = self.rng.randrange(1, len(line) - 1)
        self.write(h, line[:cut])
        h.torn = line[cut:]

    def fault_second_writer(self, h: SimHost) -> None:
        if h.torn is not None:
            self.fault_torn(h)
            return
        self.write(h, self.line(h.name))  # split brain: another host's bot writes too

    def fault_failover(self, h: SimHost) -> None:
        self.active = h.name

    def fault_edit(self, h: SimHost) -> None:
        f = h.file
        # whole lines: what an operator edits
        end = (self.last_end(bytes(f.data)) - 1 if self.frames else f.data.rfind(b"\n")) \
            if f is not None else -1
        if f is None or end < 1:
            return
        # Near the end mostly (block boundaries), anywhere sometimes.
        lo = max(0, end - 2 * BLOCK_SIM) if self.rng.random() < 0.7 else 0
        at = self.rng.randrange(lo, end)
        if f.data[at] == ord("\n") and not self.frames:
            return
        f.data[at] = ord("E") if f.data[at] != ord("E") else ord("F")
        self._register_lines(f)
        f.mtime = self.tick_ns()
        h.tampered = True
        if self.rng.random() < 0.5 and h.torn is None:
            self.write(h, self.line(h.name))  # an edit followed at once by an append
        else:
            self.hint(h)

    def fault_truncate(self, h: SimHost) -> None:
        h.torn = None  # the writer starts again from what the file holds
        f = h.file
        if f is None or not f.data:
            return
        limit = self.rng.randrange(0, len(f.data))
        if self.frames:
            cut = max([0, *(e for e in self.record_ends(bytes(f.data)) if e <= limit)]) - 1
        else:
            cut = f.data.rfind(b"\n", 0, limit)
        del f.data[cut + 1:]
        del f.origin[cut + 1:]
        f.synced = f.synced[: len(f.data)]
        f.mtime = self.tick_ns()
        h.tampered = True
        self.hint(h)

    def fault_clear(self, h: SimHost) -> None:
        h.torn = None  # the writer starts again from what the file holds
        if h.file is None:
            return
        h.file = None  # the writer's clear(): deleted; the next append recreates it
        h.tampered = True
        self.hint(h, replaced=True)
        if self.rng.random() < 0.5:
            self.write(h, self.line(h.name))  # the next append recreates it

    def fault_rename_over(self, h: SimHost) -> None:
        h.torn = None  # the writer starts again from what the file holds
        f = h.file
        size = len(f.data) if f else 0
        data = bytearray()
        while len(data) < size:
            data += self.line(h.name)
        new = self.new_file(bytes(data[:size]))
        new.synced = bytes(new.data)
        if size and not self.ends_record(new.data):
            self._register_lines(new)
        h.file = new
        h.tampered = True
        if self.rng.random() < 0.7:
            self.hint(h, replaced=True)

    def fault_emfile(self, h: SimHost) -> None:
        h.fail_reads = self.rng.randrange(1, 6)
        self.hint(h)

    def fault_enospc(self, h: SimHost) -> None:
        h.fail_appends = self.rng.randrange(1, 4)

    def fault_kill(self, h: SimHost) -> None:
        self._crash(h, power=False)

    def fault_kill_mid(self, h: SimHost) -> None:
        if h.alive:
            h.crash_in = self.rng.randrange(1, 12)
            h.crash_power = self.rng.random() < 0.3

    def fault_power(self, h: SimHost) -> None:
        self._crash(h, power=True)

    def fault_wipe_state(self, h: SimHost) -> None:
        self._crash(h, power=False)
        h.stored = h.stored_durable = h.noted = h.noted_durable = None
        h.tampered = True  # its history restarts from the file as it is (torn pieces out)

    def _crash(self, h: SimHost, power: bool) -> None:
        if power and (h.alive or self.cut_while_down):
            self._power_cut(h)  # also while syncd is down: its unsynced state is lost too
        if not h.alive:
            return
        h.alive = False
        h.crash_in = 0
        h.machine = None
        h.wakeup = None
        h.torn = None
        self.disconnect(h)
        self.at(self.now + self.rng.uniform(0.05, 2.0), h.start)

    def _power_cut(self, h: SimHost) -> None:
        """What a power loss leaves: the file the directory durably names (an unsynced new
        entry or rename is lost), its synced bytes and maybe some pages past them (the
        kernel writes dirty pages back in its own time: a page-cut tail), the records and
        the note as last made durable."""
        f = h.entry
        if h.announced and not h.tampered:
            size, digest = h.announced
            if size and (f is None or len(f.synced) < size
                         or digest_of(f.synced[:size]) != digest):
                raise Violation(f"{h.name} announced {size} bytes that a power loss did not "
                                "leave on its disk")
        tail = 0  # where the unsynced bytes the cut kept start
        if f is not None:
            keep = tail = len(f.synced)
            if self.disk_rng.random() < 0.5 and len(f.data) > keep:
                cuts = [*range(keep - keep % PAGE_SIM + PAGE_SIM, len(f.data), PAGE_SIM),
                        len(f.data)]
                keep = self.disk_rng.choice(cuts)
            f.data = bytearray(f.synced + bytes(f.data[len(f.synced): keep]))
            del f.origin[len(f.data):]
            f.synced = bytes(f.data)  # what is on the disk now
            self.log(f"  {h.name} power cut: {len(f.data)} bytes left")
        earlier = h.unvouched if f is h.file and f is not None else None
        if f is not h.file:
            h.tampered = h.tampered or h.file is not None  # the name's old file is back
        h.file = f
        h.torn = None  # the writer's half line: gone with its process
        h.stored = h.stored_durable
        note = h.noted_durable
        if h.noted != note and self.disk_rng.random() < 0.5:
            note = h.noted  # the unsynced note was written back before the cut
        if f is not None and note != h.noted and len(f.data) > tail:
            h.unvouched = (tail, len(f.data))
        else:  # an earlier cut's tail, not judged yet, while this cut left it there
            h.unvouched = earlier if earlier and len(f.data) >= earlier[1] else None
        h.noted = h.noted_durable = note

    def fault_broker_restart(self, h: SimHost) -> None:
        self.broker_up = False
        for x in self.hosts.values():
            self.disconnect(x)
        if self.rng.random() < 0.5:
            self.retained.clear()  # no persistence

        def up() -> None:
            self.broker_up = True
            for x in self.hosts.values():
                self.connect(x)
        self.at(self.now + self.rng.uniform(0.05, 1.0), up)

    def fault_adopt(self, h: SimHost) -> None:
        m = h.machine
        if m is None or not (m.frozen or m.diverged):
            return
        others = [o for o in self.hosts.values() if o is not h and o.alive and o.connected]
        if not others:
            return
        winner = self.rng.choice(others)
        if winner.machine is None or winner.name not in m.peers:
            return
        # The ticket says what was asked: requests may overlap (a later one supersedes).
        h.deliver(AdoptRequested(winner.name, (winner.name, winner.m.position.size)))

    def maybe_race(self, h: SimHost) -> None:
        """Between the shell's look and its write, the local writer may strike."""
        if self.faults and self.rng.random() < 0.02:
            kind = self.rng.choice(["second_writer", "rename_over", "clear", "edit"])
            self.log(f"race {kind} {h.name}")
            getattr(self, "fault_" + kind)(h)

    def _register_lines(self, f: SimFile) -> None:
        self.written.update(self.records_of(bytes(f.data)))

    def log(self, text: str) -> None:
        self.history.append(f"{self.now:9.4f} {text}")

    # --- invariants ---------------------------------------------------------------------------

    def check_always(self) -> None:
        for h in self.hosts.values():
            f = h.file
            if f is not None and (f is not h.checked_file or len(f.data) != h.checked_size
                                  or f.mtime != h.checked_mtime):
                h.checked_file, h.checked_size, h.checked_mtime = f, len(f.data), f.mtime
                for line in self.records_of(bytes(f.data)):
                    if line not in self.written:
                        raise Violation(f"{h.name} holds a line nobody wrote: {line[:80]!r}")
            if (h.alive and h.machine is not None and h.look_failing
                    and h.m.state_word() in ("in_sync", "ahead", "behind", "alone")):
                raise Violation(f"{h.name} says {h.m.state_word()} while its look fails")

    def check_adopted(self, h: SimHost, e: AdoptDone) -> None:
        if "error" in e.result:
            return
        winner, floor = cast(tuple[str, int], e.ticket)
        w = self.hosts[winner]
        if h.m.position.size < floor and not w.tampered:
            raise Violation(f"{h.name} finished adopting {winner}'s copy at "
                            f"{h.m.position.size} bytes; {winner} held {floor} when asked")

    def describe(self) -> str:
        rows = []
        for h in self.hosts.values():
            if h.machine is None:
                rows.append(f"    {h.name}: down")
                continue
            m = h.m
            peers = ", ".join(f"{p}={v.position.size} {v.state.value}"
                              f"{' frozen:' + v.frozen if v.frozen else ''}"
                              for p, v in sorted(m.peers.items()))
            rows.append(f"    {h.name}: {m.mode.value} {m.state_word()} held {m.held} file "
                        f"{len(h.file.data) if h.file else None} freeze "
                        f"{m.freeze.detail if m.freeze else None} diverged "
                        f"{sorted(m.diverged)} | {peers}")
        return "\n".join(rows)

    def check_quiet(self) -> None:
        try:
            self._check_quiet()
        except Violation as v:
            raise Violation(f"{v}\n  at the end:\n{self.describe()}") from None

    def _check_quiet(self) -> None:
        """After faults stop and the world settles: the copies tell the truth and converge."""
        live = [h for h in self.hosts.values() if h.alive and h.machine is not None]
        for h in live:
            m = h.m
            if m.ledger is not None and m.mode in (Mode.LIVE, Mode.FROZEN):
                data = bytes(h.file.data) if h.file else b""
                if digest_of(data[: m.ledger.size]) != m.ledger.digest():
                    raise Violation(f"{h.name}'s ledger does not describe its file "
                                    f"({m.ledger.size} bytes) and nothing noticed")
            for peer, v in m.peers.items():
                # A frozen peer announces the history it held, not its file (status shows it
                # frozen): only an unfrozen peer said in_sync must hold our bytes.
                if v.state is PeerState.IN_SYNC and m.frozen is None and v.frozen is None:
                    p = self.hosts[peer]
                    mine = bytes(h.file.data[: m.position.size]) if h.file else b""
                    theirs = bytes(p.file.data[: m.position.size]) if p.file else b""
                    if mine != theirs:
                        raise Violation(f"{h.name} says {peer} is in_sync at "
                                        f"{m.position.size} bytes but the copies differ")
        for h in live:
            if h.m.ledger is None:
                continue  # reset: it knows no history to compare any more
            for peer in h.m.diverged:
                p = self.hosts[peer]
                mine = bytes(h.file.data[: h.m.held]) if h.file else b""
                held = p.m.held if p.machine is not None else 0
                theirs = bytes(p.file.data[:held]) if p.file else b""
                if theirs.startswith(mine) or mine.startswith(theirs):
                    # Their recorded histories agree: a false alarm from a refusal about a
                    # history since replaced, or about a torn line the peer's writer left
                    # (and the peer forgot, its state wiped). Safe: nothing was overwritten.
                    continue
                # Shown there as a divergence with h itself (or it is frozen for a local
                # reason, or adopting: its own history is in question anyway).
                if (p.alive and p.machine is not None and h.name not in p.m.diverged
                        and p.m.frozen is None and p.m.mode is not Mode.ADOPTING):
                    raise Violation(f"{h.name} diverged from {peer}, but {peer} shows no fork")
        unfrozen = [h for h in live if h.m.frozen is None and h.m.mode is Mode.LIVE]
        copies = {}
        for h in unfrozen:
            data = bytes(h.file.data) if h.file else b""
            if self.last_end(data, h.m.held) > h.m.held if self.frames else \
                    b"\n" in data[h.m.held:]:
                raise Violation(f"{h.name} never took in a whole line past {h.m.held}")
            copies[h.name] = data[: h.m.held]  # past it: a crashed writer's torn line
        # A divergence isolates the two hosts from each other only: every other pair of live
        # copies converges (a split brain ends with each host on the side that reached it
        # first, diverged from the other side).
        for h in unfrozen:
            for p in unfrozen:
                if (h.name < p.name and p.name not in h.m.diverged
                        and h.name not in p.m.diverged and copies[h.name] != copies[p.name]):
                    raise Violation(f"{h.name} and {p.name}, not diverged from each other, did "
                                    f"not converge: {len(copies[h.name])} and "
                                    f"{len(copies[p.name])} bytes")

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> None:
        with small_blocks():
            for h in self.hosts.values():
                self.at(0.0, h.start)
            self.at(1.0, self.sweep)
            t = 0.0
            for _ in range(self.steps):
                t += self.rng.expovariate(20.0)
                self.run_until(t)
                self.step()
            # Quiet: faults stop, torn lines complete, everyone comes back, time passes.
            self.faults = False
            self.log("quiet")
            for h in self.hosts.values():
                h.crash_in = 0  # an armed kill_mid is a fault too
            self.run_until(t + 3.0)
            for h in self.hosts.values():
                h.fail_reads = h.fail_appends = 0
                if h.torn is not None:
                    self.write(h, h.torn)
                    h.torn = None
            self.run_until(t + 6.0)
            for h in self.hosts.values():
                if h.alive and h.machine is not None and h.m.ledger is not None:
                    data = bytes(h.file.data) if h.file else b""
                    led = h.m.ledger
                    if digest_of(data[: led.size]) != led.digest():
                        h.deliver(ScrubMismatch())  # what the background scrub finds
            self.run_until(t + 15.0)
            self.check_quiet()


FAULTS = ["torn", "second_writer", "failover", "edit", "truncate", "clear", "rename_over",
          "emfile", "enospc", "kill", "kill_mid", "power", "wipe_state", "broker_restart",
          "adopt"]


def run_seed(seed: int, records: str = recordkinds.LINES) -> World:
    """One seeded history; raises Violation (with the seed) if an invariant breaks."""
    rng = random.Random(seed)
    world = World(seed, hosts=rng.randrange(2, 6), steps=rng.randrange(15, 60), records=records)
    more = "" if records == recordkinds.LINES else f" --records {records}"
    run_or_explain(world, seed, f"python -m tests.sim --seed {seed}{more} -v")
    return world


def run_or_explain(world: Any, seed: int, replay: str) -> None:
    """Run a seeded world; a broken invariant names the seed, how to replay it and the last
    steps (both simulators)."""
    try:
        world.run()
    except Violation as v:
        tail = "\n".join(world.history[-25:])
        raise Violation(f"seed {seed}: {v}\n  replay: {replay}\n  last steps:\n{tail}"
                        ) from None


__all__ = ["FAULTS", "Violation", "World", "dataclasses", "run_seed"]
