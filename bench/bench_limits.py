"""What thousands of keys ask of the kernel's limits: descriptors, inotify watches, and the
cost of the status question a waiting bot unit asks twice a second.

Two `syncd run` processes (default tuning) and a private Mosquitto. A holds N keys (each with
a resources/ directory, as an Ishiki instance has), B starts empty:

1. first start of A (every file hashed), then B's catch-up of every key from nothing;
2. load: every key appended once per second for --load seconds;
3. the status document: ms per `status` over the control socket, whole and narrowed to one
   key (`select`, what `status --ready --wait KEY` asks).

Throughout, each daemon's open descriptors are sampled every 20 ms (/proc/<pid>/fd); printed
are the peaks per phase, the inotify watches needed and held, and RLIMIT_NOFILE.

    python -m bench.bench_limits [--keys 3000] [--kib 64] [--load 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_scale import key_name, settled, stop
from bench.harness import paced_appends
from syncd.ops.control import query
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines


class FdSampler(threading.Thread):
    """The peak number of open descriptors of each pid, per phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.phase = "start"
        self.peaks: dict[str, dict[str, int]] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.02):
            for name, pid in list(self.pids.items()):
                try:
                    n = len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    continue
                phase = self.peaks.setdefault(self.phase, {})
                phase[name] = max(phase.get(name, 0), n)

    def stop(self) -> None:
        self._done.set()
        self.join()


def status_ms(d: Daemon, repeat: int = 20, **args: Any) -> tuple[float, int]:
    """Median ms per status question, and the reply's size in bytes."""
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        reply = query(d.state / "syncd.sock", "status", timeout=60, **args)
        times.append((time.perf_counter() - t0) * 1000)
        size = len(json.dumps(reply))
    times.sort()
    return times[len(times) // 2], size


def run(root: Path, keys: int, kib: int, load: float) -> dict[str, Any]:
    broker = Broker(root / "broker")
    broker.start()
    a = Daemon(root, "a", broker, tuning="", log_level="info")
    b = Daemon(root, "b", broker, tuning="", log_level="info")
    r: dict[str, Any] = {"keys": keys}
    blob = b"".join(ishiki_lines(200) for _ in range(max(1, kib * 1024 // 90_000)))
    for i in range(keys):
        path = a.path(key_name(i))
        (path.parent / "resources").mkdir(parents=True)
        path.write_bytes(blob)
    r["file_bytes"] = len(blob)
    sampler = FdSampler({})
    sampler.start()
    try:
        a.start(wait=False)
        assert a.proc is not None
        sampler.pids["a"] = a.proc.pid
        wait_until(lambda: a.status()["connected"], 300, "a connected", interval=0.2)
        wait_until(lambda: settled(a), 600, "a's first start to settle", interval=0.5)
        sampler.phase = "catch-up"
        t0 = time.monotonic()
        b.start(wait=False)
        assert b.proc is not None
        sampler.pids["b"] = b.proc.pid
        wait_until(lambda: b.status()["connected"], 60, "b connected", interval=0.2)
        wait_until(lambda: sum(f["size"] == len(blob) for f in b.status()["files"]) == keys,
                   900, "b to catch up", interval=0.5)
        r["catch_up_s"] = time.monotonic() - t0
        wait_until(lambda: settled(b), 600, "b to settle", interval=0.5)
        sampler.phase = "load"
        plan = [(key_name(i), a.path(key_name(i)), ishiki_lines(1 + i % 3))
                for _ in range(max(1, round(load))) for i in range(keys)]
        paced_appends(plan, keys)
        sampler.phase = "idle"
        time.sleep(2)
        r["status_whole_ms"], r["status_whole_bytes"] = status_ms(a)
        r["status_one_ms"], r["status_one_bytes"] = status_ms(a, select=[key_name(0)])
        status = a.status()
        r["inotify"] = status["inotify"]
        r["open_files"] = status["open_files"]
    finally:
        for d in (b, a):
            if d.proc is not None:
                try:
                    stop(d)
                except Exception:
                    d.kill()
        broker.stop()
        sampler.stop()
    r["fd_peaks"] = sampler.peaks
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=3000)
    p.add_argument("--kib", type=int, default=64)
    p.add_argument("--load", type=float, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        r = run(Path(tmp), args.keys, args.kib, args.load)
    print(f"keys {r['keys']}, {r['file_bytes']} bytes each; B caught up in {r['catch_up_s']:.1f} s")
    for phase, peaks in r["fd_peaks"].items():
        print(f"open descriptors, peak during {phase}: "
              + ", ".join(f"{n} {v}" for n, v in sorted(peaks.items())))
    i, o = r["inotify"], r["open_files"]
    print(f"inotify (a): {i['watches']} watches held, {i['watches_needed']} needed; "
          f"max_user_watches {i['max_user_watches']}, max_user_instances "
          f"{i['max_user_instances']}")
    print(f"RLIMIT_NOFILE (a): soft {o['limit']}, hard {o['hard_limit']}; open now {o['open']}")
    print(f"status over the socket (a): whole {r['status_whole_ms']:.1f} ms "
          f"({r['status_whole_bytes']} bytes), one key selected {r['status_one_ms']:.1f} ms "
          f"({r['status_one_bytes']} bytes)")


if __name__ == "__main__":
    main()
