"""Chaos: faults injected at random into a live three-host cluster; nothing may be lost.

A writer thread appends Ishiki-shaped lines to host a's copy of one key the whole time. A seeded
random sequence of faults hits the daemons, the broker and the files; at checkpoints the writer
pauses and every copy must become byte-identical to the writer's. Faults that make copies
diverge (hand edits, truncation, a cleared file) each get a key of their own, and must be
refused: every other host keeps its bytes.

    python -m tests.support.chaos --faults 200 --seed 7      # the long mode, with a summary
    python -m tests.support.chaos --faults 100 --partitions  # + hosts cut off by a partition
    python -m tests.support.chaos --faults 100 --nats        # 3-member NATS cluster: + member loss
    python -m tests.support.chaos --hostile --frames 10000 --plants 200   # a listed host gone
                                          # bad, and a bot planting traps (hostile_chaos.py)

The quick mode runs in the test suite (tests/daemon/test_chaos.py). The fault sequence is
fixed by the seed; timings are not, so a failure report always names the seed and the fault
being run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import netns
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines
from tests.support.ishiki_writer import (
    image_line,
    put_artifact,
    put_asset,
    shake_line,
    sidecar,
    write_atomic,
)
from tests.support.nats import NatsCluster

KEY = "chaos"
MAIN_FAULTS = [
    "kill9_writer_daemon", "kill9_replica_daemon", "kill9_during_catchup", "broker_restart",
    "broker_restart_persistent", "replica_away", "replica_paused", "torn_line", "big_line",
    "not_utf8",
]
DIVERGENCE_FAULTS = ["hand_edit", "truncate", "delete_recreate"]
# The instance's resources/ (issue #16): artifacts with sidecars put by the writer (temp file,
# rename), sidecars rewritten, and the writer killed between a temp file and its rename.
RESOURCE_FAULTS = ["resource_put", "resource_rewrite", "resource_writer_killed"]
# --partitions: each host in a network namespace of its own (tests/support/netns.py; needs root).
PARTITION_FAULTS = ["partition_replica", "partition_writer"]
# --nats: the broker is a 3-member NATS cluster (tests/support/nats.py); its members die and return
# instead of a broker restart.
NATS_FAULTS = ["member_loss", "member_loss_writers"]
BROKER_FAULTS = ["broker_restart", "broker_restart_persistent"]


@dataclass
class Summary:
    seed: int
    injected: Counter[str] = field(default_factory=Counter)
    copies_checked: int = 0
    bytes_lost: int = 0
    bytes_changed: int = 0
    refused: int = 0
    refusals_expected: int = 0
    resources_checked: int = 0  # resource files found byte-identical on a replica
    temp_files_copied: int = 0

    def table(self) -> str:
        rows = [f"chaos seed {self.seed}: {sum(self.injected.values())} faults"]
        rows += [f"  {kind:28} {n:5}" for kind, n in sorted(self.injected.items())]
        rows += [
            f"  {'copies checked':28} {self.copies_checked:5}",
            f"  {'bytes lost':28} {self.bytes_lost:5}",
            f"  {'bytes changed':28} {self.bytes_changed:5}",
            f"  {'divergences refused':28} {self.refused:5} of {self.refusals_expected}",
            f"  {'resource files checked':28} {self.resources_checked:5}",
            f"  {'temp files copied':28} {self.temp_files_copied:5}",
        ]
        return "\n".join(rows)


class Writer(threading.Thread):
    """The bot: appends 1-3 lines per write(2), ~rate writes per second, until stopped."""

    def __init__(self, path: Path, rate: float) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.rate = rate
        self.running = threading.Event()
        self.idle = threading.Event()
        self.jobs: queue.Queue[Callable[[int], None]] = queue.Queue()
        self._stop = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.05)
                continue
            self.idle.clear()
            try:
                self.jobs.get_nowait()(n)
            except queue.Empty:
                self.write(ishiki_lines(1 + n % 3))
            n += 1
            time.sleep(1 / self.rate)

    def pause(self) -> None:
        self.running.clear()
        wait_until(self.idle.is_set, 10, "the writer to pause")

    def resume(self) -> None:
        self.running.set()

    def do(self, job: Callable[[int], None]) -> None:
        """Run `job` in the writer's thread, between two ordinary writes, and wait for it."""
        done = threading.Event()

        def wrapped(n: int) -> None:
            job(n)
            done.set()

        self.jobs.put(wrapped)
        if not done.wait(60):
            raise AssertionError("writer job did not run")

    def stop(self) -> None:
        self._stop.set()


# CHAOS_LOG_LEVEL=debug: every daemon's log says what it decided (large logs).
LOG_LEVEL = os.environ.get("CHAOS_LOG_LEVEL", "info")


class Chaos:
    def __init__(self, root: Path, seed: int, big_line: int, partitions: bool = False,
                 nats: bool = False, extra: str = "") -> None:
        """`extra`: more config lines for every daemon (the hostile mode's limits)."""
        self.rng = random.Random(seed)
        # Its own: the resources written do not change which faults the seed picks.
        self.res_rng = random.Random(seed + 1)
        self.summary = Summary(seed)
        self.big_line_size = big_line
        self.file = "events.jsonl"
        self.kinds = [k for k in MAIN_FAULTS if not (nats and k in BROKER_FAULTS)]
        self.kinds += DIVERGENCE_FAULTS
        if not (partitions or nats):
            # Not in the partition and NATS modes: their seeds keep the fault sequences they
            # had (resources are still written at every checkpoint there).
            self.kinds += RESOURCE_FAULTS
        self.net: netns.Net | None = None
        self.cluster: NatsCluster | None = None
        self.broker: Broker | None = None
        if nats:
            self.cluster = NatsCluster(root / "nats")
            ends = self.cluster.endpoints
            self.daemons = {n: Daemon(root, n, None, log_level=LOG_LEVEL,
                                      brokers=ends[i:] + ends[:i],
                                      mqtt_extra="subscribe_qos = 0\n")
                            for i, n in enumerate("abc")}
            for d in self.daemons.values():
                # A (re)connection waits for JetStream (the session record, retained
                # positions), for ~10 s more while a member is being replaced.
                d.connect_timeout = 60.0
            self.kinds += NATS_FAULTS
        elif partitions:
            self.net = netns.Net("chaos")
            self.broker = netns.NsBroker(self.net, root / "broker", "max_queued_messages 50\n")
            hosts = {n: self.net.host(n) for n in "abc"}
            # keepalive 2: a cut host and its peers notice within seconds.
            self.daemons = {n: Daemon(root, n, None, log_level=LOG_LEVEL,
                                      brokers=[h.broker_address(self.broker)],
                                      mqtt_extra="keepalive = 2\n", prefix=h.exec)
                            for n, h in hosts.items()}
            self.kinds += PARTITION_FAULTS
        else:
            self.broker = Broker(root / "broker", max_queued_messages=50)  # drops early
            self.daemons = {n: Daemon(root, n, self.broker, log_level=LOG_LEVEL, extra=extra)
                            for n in "abc"}
        self.writer = Writer(self._path(self.daemons["a"]), rate=100)
        self.divergence_keys = 0
        self.instance = self.daemons["a"].runtimes / KEY
        self.artifacts = 0
        self.killed_targets: list[Path] = []  # names whose writer died before the rename

    def _path(self, d: Daemon, key: str = KEY) -> Path:
        return d.path(key, self.file)

    def _status(self, d: Daemon, key: str = KEY) -> dict[str, object]:
        return d.file_status(key, self.file)

    # --- the run ----------------------------------------------------------------------------

    def run(self, faults: int, check_every: int, log: Callable[[str], None]) -> Summary:
        try:
            if self.cluster is not None:
                self.cluster.start()
            elif self.broker is not None:
                self.broker.start()
            for d in self.daemons.values():
                d.start(wait=False)
            for d in self.daemons.values():
                wait_until(lambda d=d: d.status()["connected"], 30, f"{d.node} to connect")
            self.writer.start()
            self.writer.resume()
            for i in range(faults):
                kind = self.rng.choice(self.kinds)
                log(f"[{i + 1}/{faults}] {kind}")
                self.summary.injected[kind] += 1
                getattr(self, kind)()
                if (i + 1) % check_every == 0 or i + 1 == faults:
                    self.checkpoint()
        finally:
            self.writer.stop()
            for d in self.daemons.values():
                d.kill()
            if self.broker is not None:
                self.broker.stop()
            if self.cluster is not None:
                self.cluster.stop()
            if self.net is not None:
                self.net.close()
        return self.summary

    def checkpoint(self) -> None:
        # The bot puts an artifact between any two checkpoints, and names killed mid-put are
        # put again by the restarted writer: every checkpoint has resources to compare.
        self.resource_put()
        self._put_again()
        self.writer.pause()
        source = self._path(self.daemons["a"])
        expected = source.read_bytes()
        replicas = [self.daemons["b"], self.daemons["c"]]
        try:
            wait_until(lambda: all(_content(self._path(d)) == expected for d in replicas), 60,
                       "copies to converge")
        except AssertionError as e:
            states = {d.node: {k: self._status(d).get(k) for k in ("state", "size", "peers")}
                      for d in self.daemons.values()}
            # A daemon that does not answer: its log says why (syncd/ops/stall.py prints its
            # stacks).
            silent = "".join(f"\n--- {n}'s log, last lines ---\n" + "\n".join(
                self.daemons[n].read_log().splitlines()[-80:])
                for n, st in states.items() if st["state"] is None)
            raise AssertionError(f"{e}; source {len(expected)} bytes; {states}{silent}"
                                 ) from None
        finally:
            for d in replicas:
                copy = _content(self._path(d))
                self.summary.copies_checked += 1
                common = _common_prefix(copy, expected)
                self.summary.bytes_lost += len(expected) - common
                self.summary.bytes_changed += len(copy) - common
        digest = hashlib.sha256(expected).hexdigest()
        assert all(hashlib.sha256(_content(self._path(d))).hexdigest() == digest
                   for d in replicas)
        self._check_resources(replicas)
        self.writer.resume()

    def _check_resources(self, replicas: list[Daemon]) -> None:
        """Every published resource file of a is on b and c, byte for byte; no temp file."""
        want = {n: b for n, b in _tree(self.instance / "resources").items()
                if not n.endswith(".tmp")}

        def same() -> bool:
            return all(_tree(d.runtimes / KEY / "resources") == want for d in replicas)

        try:
            wait_until(same, 90, "resources to converge")
        finally:
            for d in replicas:
                tree = _tree(d.runtimes / KEY / "resources")
                self.summary.resources_checked += sum(tree.get(n) == b for n, b in want.items())
                self.summary.bytes_lost += sum(len(b) for n, b in want.items()
                                               if tree.get(n) != b)
                self.summary.temp_files_copied += sum(n.endswith(".tmp") and
                                                      not n.endswith(".syncd.tmp") for n in tree)

    # --- resources ------------------------------------------------------------------------

    def resource_put(self) -> None:
        self.artifacts += 1
        size = self.res_rng.choice([10, 5000, 300_000, 3 << 20])
        data = self.res_rng.randbytes(size)
        name = f"shake-{self.artifacts}.log"

        def job(n: int) -> None:
            ref = put_artifact(self.instance, "shake", name, data, n=n)
            self.writer.write(shake_line(f"chaos-shake-{self.artifacts}", ref))
            if self.res_rng.random() < 0.5:
                asset = put_asset(self.instance, f"img-{self.artifacts}", data[:999])
                self.writer.write(image_line(f"chaos-img-{self.artifacts}", asset))

        self.writer.do(job)

    def resource_rewrite(self) -> None:
        blobs = sorted((self.instance / "resources" / "artifacts").glob("*/*.log"))
        if blobs:
            blob = self.res_rng.choice(blobs)
            self.writer.do(lambda n: sidecar(blob, rewritten=n))

    def _put_again(self) -> None:
        for target in self.killed_targets:
            write_atomic(target, b"put again after the writer was killed\n")
        self.killed_targets = []

    def resource_writer_killed(self) -> None:
        """kill -9 of the resource writer between its temp file and the rename; the name it
        was putting is written again (a new temp file, then the rename) at the next fault."""
        self._put_again()
        self.artifacts += 1
        target = self.instance / "resources" / "artifacts" / "tool" / f"out-{self.artifacts}"
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.ishiki_writer", str(target)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                cwd=Path(__file__).resolve().parents[2])
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"ready")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.killed_targets.append(target)

    # --- faults on the running cluster --------------------------------------------------------

    def _nap(self, lo: float = 0.05, hi: float = 0.4) -> None:
        time.sleep(self.rng.uniform(lo, hi))  # let the cluster run for a while, faulty

    def kill9_writer_daemon(self) -> None:
        a = self.daemons["a"]
        a.kill()
        self._nap()
        a.start()

    def kill9_replica_daemon(self) -> None:
        d = self.daemons[self.rng.choice("bc")]
        d.kill()
        self._nap()
        d.start()

    def kill9_during_catchup(self) -> None:
        c = self.daemons["c"]
        c.stop()
        self.writer.do(lambda n: self.writer.write(ishiki_lines(3000)))  # ~1.2 MB behind
        c.start(wait=False)
        self._nap(0.3, 0.8)
        c.kill()
        c.start()

    def broker_restart(self, persistent: bool = False) -> None:
        assert self.broker is not None
        lines = [line for line in self.broker.conf.read_text().splitlines()
                 if not line.startswith("persistence")]
        lines += ["persistence true", f"persistence_location {self.broker.dir}/"] if persistent \
            else ["persistence false"]
        conf = "\n".join(lines) + "\n"
        self.broker.stop()
        self.broker.conf.write_text(conf)
        self._nap(0.1, 1.0)
        self.broker.start()

    def broker_restart_persistent(self) -> None:
        self.broker_restart(persistent=True)

    def replica_away(self) -> None:
        c = self.daemons["c"]
        c.stop()
        self._nap(0.5, 1.0)  # ~75 writes: more than the broker queue (50) holds
        c.start()

    def replica_paused(self) -> None:
        d = self.daemons[self.rng.choice("bc")]
        d.pause()
        self._nap(0.5, 1.0)
        d.resume()

    # --- partitions (--partitions) and member loss (--nats) -----------------------------------

    def _partition(self, node: str) -> None:
        assert self.net is not None
        host = self.net.hosts[node]
        host.cut()
        self._nap(0.5, 4.0)  # up to twice the keepalive: often noticed, sometimes not
        host.heal()

    def partition_replica(self) -> None:
        self._partition(self.rng.choice("bc"))

    def partition_writer(self) -> None:
        self._partition("a")

    def member_loss(self) -> None:
        """A NATS member dies (kill -9) and comes back; its hosts move to another member."""
        assert self.cluster is not None
        member = self.rng.randrange(len(self.cluster.members))
        self.cluster.kill(member)
        self._nap(0.5, 3.0)
        self.cluster.start_member(member)

    def member_loss_writers(self) -> None:
        """The member the writer is connected to dies, at once after a burst of writes."""
        assert self.cluster is not None
        using = self.daemons["a"].status().get("broker")
        member = next((i for i, m in enumerate(self.cluster.members) if m.endpoint == using),
                      0)
        self.writer.do(lambda n: self.writer.write(ishiki_lines(500)))
        self.cluster.kill(member)
        self._nap(0.5, 3.0)
        self.cluster.start_member(member)

    def torn_line(self) -> None:
        line = ishiki_lines(1)
        cut = self.rng.randrange(1, len(line) - 1)

        def job(n: int) -> None:
            self.writer.write(line[:cut])
            time.sleep(0.3)  # long enough for the watcher and the sweep to look
            self.writer.write(line[cut:])

        self.writer.do(job)

    def big_line(self) -> None:
        size = self.big_line_size
        self.writer.do(lambda n: self.writer.write(
            b'{"id":"big","type":"message","data":{"text":"' + b"x" * size + b'"}}\n'))

    def not_utf8(self) -> None:
        self.writer.do(lambda n: self.writer.write(b'{"bytes":"\xff\xfe\xc3\x28"}\n'))

    # --- faults that make histories diverge: each on a key of its own -------------------------

    def _diverging_key(self) -> tuple[str, bytes]:
        self.divergence_keys += 1
        key = f"diverge-{self.divergence_keys}"
        data = ishiki_lines(20)
        path = self._path(self.daemons["a"], key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        wait_until(lambda: all(_content(self._path(self.daemons[n], key)) == data
                               for n in "bc"), 60, f"{key} to replicate")
        return key, data

    def _expect_refused(self, key: str, data: bytes, states: dict[str, set[str]]) -> None:
        self.summary.refusals_expected += 1

        def refused() -> bool:
            return all(self._status(self.daemons[n], key).get("state") in ok
                       for n, ok in states.items())

        wait_until(refused, 30, f"{key} to be refused: {states}")
        assert all(_content(self._path(self.daemons[n], key)) == data
                   for n in "bc"), "copies changed"
        self.summary.refused += 1

    def hand_edit(self) -> None:
        key, data = self._diverging_key()
        lines = data.splitlines(keepends=True)
        drop = self.rng.randrange(len(lines) - 1)
        self._path(self.daemons["a"], key).write_bytes(b"".join(lines[:drop] + lines[drop + 1 :]))
        self._expect_refused(key, data, {"b": {"diverged"}, "c": {"diverged"},
                                         "a": {"diverged", "reset"}})

    def truncate(self) -> None:
        key, data = self._diverging_key()
        with self._path(self.daemons["a"], key).open("r+b") as f:
            f.truncate(self.rng.randrange(len(data) // 2))
        self._expect_refused(key, data, {"a": {"reset"}})

    def delete_recreate(self) -> None:
        key, data = self._diverging_key()
        path = self._path(self.daemons["a"], key)
        path.unlink()
        path.write_bytes(ishiki_lines(2))
        self._expect_refused(key, data, {"a": {"reset"}})


def _content(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _tree(top: Path) -> dict[str, bytes]:
    """Every regular file below `top` (a symbolic link the hostile mode's bot planted is no
    published file: never read through)."""
    out = {}
    for root, _, names in os.walk(top):
        for n in names:
            p = Path(root) / n
            with contextlib.suppress(FileNotFoundError):
                if p.is_symlink() or not p.is_file():
                    continue
                out[str(p.relative_to(top))] = p.read_bytes()
    return out


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest m with a[:m] == b[:m]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def run(root: Path, faults: int, seed: int, check_every: int = 5, big_line: int = 2 << 20,
        log: Callable[[str], None] = print, partitions: bool = False,
        nats: bool = False) -> Summary:
    return Chaos(root, seed, big_line, partitions, nats).run(faults, check_every, log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--check-every", type=int, default=5)
    parser.add_argument("--big-line-mb", type=int, default=20)
    parser.add_argument("--partitions", action="store_true",
                        help="hosts in network namespaces, cut off at random (needs root)")
    parser.add_argument("--nats", action="store_true",
                        help="a 3-member NATS cluster as the broker; members die at random")
    parser.add_argument("--hostile", action="store_true",
                        help="a listed host sends hostile frames, the local bot plants traps")
    parser.add_argument("--frames", type=int, default=10_000, help="--hostile: x's frames")
    parser.add_argument("--plants", type=int, default=200, help="--hostile: the bot's plants")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="syncd-chaos-")
    if args.hostile:
        from tests.support.hostile_chaos import run_hostile  # it builds on this module

        try:
            hostile = run_hostile(Path(tmp), args.frames, args.plants, args.seed)
        except Exception:
            print(f"hostile chaos FAILED with seed {args.seed}; logs kept in {tmp}",
                  file=sys.stderr)
            raise
        print(hostile.table())
        if hostile.failures():
            print(f"logs kept in {tmp}", file=sys.stderr)
            sys.exit(1)
        subprocess.run(["rm", "-rf", tmp], check=False)
        sys.exit(0)
    try:
        summary = run(Path(tmp), args.faults, args.seed, args.check_every,
                      args.big_line_mb << 20, partitions=args.partitions, nats=args.nats)
    except Exception:
        print(f"chaos FAILED with seed {args.seed}; logs kept in {tmp}", file=sys.stderr)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    print(summary.table())
    sys.exit(0 if summary.bytes_lost == summary.bytes_changed == 0
             and summary.refused == summary.refusals_expected else 1)


if __name__ == "__main__":
    main()
