"""`syncd status` under attack from the control socket (issue #23, case 5).

A writer daemon A and a standby B with `--keys` keys (1000), `--written` of them (100)
appended once a second each, first with nobody asking B for its status, then while
`--clients` (64) clients of one unprivileged user, a member of the socket's group, ask B for
`status` as fast as they can (each: connect, ask, read the whole reply, again). Meanwhile
root runs `syncd status --ready KEY` against B every PROBE_EVERY seconds, as a failover
script would.

Per phase: lag append -> durable on B p50 / p99 / max, root's `status --ready` answer time
p50 / max and how many of its calls failed, the replies the clients got, and one `status`
on the quiet daemon: its time and size. Targets (#23): root's answer within 2 s, and the lag
p99 while hammered within 5x of the quiet p99.

    python -m bench.bench_status [--keys 1000] [--written 100] [--clients 64] [--seconds 20]
                                 [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_busy import busy
from bench.bench_scale import key_name
from bench.harness import Stats, ms, stats
from syncd.ops.control import query
from tests.support.cluster import Daemon

REPO = Path(__file__).resolve().parents[1]
PROBE_EVERY = 1.0
HAMMER_UID, SOCKET_GID = 54322, 54321  # as tests/daemon/test_control_socket.py

# Starts as root (the interpreter may be unreadable to the uid), drops to the uid, then N
# threads ask for status in a loop until killed; prints how many replies they got.
HAMMER = """
import os, signal, socket, sys, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # for sigwait, in every thread
os.setgroups([int(sys.argv[2])]); os.setresgid(*[int(sys.argv[2])] * 3)
os.setresuid(*[int(sys.argv[3])] * 3)
path, n = sys.argv[1], int(sys.argv[4])
got = [0] * n
def ask(i):
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(30)
                s.connect(path)
                s.sendall(b'{"cmd": "status"}\\n')
                while s.recv(1 << 20):
                    pass
            got[i] += 1
        except OSError:
            pass
for i in range(n):
    threading.Thread(target=ask, args=(i,), daemon=True).start()
signal.sigwait({signal.SIGTERM})
print(sum(got), flush=True)
"""


def open_socket(d: Daemon) -> Path:
    """B's socket reachable by the hammering uid, as by a member of group `syncd`."""
    sock = d.state / "syncd.sock"
    os.chown(sock, -1, SOCKET_GID)
    for p in [*sock.parents][:-1]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return sock


class RootProbe:
    """`syncd status --ready KEY` as root every PROBE_EVERY s: answer times and failures;
    and, in between, root's plain `status` request on the socket (the daemon's part of the
    answer, without the CLI's start-up)."""

    def __init__(self, d: Daemon) -> None:
        self.d = d
        self.times: list[float] = []
        self.failed: list[str] = []
        self.socket_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RootProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(PROBE_EVERY):
            t = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "syncd", "status", "--config", str(self.d.config),
                 "--ready", key_name(0)], capture_output=True, text=True, cwd=REPO)
            took = (time.monotonic() - t) * 1000
            if "ready" in done.stdout.lower():
                self.times.append(took)
            else:
                self.failed.append((done.stderr or done.stdout).strip()[-200:])
            t = time.monotonic()
            try:
                query(self.d.state / "syncd.sock", "status", timeout=30)
            except Exception as e:  # counted as a failure, the bench goes on
                self.failed.append(f"socket: {e}")
            else:
                self.socket_times.append((time.monotonic() - t) * 1000)


def phase(root: Path, args: argparse.Namespace, clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": clients}

    @contextlib.contextmanager
    def during(_a: Daemon, b: Daemon) -> Iterator[None]:
        t = time.monotonic()
        reply = query(b.state / "syncd.sock", "status", timeout=60)
        out["status_ms"] = (time.monotonic() - t) * 1000
        out["status_kb"] = len(str(reply)) / 1024
        hammer = None
        if clients:
            sock = open_socket(b)
            hammer = subprocess.Popen(
                [sys.executable, "-c", HAMMER, str(sock), str(SOCKET_GID), str(HAMMER_UID),
                 str(clients)], stdout=subprocess.PIPE, text=True, cwd=REPO)
            time.sleep(2)  # every client at work
        try:
            with RootProbe(b) as probe:
                yield
        finally:
            if hammer is not None:
                hammer.send_signal(signal.SIGTERM)
                text, _ = hammer.communicate(30)
                out["replies"] = int(text.strip() or 0)
        out["probe"] = probe

    r = busy(args.keys, root, args.seconds, args.grace, profile_dir=args.profile,
             during=during, name=f"status-{clients}", written=args.written)
    r.update(out)
    return r


def row(r: dict[str, Any]) -> str:
    lag: Stats = r["lag"]
    probe: RootProbe = r["probe"]
    answered, raw = stats(probe.times), stats(probe.socket_times)
    return (f"| {r['clients']} | {ms(lag.p50)} / {ms(lag.p99)} / {ms(lag.max)} | {lag.missing} | "
            f"{ms(answered.p50)} / {ms(answered.max)} | {ms(raw.p50)} / {ms(raw.max)} | "
            f"{len(probe.failed)} of {len(probe.times) + len(probe.socket_times)} | "
            f"{r.get('replies', 0)} | {r['others_cpu']:.0f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--written", type=int, default=100)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--profile", type=Path, metavar="DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-status-") as tmp:
        quiet = phase(Path(tmp) / "quiet", args, 0)
        hammered = phase(Path(tmp) / "hammered", args, args.clients)
    print(f"Status under load: {args.keys} keys, {args.written} written once a second for "
          f"{args.seconds:g} s per phase ({time.strftime('%Y-%m-%d %H:%M UTC')}); one quiet "
          f"`status`: {quiet['status_ms']:.0f} ms, {quiet['status_kb']:.0f} KiB\n")
    print("| status clients | lag p50 / p99 / max | missing | root's status --ready p50 / max |"
          " root's socket status p50 / max | root's calls failed | clients' replies |"
          " others' CPU |")
    print("|---|---|---|---|---|---|---|---|")
    print(row(quiet))
    print(row(hammered))
    failures = hammered["probe"].failed
    if failures:
        print(f"\nroot's first failure: {failures[0]}")
    answered = stats(hammered["probe"].times)
    raw = stats(hammered["probe"].socket_times)
    print(f"\nroot's status --ready answered within 2 s every time: "
          f"{'met' if not failures and answered.max <= 2000 else '**MISSED**'} (the daemon's "
          f"part, root's socket request: {'met' if raw.max <= 2000 else '**MISSED**'})")
    q, h = quiet["lag"], hammered["lag"]
    print(f"lag p99 hammered {ms(h.p99)} vs 5 x quiet p99 {ms(5 * q.p99)}: "
          f"{'met' if h.p99 <= 5 * q.p99 else '**MISSED**'}")


if __name__ == "__main__":
    main()
