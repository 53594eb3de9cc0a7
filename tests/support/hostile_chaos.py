"""Chaos, hostile (issue #23): a listed host gone bad, and a local bot that plants traps.

    python -m tests.support.chaos --hostile --frames 10000 --plants 200   # the long mode

The cluster of the chaos suite (a writes, b and c replicate, resources are put and rewritten)
runs with a fourth listed host, x, whose key is real: tests/support/hostile.py sends bursts
of well-signed frames of every kind with extreme and random parameters (parts, counts, sizes,
offsets, names, nesting), the kind of thing only the contents can refuse. Between the bursts
the local bot on a and b plants what a bot that runs tools may be talked into: symbolic links
to the state directory, to syncd's identity key and to an /etc-like directory, deep trees,
unreadable directories, FIFOs, a device as a log, a key directory that is a link.

Checked, and printed as a summary:
- each victim's RSS growth over its idle figure (sampled every 0.2 s; bound 64 MiB);
- the bytes each victim sent x, counted on the broker side, against its budget
  (byte_burst + bytes_per_second x seconds + one window);
- no daemon exits;
- canary bytes (a file next to each state_dir, one in the /etc-like directory) and every
  host's identity key never appear in any host's runtimes or archive, nor in what x got;
- at each checkpoint every replicated copy is byte-identical to the writer's (logs and
  resources, as in the chaos suite), and at the end the planted instances' logs too.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import stat
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from syncd.core import frames
from syncd.core.frames import (
    Announce,
    Data,
    Item,
    Kind,
    Presence,
    Probe,
    Probed,
    ProbeWhat,
    Refuse,
    Request,
    ResAsk,
    ResChunk,
    ResList,
    ResRefuse,
    ResSum,
)
from syncd.core.ledger import Ledger
from syncd.ops.control import ControlError, query
from tests.support.chaos import KEY, Chaos, _content
from tests.support.cluster import Daemon, wait_until
from tests.support.hostile import HostilePeer, rss_kib
from tests.support.ishiki import ishiki_lines

MiB = 1 << 20
RSS_BOUND = 64 * MiB
EMPTY = Ledger().digest()
# The victims' limits: budgets small enough to see them hold, keys and memory bounded.
BYTES_PER_SECOND = 4 << 20
BYTE_BURST = 16 << 20
WINDOW = 4 << 20  # fetch_window_bytes: one answer larger than the bucket is served once
VICTIM_CONFIG = (
    "[limits]\n"
    "requests_per_second = 100\nrequest_burst = 1000\n"
    f"bytes_per_second = {BYTES_PER_SECOND}\nbyte_burst = {BYTE_BURST}\n"
    "max_keys = 1000\nmax_peer_bytes = 16777216\n"
    f'[keys."{KEY}"]\nwriters = ["a"]\n'
)
PLANTS = ["link_file", "link_dir", "link_resources", "link_log", "link_key_dir", "deep_tree",
          "deep_workspace", "unreadable_dir", "fifo", "device_log", "many_files"]


@dataclass
class HostileSummary:
    seed: int
    frames: Counter[str] = field(default_factory=Counter)  # by the first item's kind
    items: int = 0
    plants: Counter[str] = field(default_factory=Counter)
    rss: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (idle, peak) B
    sent: dict[str, int] = field(default_factory=dict)  # node -> bytes it sent x
    answers: dict[str, int] = field(default_factory=dict)  # node -> of which answers
    elapsed: float = 0.0  # seconds from the first hostile frame to the end
    exited: list[str] = field(default_factory=list)
    leaks_on_hosts: list[str] = field(default_factory=list)
    leaks_to_x: int = 0
    copies_checked: int = 0
    bytes_lost: int = 0
    bytes_changed: int = 0
    resources_checked: int = 0
    planted_logs_checked: int = 0
    refused: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> reason -> n
    # node -> (keys, keys made on x's word): each key costs memory (its replicas, resources)
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)
    aborted: str = ""  # a check that failed before the end (the figures are still taken)

    def budget(self) -> float:
        return BYTE_BURST + BYTES_PER_SECOND * self.elapsed + WINDOW

    def failures(self) -> list[str]:
        out = []
        for node, (idle, peak) in sorted(self.rss.items()):
            if peak - idle > RSS_BOUND:
                out.append(f"{node}'s RSS grew {(peak - idle) / MiB:.1f} MiB over idle")
        for node, sent in sorted(self.answers.items()):
            if sent > self.budget():
                out.append(f"{node} answered x with {sent} bytes, over its budget "
                           f"{self.budget():.0f}")
        if self.aborted:
            out.append(f"aborted: {self.aborted}")
        out += [f"{n} exited" for n in self.exited]
        out += [f"secret bytes in {where}" for where in self.leaks_on_hosts]
        if self.leaks_to_x:
            out.append(f"{self.leaks_to_x} frames to x held secret bytes")
        if self.bytes_lost or self.bytes_changed:
            out.append(f"{self.bytes_lost} bytes lost, {self.bytes_changed} changed")
        return out

    def table(self) -> str:
        rows = [f"hostile chaos seed {self.seed}: {sum(self.frames.values())} frames "
                f"({self.items} items) from x, {sum(self.plants.values())} plants"]
        rows += [f"  frames {kind:21} {n:6}" for kind, n in sorted(self.frames.items())]
        rows += [f"  plant  {kind:21} {n:6}" for kind, n in sorted(self.plants.items())]
        for node, (idle, peak) in sorted(self.rss.items()):
            rows.append(f"  {node}: RSS idle {idle / MiB:6.1f} MiB, peak {peak / MiB:6.1f} MiB, "
                        f"growth {(peak - idle) / MiB:5.1f} MiB (bound {RSS_BOUND // MiB})")
        for node, sent in sorted(self.sent.items()):
            rows.append(f"  {node}: sent x {sent / MiB:7.2f} MiB in {self.elapsed:.0f} s, "
                        f"answers {self.answers.get(node, 0) / MiB:.2f} MiB; budget "
                        f"{BYTE_BURST // MiB} MiB + {BYTES_PER_SECOND / MiB:g} MiB/s x "
                        f"{self.elapsed:.0f} s + one window = {self.budget() / MiB:.1f} MiB")
        for node, why in sorted(self.refused.items()):
            shown = ", ".join(f"{r} {n}" for r, n in sorted(why.items()))
            rows.append(f"  {node}: refused at the bounds: {shown or 'nothing'}")
        for node, (keys, by_x) in sorted(self.keys.items()):
            rows.append(f"  {node}: keys {keys}, made on x's word {by_x}")
        rows += [
            f"  {'daemons exited':28} {len(self.exited):6}",
            f"  {'secret bytes on hosts':28} {len(self.leaks_on_hosts):6}",
            f"  {'frames to x with secrets':28} {self.leaks_to_x:6}",
            f"  {'copies checked':28} {self.copies_checked:6}",
            f"  {'bytes lost':28} {self.bytes_lost:6}",
            f"  {'bytes changed':28} {self.bytes_changed:6}",
            f"  {'resource files checked':28} {self.resources_checked:6}",
            f"  {'planted logs checked':28} {self.planted_logs_checked:6}",
            f"  {'verdict':28} {'OK' if not self.failures() else '; '.join(self.failures())}",
        ]
        return "\n".join(rows)


class RssSampler(threading.Thread):
    """The largest RSS of each daemon since `reset()`, sampled from /proc every 0.2 s."""

    def __init__(self, daemons: dict[str, Daemon]) -> None:
        super().__init__(daemon=True)
        self.daemons = daemons
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()

    def sample(self) -> dict[str, int]:
        now = {}
        for n, d in self.daemons.items():
            if d.proc is not None and d.proc.poll() is None:
                with contextlib.suppress(OSError, KeyError):
                    now[n] = rss_kib(d.proc.pid)[0] * 1024
        return now

    def run(self) -> None:
        while not self._stop.wait(0.2):
            for n, rss in self.sample().items():
                self.peak[n] = max(self.peak.get(n, 0), rss)

    def stop(self) -> None:
        self._stop.set()


class Mallory:
    """Bursts of x's frames: every kind, extreme and random parameters, well signed."""

    def __init__(self, x: HostilePeer, rng: random.Random, summary: HostileSummary,
                 victims: list[str]) -> None:
        self.x, self.rng, self.summary, self.victims = x, rng, summary, victims
        self.new_keys = 0
        self.conn = 1
        # CHAOS_FRAME_LOG=<file>: one line per frame of x (time, kind, items, addressee,
        # bytes), to match a victim's memory trace against what x sent then.
        where = os.environ.get("CHAOS_FRAME_LOG", "")
        self.frame_log = open(where, "a") if where else None  # noqa: SIM115

    # -- names -------------------------------------------------------------------------------

    def key(self) -> str:
        r = self.rng
        return r.choice([
            KEY, KEY, f"{KEY}/workspace", f"{KEY}/resources/artifacts/shake",
            f"{KEY}/resources", f"squat-{r.randrange(1, 30)}/sub",
            f"squat-{r.randrange(1, 30)}",
            f"x-{r.randrange(0, 400)}", "a/b/c/d", "deep/" * 3 + "er",
            "é/ü/ß", "x" * 255, "emoji-\U0001f600", "with space", "-", "_",
        ])

    def res_name(self) -> str:
        r = self.rng
        known = [n for (k, n) in list(self.x.resources)]
        return r.choice([
            *(known[:20] or ["artifacts/shake/shake-1.log"]),
            "artifacts/x/" + "n" * r.randrange(1, 200),
            "artifacts/" + "d/" * r.randrange(1, 34) + "f",  # past 31: a rejected frame
            "assets/" + r.randbytes(8).hex(), "artifacts/tool/out.json",
            "artifacts/" + "é" * r.randrange(1, 60),
        ])

    def number(self) -> int:
        r = self.rng
        return r.choice([0, 1, r.randrange(0, 1 << 16), r.randrange(0, 1 << 32),
                         (1 << 63) - 1, 1 << 62, r.randrange(0, 1 << 63)])

    def digest(self) -> bytes:
        return self.rng.choice([EMPTY, bytes(32), self.rng.randbytes(32)])

    # -- items -------------------------------------------------------------------------------

    def item(self, kind: Kind) -> Item:
        r = self.rng
        key = self.key()
        file = "events.jsonl"
        match kind:
            case Kind.POS:
                body: frames.Payload = Announce(
                    self.number(), self.digest(), r.choice([None, "reset", "x" * 200]),
                    self.number() if r.random() < 0.1 else 0,
                    tuple(r.choice(["a", "b", "c", "x", "y" * 200])
                          for _ in range(r.choice([0, 0, 1, 1024]))))
            case Kind.LIVE | Kind.FILL:
                offset = r.choice([0, 0, self.number()])
                data = r.choice([b'{"id":"x"}\n', r.randbytes(r.randrange(1, 65536)),
                                 ishiki_lines(r.randrange(1, 20))])
                if offset == 0 and r.random() < 0.5:
                    key = f"x-{self.new_keys % 400}"  # a new key: bounded by max_keys
                    self.new_keys += 1
                body = Data(offset, EMPTY if offset == 0 else self.digest(), data)
            case Kind.REQ:
                body = Request(r.choice([0, self.number()]), self.digest(), self.number(),
                               self.number(), r.random() < 0.2, self.number() % 1000)
            case Kind.REFUSE:
                body = Refuse(self.number(), self.digest())
            case Kind.PROBE:
                body = Probe(r.choice(list(ProbeWhat)), self.number(), self.number())
            case Kind.PROBED:
                body = Probed(r.choice(list(ProbeWhat)), self.number(), self.number(),
                              r.randbytes(r.choice([1, 32, 4096])))
            case Kind.RSUM:
                body, file = ResSum(self.digest(), self.number()), frames.RESOURCES
            case Kind.RLIST:
                body, file = ResList(self.digest()), frames.RESOURCES
            case Kind.RHAVE:
                n = r.choice([1, 10, 2000, 4000])
                entries = tuple(frames.ResEntry(self.res_name(), self.number(), self.digest(),
                                                self.number(), r.choice(["", "x", "a"]))
                                for _ in range(n))
                full = r.random() < 0.5
                parts = r.choice([1, 2, 50, 1 << 62]) if full else 1
                body = frames.res_have(full, entries, r.randrange(0, min(parts, 100)), parts)
                file = frames.RESOURCES
                if r.random() < 0.5:
                    key = f"x-{r.randrange(0, 400)}"  # x's own keys: it may write them
            case Kind.RREQ:
                known = list(self.x.resources.items())
                if known and r.random() < 0.7:
                    (key, name), (sha, _) = r.choice(known)
                    body = ResAsk(name, bytes.fromhex(sha), r.choice([0, self.number()]),
                                  self.number())
                else:
                    body = ResAsk(self.res_name(), self.digest(), self.number(), self.number())
                file = frames.RESOURCES
            case Kind.RDATA:
                body = ResChunk(self.res_name(), self.digest(), self.number(), self.number(),
                                r.randbytes(r.randrange(1, 65536)))
                file = frames.RESOURCES
            case _:
                body = ResRefuse(self.res_name(), self.digest(),
                                 r.choice([None, self.digest()]), "x" * r.randrange(0, 500))
                kind, file = Kind.RREFUSE, frames.RESOURCES
        return Item(kind, body, key, file)

    def frame(self) -> None:
        """One frame on a topic its kinds may travel on, 1 to 300 items of one kind."""
        r = self.rng
        kind = r.choice([Kind.POS, Kind.LIVE, Kind.FILL, Kind.REQ, Kind.REFUSE, Kind.PROBE,
                         Kind.PROBED, Kind.RSUM, Kind.RLIST, Kind.RHAVE, Kind.RREQ,
                         Kind.RDATA, Kind.RREFUSE, Kind.NODE])
        if kind is Kind.NODE:
            self.conn += 1
            topic = frames.presence_topic(self.x.prefix, self.x.node)
            online = r.random() < 0.7
            f = frames.Frame(self.x.node, self.x.epoch, 0, 1,
                             (Item(Kind.NODE, Presence(online)),), conn=self.conn)
            self.x.publish(topic, frames.encode(f, self.x.identity, topic))
            self.summary.frames["node"] += 1
            self.summary.items += 1
            return
        n = r.choice([1, 1, 5, 50, 300]) if kind is not Kind.RHAVE else r.choice([1, 2])
        items: list[Item] = []
        size = 0
        while len(items) < n and size < 900_000:
            try:
                item = self.item(kind)
            except ValueError:
                continue
            items.append(item)
            size += item.size + (len(item.payload.data)
                                 if isinstance(item.payload, frames.ResHave) else 0)
        if kind is Kind.POS and r.random() < 0.5:
            self.x.position(items[0], retain=r.random() < 0.1)
            items = items[:1]
            to = "all"
        elif kind in (Kind.POS, Kind.LIVE, Kind.RSUM) or (kind is Kind.RHAVE
                                                           and r.random() < 0.5):
            self.x.batch(*items)
            to = "all"
        else:
            to = r.choice(self.victims)
            self.x.to(to, *items)
        if self.frame_log is not None:
            self.frame_log.write(f"{time.time():.2f} {kind.value} {len(items)} {to} {size}\n")
        self.summary.frames[kind.value] += 1
        self.summary.items += len(items)

    def burst(self, n: int) -> None:
        for _ in range(n):
            self.frame()
        self.x.flush()


class HostileChaos(Chaos):
    def __init__(self, root: Path, seed: int) -> None:
        super().__init__(root, seed, big_line=1 << 20, extra=VICTIM_CONFIG)
        self.root = root
        self.hostile = HostileSummary(seed)
        self.plant_rng = random.Random(seed + 2)
        self.plant_count = 0
        self.plant_keys: list[str] = []
        self.etc = root / "etc"  # an /etc-like directory with a canary
        self.secrets: dict[str, bytes] = {}
        self.deep: list[Path] = []  # planted trees (rm -rf: shutil.rmtree recurses)
        # CHAOS_TRACE_VICTIM=b CHAOS_TRACE_DIR=<dir>: that one victim traces its allocations
        # (syncd/ops/memtrace.py) and writes a snapshot when idle, at each checkpoint and at
        # the end. One only: tracing all three made the long mode time out.
        self.traced = os.environ.get("CHAOS_TRACE_VICTIM", "")
        if self.traced:
            where = os.environ.get("CHAOS_TRACE_DIR", str(root / "trace"))
            self.daemons[self.traced].env["SYNCD_TRACEMALLOC"] = where
        # CHAOS_MEMLOG_DIR=<dir>: every daemon writes <dir>/<node>.mem, a line of its memory
        # figures every 0.2 s (SYNCD_MEMLOG, ops/memtrace.py), at no cost worth counting.
        memlog = os.environ.get("CHAOS_MEMLOG_DIR", "")
        if memlog:
            Path(memlog).mkdir(parents=True, exist_ok=True)
            for node, d in self.daemons.items():
                d.env["SYNCD_MEMLOG"] = str(Path(memlog) / f"{node}.mem")

        # CHAOS_TURNPEAK_DIR=<dir>: the traced victim (CHAOS_TRACE_VICTIM, else c) writes
        # <dir>/<node>.turns, a line per loop callback that raised Python's traced memory by
        # more than 2 MiB at its peak (SYNCD_TURNPEAK, ops/memtrace.py; about 2x its CPU).
        turns = os.environ.get("CHAOS_TURNPEAK_DIR", "")
        if turns:
            Path(turns).mkdir(parents=True, exist_ok=True)
            node = self.traced or "c"
            self.daemons[node].env["SYNCD_TURNPEAK"] = str(Path(turns) / f"{node}.turns")

    # -- canaries and secrets ----------------------------------------------------------------

    def _canaries(self) -> None:
        self.etc.mkdir(parents=True, exist_ok=True)
        canary = b"CANARY-ETC-" + os.urandom(16).hex().encode() + b"\n"
        (self.etc / "canary.conf").write_bytes(canary)
        (self.etc / "events.jsonl").write_bytes(b'{"canary":"' + canary.strip() + b'"}\n')
        self.secrets["etc canary"] = canary.strip()
        for d in self.daemons.values():
            secret = b"CANARY-STATE-" + os.urandom(16).hex().encode()
            (d.root / "canary.secret").write_bytes(secret + b"\n")  # next to state_dir
            self.secrets[f"{d.node}'s state canary"] = secret
            key = d.identity_file.read_bytes()
            lines = [line for line in key.splitlines() if line and not line.startswith(b"---")]
            self.secrets[f"{d.node}'s identity key"] = b"".join(lines)[:40]

    def _targets(self, d: Daemon) -> list[Path]:
        return [d.state, d.identity_file, d.root / "canary.secret", self.etc,
                self.etc / "canary.conf", d.state / "files"]

    # -- the local bot's plants --------------------------------------------------------------

    def _plant_instance(self, d: Daemon) -> Path:
        """An instance of the bot's own (its log written), to plant the worst traps in."""
        r = self.plant_rng
        if not self.plant_keys or r.random() < 0.3:
            key = f"plant-{len(self.plant_keys) + 1}"
            self.plant_keys.append(key)
            path = self.daemons["a"].path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(ishiki_lines(3))
        key = r.choice(self.plant_keys)
        inst = d.runtimes / key
        inst.mkdir(parents=True, exist_ok=True)
        return inst

    def plant(self) -> None:
        r = self.plant_rng
        kind = r.choice(PLANTS)
        d = self.daemons[r.choice("aab")]
        self.plant_count += 1
        n = self.plant_count
        target = r.choice(self._targets(d))
        try:
            match kind:
                case "link_file":  # in the writer's real instance: a blob that is a link
                    folder = d.runtimes / KEY / "resources" / "artifacts" / "tool"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / f"leak-{n}.log").symlink_to(target)
                    (folder / f"leak-{n}.log.json").symlink_to(target)
                case "link_dir":
                    folder = d.runtimes / KEY / "resources" / "artifacts"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / f"linkdir-{n}").symlink_to(r.choice([d.state, self.etc]))
                case "link_resources":  # the issue's `resources -> /var/lib`, no race needed
                    inst = self._plant_instance(d)
                    res = inst / "resources"
                    if not res.exists() and not res.is_symlink():
                        res.symlink_to(r.choice([d.state, self.etc, d.root]))
                    else:
                        (inst / "resources" / "artifacts").mkdir(parents=True, exist_ok=True)
                        swap = inst / "resources" / "artifacts" / f"swap-{n}"
                        swap.symlink_to(d.state)
                case "link_log":
                    inst = d.runtimes / f"plant-log-{n}"
                    inst.mkdir(parents=True, exist_ok=True)
                    (inst / "events.jsonl").symlink_to(r.choice(
                        [self.etc / "events.jsonl", d.identity_file, d.root / "canary.secret"]))
                case "link_key_dir":
                    (d.runtimes / f"plant-dir-{n}").symlink_to(self.etc)
                case "deep_tree" | "deep_workspace":
                    inst = self._plant_instance(d)
                    top = inst / ("resources/artifacts" if kind == "deep_tree" else "workspace")
                    top.mkdir(parents=True, exist_ok=True)
                    _deep(top / f"deep-{n}", r.randrange(200, 1200))
                    self.deep.append(top / f"deep-{n}")
                case "unreadable_dir":
                    inst = self._plant_instance(d)
                    folder = inst / "resources" / "artifacts" / f"secret-{n}"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / "inside.log").write_bytes(b"unreadable\n")
                    folder.chmod(0)
                case "fifo":
                    inst = self._plant_instance(d)
                    folder = inst / "resources" / "artifacts"
                    folder.mkdir(parents=True, exist_ok=True)
                    os.mkfifo(folder / f"fifo-{n}.log")
                case "device_log":
                    inst = d.runtimes / f"plant-dev-{n}"
                    inst.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(PermissionError):  # not root: a FIFO instead
                        os.mknod(inst / "events.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
                    if not (inst / "events.jsonl").exists():
                        os.mkfifo(inst / "events.jsonl")
                case _:  # many small files at once
                    inst = self._plant_instance(d)
                    folder = inst / "resources" / "artifacts" / f"many-{n}"
                    folder.mkdir(parents=True, exist_ok=True)
                    for i in range(r.randrange(10, 300)):
                        (folder / f"f{i}.log").write_bytes(b"%d\n" % i)
        except OSError:
            pass  # a plant that could not be made (the name exists): still a plant tried
        self.hostile.plants[kind] += 1

    # -- checks ------------------------------------------------------------------------------

    def _exited(self) -> list[str]:
        return [n for n, d in self.daemons.items() if d.proc is None or d.proc.poll() is not None]

    def _scan_for_secrets(self) -> list[str]:
        found = []
        for d in self.daemons.values():
            for top in (d.runtimes, d.state / "archive"):
                for p, st in _walk(top):
                    if not stat.S_ISREG(st.st_mode) or st.st_size > 64 * MiB:
                        continue
                    with contextlib.suppress(OSError):
                        data = p.read_bytes()
                        found += [f"{p} ({what})" for what, secret in self.secrets.items()
                                  if secret in data]
        return found

    def _check_planted_logs(self) -> None:
        for key in self.plant_keys:
            want = _content(self.daemons["a"].path(key))
            wait_until(lambda key=key, want=want: all(
                _content(self.daemons[n].path(key)) == want for n in "bc"), 60,
                f"{key}'s log to replicate")
            self.hostile.planted_logs_checked += 2

    # -- the run -----------------------------------------------------------------------------

    def run_hostile(self, frames_total: int, plants: int, check_every: int,
                    log: Callable[[str], None]) -> HostileSummary:
        assert self.broker is not None
        sampler = RssSampler(self.daemons)
        x: HostilePeer | None = None
        try:
            self.broker.start()
            self._canaries()
            for d in self.daemons.values():
                d.start(wait=False)
            for d in self.daemons.values():
                wait_until(lambda d=d: d.status()["connected"], 30, f"{d.node} to connect")
            self.writer.start()
            self.writer.resume()
            self.checkpoint()  # warm: every host holds the log and resources
            x = HostilePeer(self.broker)
            x.secrets = list(self.secrets.values())
            wait_until(lambda: all(v > 0 for v in sampler.sample().values()), 10, "RSS")
            idle = sampler.sample()
            self._snapshot(log)
            sampler.peak = dict(idle)
            sampler.start()
            mallory = Mallory(x, self.rng, self.hostile, ["a", "b", "c"])
            steps = ["burst"] * -(-frames_total // 50) + ["plant"] * plants
            self.rng.shuffle(steps)
            sent_frames = 0
            start = time.monotonic()
            try:
                for i, step in enumerate(steps):
                    if step == "burst":
                        n = min(50, frames_total - sent_frames)
                        mallory.burst(n)
                        sent_frames += n
                    else:
                        self.plant()
                    if self.rng.random() < 0.1:
                        self.resource_put()
                    if (i + 1) % check_every == 0:
                        log(f"[{i + 1}/{len(steps)}] checkpoint ({sent_frames} frames, "
                            f"{self.plant_count} plants)")
                        self._check(log)
                        self._snapshot(log)
                self._check(log)
                self._check_planted_logs()
            except AssertionError as e:  # still measure, and say which check failed
                self.hostile.aborted = str(e)[:300]
            sampler.stop()
            self._snapshot(log)
            # The victims keep asking x for the files it announced (their own requests, a few
            # a second): what they sent is read now, against the budget of the time so far.
            self.hostile.elapsed = time.monotonic() - start
            for n in "abc":
                self.hostile.rss[n] = (idle.get(n, 0), sampler.peak.get(n, 0))
                self.hostile.sent[n] = x.bytes_from(n)
                self.hostile.answers[n] = x.answers_from(n)
                self.hostile.refused[n], self.hostile.keys[n] = _limits(self.daemons[n])
            self.hostile.exited = self._exited()
            self.hostile.leaks_on_hosts = self._scan_for_secrets()
            self.hostile.leaks_to_x = sum(x.leaks.values())
        finally:
            sampler.stop()
            if x is not None:
                x.close()
            self.writer.stop()
            for d in self.daemons.values():
                d.kill()
            self.broker.stop()
            self._unlock()
            for top in self.deep:
                subprocess.run(["rm", "-rf", str(top)], check=False)
        return self.hostile

    def _snapshot(self, log: Callable[[str], None]) -> None:
        """The traced victim writes a tracemalloc snapshot (SIGUSR2), with its RSS now."""
        d = self.daemons.get(self.traced)
        if d is None or d.proc is None or d.proc.poll() is not None:
            return
        log(f"snapshot of {self.traced}: RSS {rss_kib(d.proc.pid)[0] / 1024:.1f} MiB")
        d.proc.send_signal(signal.SIGUSR2)

    def _check(self, log: Callable[[str], None]) -> None:
        exited = self._exited()
        if exited:
            self.hostile.exited = exited
            raise AssertionError(f"daemons exited: {exited}")
        self.checkpoint()
        self.hostile.copies_checked = self.summary.copies_checked
        self.hostile.bytes_lost = self.summary.bytes_lost
        self.hostile.bytes_changed = self.summary.bytes_changed
        self.hostile.resources_checked = self.summary.resources_checked

    def _unlock(self) -> None:
        """Unreadable directories back to readable, so that the run's files can be removed."""
        for d in self.daemons.values():
            for p, st in _walk(d.runtimes):
                if stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o700:
                    with contextlib.suppress(OSError):
                        p.chmod(0o755)


def _walk(top: Path) -> list[tuple[Path, os.stat_result]]:
    """(path, lstat) of everything below `top`, links not followed, without recursion (the
    planted trees are deeper than Python's stack); what cannot be listed is skipped."""
    out: list[tuple[Path, os.stat_result]] = []
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append((Path(e.path), st))
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
    return out


def _deep(top: Path, depth: int) -> None:
    """A tree `depth` directories deep below `top`, made through descriptors (the path of
    its bottom is longer than PATH_MAX), with a file at the bottom."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            with contextlib.suppress(FileExistsError):
                os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("bottom.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"the bottom\n")
        os.close(leaf)
    finally:
        os.close(fd)


def run_hostile(root: Path, frames_total: int, plants: int, seed: int, check_every: int = 25,
                log: Callable[[str], None] = print) -> HostileSummary:
    return HostileChaos(root, seed).run_hostile(frames_total, plants, check_every, log)


def _limits(d: Daemon) -> tuple[dict[str, int], tuple[int, int]]:
    """What `d` refused at the bounds, and its keys (all, and made on x's word), read from its
    status with retries and a long timeout.

    Right after the run the victims are still busy with x's last frames: a status read that
    does not answer in time must not be printed as "nothing refused". One that never answers
    is shown as such.
    """
    for _ in range(6):
        try:
            got = query(d.state / "syncd.sock", "status", timeout=30)["status"]
        except ControlError:
            time.sleep(5)
            continue
        lim = got.get("peer_limits", {})
        refused = {str(k): int(v) for k, v in lim.get("refused", {}).items()}
        return refused, (int(lim.get("keys", 0)), int(lim.get("keys_made_by", {}).get("x", 0)))
    return {"(status did not answer in 6 tries of 30 s)": 0}, (-1, -1)
