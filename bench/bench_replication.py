"""Append -> durable lag on two replicas, and one-file catch-up throughput.

Real parts: a private Mosquitto on a free loopback port and three `syncd run` processes
(A writes, B and C replicate). Each replica's daemon writes a trace line when bytes become
durable (SYNCD_TRACE_FILE); CLOCK_MONOTONIC is shared by all processes, so lag is
(replica fdatasync done) - (just before the writer's write(2)).

    python -m bench.bench_replication [--rate 500] [--seconds 10] [--catchup-mb 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster import Broker, Daemon, wait_until
from tests.conftest import ishiki_lines

KEY = "bench"


def read_trace(path: Path) -> list[tuple[int, int]]:
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == KEY:
            out.append((int(parts[2]), int(parts[3])))
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def lag(rate: int, seconds: float, root: Path, broker: Broker) -> None:
    traces = {n: root / f"trace-{n}" for n in "bc"}
    daemons = {
        n: Daemon(root, n, broker, tuning="", log_level="warning",
                  env={"SYNCD_TRACE_FILE": str(traces[n])} if n in traces else {})
        for n in "abc"
    }
    for d in daemons.values():
        d.start()
    src = daemons["a"].path(KEY)
    src.parent.mkdir(parents=True, exist_ok=True)
    # Warm up (connections, replica creation) before measuring.
    with src.open("ab") as f:
        f.write(ishiki_lines(1))
    wait_until(lambda: all(read_trace(t) for t in traces.values()), 15, "warm-up")

    writes: list[tuple[int, int]] = []  # (end offset, monotonic ns before write)
    fd = os.open(src, os.O_WRONLY | os.O_APPEND)
    size = src.stat().st_size
    interval = 1.0 / rate
    n = int(rate * seconds)
    batches = [ishiki_lines(1 + i % 3) for i in range(n)]  # several lines per write(2)
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        # Sleep, never spin: the writer must not steal a core from the daemons.
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.monotonic_ns()
        os.write(fd, batch)
        size += len(batch)
        writes.append((size, t))
    os.close(fd)
    achieved = n / (time.perf_counter() - start)
    wait_until(lambda: all(read_trace(t) and read_trace(t)[-1][0] >= size
                           for t in traces.values()), 30, "replicas to finish")
    print(f"lag: {n} writes at {achieved:.0f}/s ({rate}/s asked), "
          f"{size / 1e6:.1f} MB, 2 replicas")
    for node, tpath in traces.items():
        trace = read_trace(tpath)
        lags, j = [], 0
        for end, t_write in writes:
            while j < len(trace) and trace[j][0] < end:
                j += 1
            lags.append((trace[j][1] - t_write) / 1e6)
        print(f"  replica {node}: p50 {statistics.median(lags):.2f} ms  "
              f"p90 {percentile(lags, 90):.2f} ms  p99 {percentile(lags, 99):.2f} ms  "
              f"max {max(lags):.2f} ms  (targets: p50 <= 3 ms, p99 <= 20 ms)")
    for d in daemons.values():
        d.stop()


def catchup(megabytes: int, root: Path, broker: Broker) -> None:
    trace = root / "trace-catchup"
    a = Daemon(root / "cu", "a", broker, tuning="", log_level="warning")
    b = Daemon(root / "cu", "b", broker, tuning="", log_level="warning",
               env={"SYNCD_TRACE_FILE": str(trace)})
    src = a.path(KEY)
    src.parent.mkdir(parents=True, exist_ok=True)
    block = ishiki_lines(2000)
    with src.open("wb") as f:
        while f.tell() < megabytes * 1_000_000:
            f.write(block)
    size = src.stat().st_size
    a.start()
    wait_until(lambda: a.file_status(KEY).get("size") == size, 120, "a to index its file")
    t0 = time.monotonic_ns()
    b.start(wait=False)
    wait_until(lambda: read_trace(trace) and read_trace(trace)[-1][0] >= size, 600,
               "catch-up", interval=0.05)
    first = read_trace(trace)[0][1]
    done = read_trace(trace)[-1][1]
    total = (done - t0) / 1e9
    streaming = (done - first) / 1e9
    print(f"catch-up: {size / 1e6:.0f} MB to a new standby in {total:.2f} s including its "
          f"start-up = {size / 1e6 / total:.0f} MB/s; streaming {size / 1e6 / streaming:.0f} "
          "MB/s (target >= 100 MB/s)")
    assert b.path(KEY).read_bytes() == src.read_bytes(), "copies differ after catch-up"
    a.stop()
    b.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=500, help="writes per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--catchup-mb", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-bench-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "broker", max_queued_messages=1000)
        broker.start()
        try:
            if args.seconds:
                lag(args.rate, args.seconds, root, broker)
            if args.catchup_mb:
                catchup(args.catchup_mb, root, broker)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
