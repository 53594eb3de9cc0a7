"""The simulator for resources/: the real ResourceMachine on simulated directories and a lossy
broker, with the writer's temp files, renames, rewrites, crashes and conflicting blobs.

Like world.py (the log's simulator): one thread, every choice from the seed, invariants
checked after every step, a failure replays from its seed (`python -m tests.sim --resources
--seed S -v`). The shell here does what syncd/daemon/resourcefiles.py does, on dicts:

- a host's directory maps published names to bytes; temp files (the writer's
  `.<name>.<n>.tmp`, syncd's `.<name>.syncd.tmp`) are kept apart, named for who made them;
- a scan reports names whose bytes changed since the shell last reported or installed them;
- an install checks the digest, then links (write-once: never over an existing name) or
  replaces only the sidecar the machine expected;
- what a power cut keeps is apart from what is read (`durable`): the writer never syncs, so
  its renames and their bytes may come back as before, as written, or empty (the rename kept,
  the data dropped); syncd's shell syncs a file and its directory before it announces it
  (`sync_before_announce`: the fix of issue #23 case 8) and an install before it counts.

Invariants (after every step): no host holds a temp file that neither its writer nor its own
syncd made; a write-once name's bytes never change on a host except by that host's own writer
or operator (or a power cut); the machine never asks to install a write-once name it already
holds. At a power cut: every file a host announces with the bytes it holds is durable there
(else the cut can turn it into an empty or old file, which the restart announces above the
version the peers hold). After
quiescence: every write-once name held with different bytes by two hosts is shown as a
conflict on both, at the true first differing offset; every other file is byte-identical on
every host; every sidecar equals the last bytes its writer wrote.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from syncd.core import frames
from syncd.core.resources import (
    Compare,
    Compared,
    Conflict,
    Connected,
    Discard,
    Effect,
    Event,
    FileKind,
    Install,
    Installed,
    InstallFailed,
    LocalFile,
    LocalGone,
    PeerItem,
    PeerManifest,
    PeerPresence,
    Refused,
    ResourceMachine,
    Rules,
    Save,
    Send,
    Serve,
    Tick,
    Write,
)
from tests.sim.world import Violation, run_or_explain

NAMES = ["artifacts/shake/s1.log", "artifacts/shake/s2.log", "artifacts/tool/t1",
         "assets/i1", "assets/i2"]


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass
class ResHost:
    name: str
    files: dict[str, bytes] = field(default_factory=dict)
    temps: dict[str, tuple[str, bytearray]] = field(default_factory=dict)  # path -> (maker, bytes)
    known: dict[str, bytes] = field(default_factory=dict)  # name -> digest reported/installed
    machine: ResourceMachine | None = None
    saved: list[frames.ResEntry] = field(default_factory=list)
    alive: bool = True
    online: bool = True
    # write-once names and the bytes first seen here (or written here by its own writer)
    once_seen: dict[str, bytes] = field(default_factory=dict)
    intents: dict[str, frames.ResEntry] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)  # ns, of the local writer's renames
    durable: dict[str, bytes] = field(default_factory=dict)  # what a power cut leaves of files
    # A file's (inode, size, mtime, ctime) as a number that every write changes, and the one
    # the shell last hashed or installed it at (its `idents`, saved with the manifest).
    stamps: dict[str, int] = field(default_factory=dict)
    idents: dict[str, int] = field(default_factory=dict)
    saved_idents: dict[str, int] = field(default_factory=dict)


class ResWorld:
    # The shell fsyncs a file and its directory before it announces it (resourcefiles.py).
    sync_before_announce = True

    def __init__(self, seed: int, hosts: int, steps: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.steps = steps
        self.now = 0.0
        self.faults = True
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.rules = Rules(max_file_bytes=self.rng.choice([300, 1 << 20]))
        self.chunk = self.rng.choice([16, 64, 4096])
        self.loss = self.rng.choice([0.0, 0.05, 0.2])
        self.dup = self.rng.choice([0.0, 0.05])
        self.hosts = {chr(ord("a") + i): ResHost(chr(ord("a") + i)) for i in range(hosts)}
        self.writer = "a"
        self.last_sidecar: dict[str, bytes] = {}  # name -> last bytes a writer wrote
        self.history: list[str] = []
        self.n = 0
        self.link_clock: dict[tuple[str, str], float] = {}
        self.pending: set[str] = set()  # names the writer is putting (temp file, rename due)
        self._stamp = 0

    def written(self, h: ResHost, name: str, data: bytes | None) -> None:
        """`name` now holds `data` (None: gone) on h's disk, as a new file."""
        self._stamp += 1
        if data is None:
            h.files.pop(name, None)
            h.stamps.pop(name, None)
        else:
            h.files[name] = data
            h.stamps[name] = self._stamp

    # -- plumbing ---------------------------------------------------------------------------

    def at(self, t: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (t, self._seq, action))

    def run_until(self, t: float) -> None:
        while self.queue and self.queue[0][0] <= t:
            when, _, action = heapq.heappop(self.queue)
            self.now = max(self.now, when)
            action()
            self.check_always()
        self.now = max(self.now, t)

    def log(self, text: str) -> None:
        self.history.append(f"{self.now:9.3f} {text}")

    def start(self, h: ResHost) -> None:
        m = ResourceMachine(h.name, self.rules, None, chunk_bytes=self.chunk, window=4 * self.chunk,
                            timeout=1.0)
        m.restore(h.saved)
        h.known = {e.name: e.digest for e in h.saved}
        h.idents = dict(h.saved_idents)
        for name, e in h.intents.items():
            if name in h.files and sha(h.files[name]) == e.digest:
                m.local[name] = e
                h.known[name] = e.digest
                h.idents[name] = h.stamps[name]
                if self.sync_before_announce:
                    h.durable[name] = h.files[name]  # _recover syncs what it takes back
        m.restore(m.local.values())
        # syncd's own temp files from the last run are removed at start (daemon/resourcefiles.py).
        h.temps = {p: v for p, v in h.temps.items() if v[0] != "syncd"}
        h.machine = m
        h.alive = True
        for peer in self.hosts:
            if peer != h.name:
                m.peers[peer] = PeerManifest()
                m.peers[peer].online = self.hosts[peer].alive and self.hosts[peer].online
        self.scan(h)
        self.deliver(h, Connected())

    def deliver(self, h: ResHost, event: Event) -> None:
        if not h.alive or h.machine is None:
            return
        self.perform(h, h.machine.handle(event, self.now))

    def send(self, h: ResHost, e: Send) -> None:
        targets = [e.to] if e.to else [n for n in self.hosts if n != h.name]
        for t in targets:
            if self.faults and self.rng.random() < self.loss:
                continue
            copies = 2 if self.faults and self.rng.random() < self.dup else 1
            for _ in range(copies):
                # MQTT keeps one sender's messages to one receiver in order (one topic).
                due = max(self.now + 0.005 + self.rng.random() * 0.05,
                          self.link_clock.get((h.name, t), 0.0))
                self.link_clock[(h.name, t)] = due
                item = PeerItem(h.name, e.payload)
                self.at(due, lambda t=t, item=item: self._arrive(h.name, t, item))

    def _arrive(self, sender: str, to: str, item: PeerItem) -> None:
        s, r = self.hosts[sender], self.hosts[to]
        if s.online and r.online and r.alive:
            self.deliver(r, item)

    def perform(self, h: ResHost, effects: list[Effect]) -> None:
        m = h.machine
        assert m is not None
        for e in effects:
            match e:
                case Send():
                    if h.online:
                        self.send(h, e)
                case Serve(peer, name, digest, _, offset, length):
                    data = h.files.get(name, b"")[offset:offset + length]
                    for at in range(0, len(data), self.chunk):
                        piece = data[at:at + self.chunk]
                        self.send(h, Send(frames.Kind.RDATA, frames.ResChunk(
                            name, digest, e.size, offset + at, piece), peer))
                case Write(name, offset, data, fresh):
                    path = _temp(name)
                    if fresh or path not in h.temps:
                        h.temps[path] = ("syncd", bytearray())
                    buf = h.temps[path][1]
                    buf[offset:offset + len(data)] = data
                case Install(entry, expect):
                    h.intents[entry.name] = entry  # saved before the rename, as the shell does
                    self.install(h, entry, expect)
                case Discard(name):
                    h.temps.pop(_temp(name), None)
                case Compare(name, theirs, offset, data):
                    ours = h.files.get(name, b"")[offset:offset + len(data)]
                    differ = None
                    if ours != data:
                        n = min(len(ours), len(data))
                        differ = offset + next((i for i in range(n) if ours[i] != data[i]), n)
                    ev = Compared(name, theirs, offset + len(data), differ)
                    self.at(self.now, lambda ev=ev: self.deliver(h, ev))
                case Conflict(name, peer, offset):
                    self.log(f"{h.name} conflict {name} with {peer} at {offset}")
                case Refused():
                    pass
                case Save():
                    h.saved = list(m.local.values())
                    h.saved_idents = dict(h.idents)
                    h.intents = {n: i for n, i in h.intents.items() if m.local.get(n) != i}

    def install(self, h: ResHost, entry: frames.ResEntry, expect: frames.ResEntry | None) -> None:
        m = h.machine
        assert m is not None
        name = entry.name
        tmp = h.temps.pop(_temp(name), None)
        kind = self.rules.kind(name)
        if kind is FileKind.ONCE and name in m.local:
            raise Violation(f"{h.name}'s machine asks to install write-once {name} it holds")
        fail = None
        if tmp is None or sha(bytes(tmp[1])) != entry.digest:
            fail = "digest"
        elif expect is None and name in h.files:
            fail = "exists"
        elif expect is not None and (name not in h.files or sha(h.files[name]) != expect.digest
                                     or h.known.get(name) != expect.digest):
            fail = "changed"
        if fail is not None:
            self.log(f"{h.name} install {name} failed: {fail}")
            ev: Event = InstallFailed(name, fail)
        else:
            assert tmp is not None
            self.written(h, name, bytes(tmp[1]))
            h.idents[name] = h.stamps[name]
            h.durable[name] = h.files[name]  # the temp file, then its directory, synced
            h.mtimes[name] = int((1_800_000_000 + self.now) * 1e9)
            h.known[name] = entry.digest
            if kind is FileKind.ONCE:
                h.once_seen.setdefault(name, h.files[name])
            ev = Installed(entry)
        self.at(self.now, lambda: self.deliver(h, ev))

    def scan(self, h: ResHost) -> None:
        if not h.alive or h.machine is None:
            return
        for name, data in sorted(h.files.items()):
            if h.idents.get(name) != h.stamps[name] or name not in h.machine.local:
                if len(data) <= self.rules.max_file_bytes:
                    h.known[name] = sha(data)
                    h.idents[name] = h.stamps[name]
                    if self.sync_before_announce:
                        h.durable[name] = data
                self.deliver(h, LocalFile(name, len(data), sha(data), h.mtimes.get(name, 0)))
        for name in sorted(set(h.machine.local) - set(h.files)):
            h.known.pop(name, None)
            h.idents.pop(name, None)
            self.deliver(h, LocalGone(name))

    def sweep(self) -> None:
        for h in self.hosts.values():
            if h.alive:
                self.scan(h)
                if h.machine is not None and h.machine.due(self.now):  # as the shell does
                    self.deliver(h, Tick())
        self.at(self.now + 0.5, self.sweep)

    # -- what writers and faults do ---------------------------------------------------------

    def blob(self) -> bytes:
        self.n += 1
        return (f"blob-{self.n}-".encode() * self.rng.randrange(1, 40))[: self.rng.choice(
            [0, 5, 100, 400, 2000])]

    def put_temp(self, h: ResHost, name: str, data: bytes) -> str:
        self.n += 1
        path = f"{name.rsplit('/', 1)[0]}/.{name.rsplit('/', 1)[1]}.{self.n}.tmp"
        h.temps[path] = ("writer", bytearray(data))
        return path

    def rename(self, h: ResHost, path: str, name: str) -> None:
        self.pending.discard(name)
        made = h.temps.pop(path, None)
        if made is None:
            return
        self.written(h, name, bytes(made[1]))
        h.mtimes[name] = int((1_800_000_000 + self.now) * 1e9)
        if self.rules.kind(name) is FileKind.ONCE:
            h.once_seen[name] = h.files[name]  # its own writer's doing
        elif h.name == self.writer:
            self.last_sidecar[name] = h.files[name]
        if h.alive and self.rng.random() < 0.7:
            self.scan(h)  # the watcher's hint; otherwise the sweep finds it

    def write_blob(self) -> None:
        h = self.hosts[self.writer]
        name = self.rng.choice(NAMES)
        if name in h.files or name in self.pending:
            return  # written once
        self.pending.add(name)
        data = self.blob()
        path = self.put_temp(h, name, data)
        if self.faults and self.rng.random() < 0.15:
            self.pending.discard(name)
            self.log(f"{h.name} writer killed between temp and rename of {name}")
            return  # the temp file stays; the writer puts the name again later
        self.at(self.now + self.rng.random() * 0.05, lambda: self.rename(h, path, name))
        self.log(f"{h.name} writes {name} ({len(data)} bytes)")
        self.at(self.now + 0.06, lambda: self.write_sidecar(h, name))

    def write_sidecar(self, h: ResHost, blob: str) -> None:
        if h.name != self.writer:
            return
        name = blob + ".json"
        self.n += 1
        data = f'{{"n":{self.n},"pad":"{"x" * self.rng.randrange(0, 80)}"}}'.encode()
        path = self.put_temp(h, name, data)
        self.log(f"{h.name} rewrites {name}")
        self.rename(h, path, name)

    def conflicting_blob(self) -> None:
        others = [n for n in self.hosts if n != self.writer]
        h = self.hosts[self.rng.choice(others)]
        name = self.rng.choice(NAMES)
        if name in h.files:
            return
        data = self.blob() + b"!"
        self.log(f"{h.name} (not the writer) writes its own {name}")
        self.rename(h, self.put_temp(h, name, data), name)

    def crash(self) -> None:
        h = self.hosts[self.rng.choice(sorted(self.hosts))]
        if not h.alive:
            return
        self.log(f"{h.name} syncd killed")
        self.crash_host(h)

    def crash_host(self, h: ResHost) -> None:
        h.alive = False
        h.machine = None
        for peer in self.hosts.values():
            if peer.alive and peer.machine is not None and peer is not h:
                self.deliver(peer, PeerPresence(h.name, False))
        self.at(self.now + self.rng.random() * 2, lambda: self.restart(h))

    def power_cut(self) -> None:
        """The host loses power: its syncd dies, and every file returns to what was durable,
        or is kept as written, or (its rename kept, its data dropped) comes back empty."""
        h = self.hosts[self.rng.choice(sorted(self.hosts))]
        if not h.alive or h.machine is None:
            return
        for name, e in sorted(h.machine.local.items()):
            data = h.files.get(name)
            if data is not None and sha(data) == e.digest and h.durable.get(name) != data:
                raise Violation(f"{h.name} announced {name} ({len(data)} bytes) before it was "
                                "durable: a power cut can bring it back empty or old")
        self.log(f"{h.name} power cut")
        self.crash_host(h)
        for name in sorted(set(h.files) | set(h.durable)):
            now, kept = h.files.get(name), h.durable.get(name)
            if now == kept:
                continue
            outcomes = [kept, now] + ([b""] if now else [])
            pick = self.rng.choice(outcomes)
            self.log(f"{h.name} after the cut: {name} is "
                     f"{'gone' if pick is None else f'{len(pick)} bytes'}")
            self.written(h, name, pick)
            if pick is None:
                h.durable.pop(name, None)
            else:
                h.durable[name] = pick
            if self.rules.kind(name) is FileKind.ONCE:
                if pick is None:
                    h.once_seen.pop(name, None)
                else:
                    h.once_seen[name] = pick
            elif h.name == self.writer:  # what the writer holds now is its last put
                if pick is None:
                    self.last_sidecar.pop(name, None)
                else:
                    self.last_sidecar[name] = pick
        h.temps = {}  # nobody synced them

    def restart(self, h: ResHost) -> None:
        if h.alive:
            return
        self.log(f"{h.name} syncd restarts")
        self.start(h)
        for peer in self.hosts.values():
            if peer.alive and peer is not h:
                self.deliver(peer, PeerPresence(h.name, True))

    def partition(self) -> None:
        h = self.hosts[self.rng.choice(sorted(self.hosts))]
        h.online = not h.online
        self.log(f"{h.name} {'online' if h.online else 'offline'}")
        for peer in self.hosts.values():
            if peer is not h:
                self.deliver(peer, PeerPresence(h.name, h.online))
                self.deliver(h, PeerPresence(peer.name, h.online and peer.online))

    def delete(self) -> None:
        h = self.hosts[self.rng.choice(sorted(self.hosts))]
        if h.files:
            name = self.rng.choice(sorted(h.files))
            self.log(f"operator deletes {name} on {h.name}")
            self.written(h, name, None)
            h.durable.pop(name, None)  # the operator's deletion is for good
            h.once_seen.pop(name, None)
            if h.name == self.writer:
                # The writer's last put may have existed only here: what comes back is the
                # newest version a peer holds.
                self.last_sidecar.pop(name, None)

    def failover(self) -> None:
        """The writer moves to a host that holds every sidecar the writer holds (READY)."""
        w = self.hosts[self.writer]
        for n, h in sorted(self.hosts.items()):
            if n != self.writer and h.alive and all(
                    h.files.get(k) == v for k, v in w.files.items() if k.endswith(".json")):
                self.log(f"failover {self.writer} -> {n}")
                self.writer = n
                return

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.45:
            self.write_blob()
        elif r < 0.6:
            h = self.hosts[self.writer]
            blobs = [n for n in h.files if not n.endswith(".json")]
            if blobs:
                self.write_sidecar(h, self.rng.choice(sorted(blobs)))
        elif r < 0.68:
            self.conflicting_blob()
        elif r < 0.74:
            self.crash()
        elif r < 0.78:
            self.power_cut()
        elif r < 0.88:
            self.partition()
        elif r < 0.93:
            self.delete()
        else:
            self.failover()

    # -- invariants -------------------------------------------------------------------------

    def check_always(self) -> None:
        for h in self.hosts.values():
            for path, (maker, _) in h.temps.items():
                if maker not in ("writer", "syncd"):
                    raise Violation(f"{h.name} holds temp file {path} made by {maker}")
            for name in h.files:
                if self.rules.kind(name) is None:
                    raise Violation(f"{h.name} holds {name}, a file that must not travel")
            for name, first in h.once_seen.items():
                if name in h.files and h.files[name] != first:
                    raise Violation(f"{h.name}'s write-once {name} changed bytes")

    def check_quiet(self) -> None:
        live = [h for h in self.hosts.values() if h.machine is not None]
        names = sorted({n for h in live for n in h.files})
        for name in names:
            held = {h.name: h.files[name] for h in live if name in h.files}
            kind = self.rules.kind(name)
            if any(len(v) > self.rules.max_file_bytes for v in held.values()):
                continue  # refused everywhere, named in status
            if kind is FileKind.ONCE and len(set(held.values())) > 1:
                for a, da in held.items():
                    for b, db in held.items():
                        if da == db:
                            continue
                        m = self.hosts[a].machine
                        assert m is not None
                        shown = [c for c in m.conflicts() if c.name == name and c.peer == b]
                        n = min(len(da), len(db))
                        first = next((i for i in range(n) if da[i] != db[i]), n)
                        if not shown or shown[0].offset != first:
                            raise Violation(f"{a} and {b} hold different {name}, {a} shows "
                                            f"{shown} (first difference at {first})")
                continue
            if kind is FileKind.ONCE:
                if len(held) != len(live):
                    raise Violation(f"{name} is on {sorted(held)} only, not on every host")
                continue
            # Sidecars: identical everywhere, and the writer's last bytes; the sidecar of a
            # write-once name in conflict follows the same rule (it is replaced whole).
            if len(held) != len(live) or len(set(held.values())) != 1:
                raise Violation(f"sidecar {name} differs: "
                                f"{ {k: sha(v).hex()[:8] for k, v in held.items()} }")
            last = self.last_sidecar.get(name)
            if last is not None and set(held.values()) != {last}:
                raise Violation(f"sidecar {name} is not the writer's last put")

    def run(self) -> None:
        for h in self.hosts.values():
            self.at(0.0, lambda h=h: self.start(h))
        self.at(0.5, self.sweep)
        t = 0.0
        for _ in range(self.steps):
            t += self.rng.expovariate(10.0)
            self.run_until(t)
            self.step()
        self.faults = False
        self.log("quiet")
        for h in self.hosts.values():
            if not h.alive:
                self.restart(h)
            if not h.online:
                h.online = True
                for peer in self.hosts.values():
                    if peer is not h:
                        self.deliver(peer, PeerPresence(h.name, True))
                        self.deliver(h, PeerPresence(peer.name, True))
        self.run_until(t + 40.0)
        self.check_quiet()


def _temp(name: str) -> str:
    folder, base = name.rsplit("/", 1)
    return f"{folder}/.{base}.syncd.tmp"


def run_seed(seed: int) -> ResWorld:
    rng = random.Random(seed)
    world = ResWorld(seed, hosts=rng.randrange(2, 5), steps=rng.randrange(10, 50))
    run_or_explain(world, seed, f"python -m tests.sim --resources --seed {seed} -v")
    return world
