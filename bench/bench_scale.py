"""Scale: one host pair carrying many instance keys (default 1000 keys x 1 MiB).

Two `syncd run` processes with default tuning (A and B) and a private Mosquitto. Both hosts
start with identical copies, so nothing needs fetching:

1. first start: no persisted positions, every file is hashed; then SIGTERM (positions saved);
2. restart: seconds from spawning the process to its "ready" log line (replicas loaded from
   persisted positions, broker connected), A alone first, then B with A running;
   `syncd status` is then checked for files still "verifying";
3. idle: RSS, and CPU % over a window (CPU time from /proc/<pid>/stat; 100 % = one core);
4. optionally (--scrub S): CPU % over S seconds that hold the first background scrub pass
   (it starts scrub_interval after start);
5. load: every key appended once per second (keys spread evenly over the second), lag until
   durable on B (its SYNCD_TRACE_FILE) and the CPU % of both daemons.

    python -m bench.bench_scale [--keys 1000] [--kib 1024] [--idle 20] [--load 20] [--scrub 0]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CpuMeter, PySpy, lag_stats, paced_appends, read_trace, rss_mb
from syncd.config import Config
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines

SCRUB_INTERVAL = next(f.default for f in fields(Config) if f.name == "scrub_interval")
SCRUB_RATE = next(f.default for f in fields(Config) if f.name == "scrub_bytes_per_second")


def key_name(i: int) -> str:
    return f"bot-{i:04d}"


def make_copies(daemons: list[Daemon], keys: int, kib: int) -> int:
    """The same whole-line content of about `kib` KiB in every key of every daemon."""
    target = kib * 1024
    parts, size = [], 0
    while size < target:
        block = ishiki_lines(200)
        parts.append(block)
        size += len(block)
    blob = b"".join(parts)
    blob = blob[: blob.rindex(b"\n", 0, target) + 1]
    for d in daemons:
        for i in range(keys):
            path = d.path(key_name(i))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
    return len(blob)


def start_until_ready(d: Daemon, timeout: float = 120) -> float:
    """Spawn the daemon; seconds until its log says "ready" (polled every 5 ms)."""
    offset = d.log.stat().st_size if d.log.exists() else 0
    t0 = time.monotonic()
    d.start(wait=False)

    def ready() -> bool:
        assert d.proc is not None
        if d.proc.poll() is not None:
            raise RuntimeError(f"{d.node} exited: {d.read_log()[-2000:]}")
        with d.log.open("rb") as f:
            f.seek(offset)
            return any(line.endswith(b" ready") for line in f.read().splitlines())

    wait_until(ready, timeout, f"{d.node} to be ready", interval=0.005)
    return time.monotonic() - t0


def stop(d: Daemon, timeout: float = 120) -> float:
    """SIGTERM (the daemon saves every position on the way out) and wait; seconds to exit."""
    t0 = time.monotonic()
    if d.proc is not None and d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
            raise
    d.proc = None
    return time.monotonic() - t0


def settled(d: Daemon) -> bool:
    """No file verifying, and each file's log check (where the daemon has one) caught up."""
    for f in d.status()["files"]:
        if f["state"] == "verifying" or f.get("log_check", {}).get("bytes", f["size"]) < f["size"]:
            return False
    return True


def states(d: Daemon) -> dict[str, int]:
    status = d.status()
    counts = Counter(str(f["state"]) for f in status["files"])
    return {"connected": int(bool(status["connected"])), **counts}


def run(root: Path, keys: int = 1000, kib: int = 1024, idle: float = 20, load: float = 20,
        profile_dir: Path | None = None, scrub: float = 0) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    broker = Broker(root / "broker", max_queued_messages=1000)
    broker.start()
    trace = root / "trace-b"
    shipped = root / "trace-a"  # A traces its own appends once fsync'ed and sent
    a = Daemon(root, "a", broker, tuning="", log_level="info",
               env={"SYNCD_TRACE_FILE": str(shipped)})
    b = Daemon(root, "b", broker, tuning="", log_level="info",
               env={"SYNCD_TRACE_FILE": str(trace)})
    r: dict[str, Any] = {"keys": keys}
    try:
        t0 = time.monotonic()
        r["file_bytes"] = make_copies([a, b], keys, kib)
        r["make_s"] = time.monotonic() - t0
        r["cold_ready_a"] = start_until_ready(a)
        r["cold_ready_b"] = start_until_ready(b)
        # Stop only once both have finished all start-up work (hashing, log checks), so that
        # the restart below finds everything persisted.
        t0 = time.monotonic()
        wait_until(lambda: settled(a) and settled(b), 300, "first start to settle", interval=1)
        r["cold_settle_s"] = r["cold_ready_b"] + time.monotonic() - t0
        r["stop_a"] = stop(a)
        r["stop_b"] = stop(b)

        restarted = time.monotonic()
        r["ready_a"] = start_until_ready(a)
        r["states_a"] = states(a)
        r["ready_b"] = start_until_ready(b)
        r["states_b"] = states(b)
        assert a.proc is not None and b.proc is not None
        pids = {"a": a.proc.pid, "b": b.proc.pid}
        r["rss_ready"] = {n: rss_mb(p) for n, p in pids.items()}

        time.sleep(3)  # peers' retained positions and first announcements settle
        wait_until(lambda: settled(a) and settled(b), 120, "restart to settle", interval=1)
        spies = [PySpy(p, idle, profile_dir / f"scale-idle-{n}.txt")
                 for n, p in pids.items()] if profile_dir else []
        meter = CpuMeter(pids)
        meter.start()
        time.sleep(idle)
        r["idle_cpu"] = meter.stop()
        r["rss_idle"] = {n: rss_mb(p) for n, p in pids.items()}
        for spy in spies:
            spy.wait()

        if scrub > 0:
            # The first scrub pass starts scrub_interval after start; measure a window
            # that holds it (the idle window does not).
            begin = restarted + SCRUB_INTERVAL - 2
            time.sleep(max(0.0, begin - time.monotonic()))
            r["scrub_start_s"] = time.monotonic() - restarted
            meter.start()
            time.sleep(scrub)
            r["scrub_cpu"] = meter.stop()
            r["rss_scrub"] = {n: rss_mb(p) for n, p in pids.items()}

        plan = []
        for _ in range(max(1, round(load))):
            for i in range(keys):
                key = key_name(i)
                plan.append((key, a.path(key), ishiki_lines(1 + i % 3)))
        spies = [PySpy(p, load, profile_dir / f"scale-load-{n}.txt")
                 for n, p in pids.items()] if profile_dir else []
        meter.start()
        writes, achieved = paced_appends(plan, keys)
        final = {w.key: w.end for w in writes}

        def b_done() -> bool:
            got = read_trace(trace)
            return all(got.get(k) and got[k][-1][0] >= end for k, end in final.items())

        try:
            wait_until(b_done, 60, "b to catch up", interval=0.2)
        except AssertionError:
            r["load_timed_out"] = True
        r["load_cpu"] = meter.stop()
        for spy in spies:
            spy.wait()
        r["load_writes"] = len(writes)
        r["load_rate"] = achieved
        r["load_lag"] = lag_stats(writes, read_trace(trace))
        r["ship_lag"] = lag_stats(writes, read_trace(shipped))
        r["rss_load"] = {n: rss_mb(p) for n, p in pids.items()}
        # Stops: after the load (every record changed), then after a restart with nothing
        # changed (nothing to write: each record on disk already says it).
        r["stop_after_load"] = {"a": stop(a), "b": stop(b)}
        for d in (a, b):
            start_until_ready(d)
        wait_until(lambda: settled(a) and settled(b), 120, "second restart to settle",
                   interval=1)
        r["stop_unchanged"] = {"a": stop(a), "b": stop(b)}
        return r
    finally:
        for d in (a, b):
            if d.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    stop(d, 30)
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--kib", type=int, default=1024, help="size of each file in KiB")
    parser.add_argument("--idle", type=float, default=20, help="idle window, seconds")
    parser.add_argument("--load", type=float, default=20, help="load window, seconds")
    parser.add_argument("--scrub", type=float, default=0,
                        help="seconds of CPU measurement over the first scrub pass (0: skip)")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles to this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-scale-") as tmp:
        r = run(Path(tmp), args.keys, args.kib, args.idle, args.load, args.profile, args.scrub)
    for k, v in r.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
