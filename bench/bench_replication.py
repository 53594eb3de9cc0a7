"""Append -> durable lag on one or two replicas, and one-file catch-up throughput.

Real parts: a private Mosquitto on a free loopback port and `syncd run` processes (A writes,
B and C replicate). Each replica's daemon writes a trace line when bytes become durable
(SYNCD_TRACE_FILE); CLOCK_MONOTONIC is shared by all processes, so lag is
(replica fdatasync done) - (just before the writer's write(2)). The writer appends like the
reference writer's appendFile: open, one write(2), close.

Every scenario gets a fresh broker: retained positions of an earlier scenario's nodes would
otherwise be judged against the new files (and rightly refused as divergent).

    python -m bench.bench_replication [--rate 500] [--seconds 10] [--replicas 2]
                                      [--catchup-mb 512] [--stock-broker] [--profile DIR]

Per replica: lag p50 / p90 / p99 / max and writes missing (not arrived 30 s after the last
write). Items per write (each daemon's /metrics `syncd_frames`, by direction and kind) and
MQTT messages per write (the broker's $SYS publish counters: all clients, positions too).

CPU per write: each daemon's user + system time (/proc/<pid>/stat) over the measured window
(writing + draining) divided by the writes. --profile attaches `py-spy record` (raw folded
stacks, only samples that hold the GIL: where Python spends CPU) to the writer A and the
standby B for the measured window and to both daemons of the catch-up, writes the profiles to
DIR and prints their top frames; sampling perturbs the figures, so compare profiled runs only
with each other.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.harness import (
    BROKER_SYS,
    BackgroundMeter,
    CpuMeter,
    PySpy,
    Stats,
    batches,
    broker_publishes,
    cpu_split,
    item_deltas,
    lag_stats,
    lags_ms,
    metrics_extra,
    paced_appends,
    reached,
    read_trace,
    rss_mb,
    scrape_items,
    top_inclusive_frames,
    top_self_frames,
    wait_bounded,
    worst_of,
)
from tests.support.cluster import Broker, Daemon, free_port, wait_until
from tests.support.ishiki import ishiki_lines

KEY = "bench"
REPLICA_NAMES = "bc"
# py-spy samples per second with --profile (SYNCD_BENCH_PROFILE_HZ: more for a longer look)
PROFILE_HZ = int(os.environ.get("SYNCD_BENCH_PROFILE_HZ", "250"))
# SYNCD_BENCH_PROFILE_GIL=0: sample every thread on a CPU (py-spy's idle filter) instead of the
# GIL holder only (py-spy reads the GIL's last holder, so a loop blocked on a lock while
# another thread is in fdatasync is counted as busy at the lock)
PROFILE_GIL = os.environ.get("SYNCD_BENCH_PROFILE_GIL", "1") != "0"


def stock_broker_config(port: int) -> str:
    """Mosquitto as installed (its defaults: no `set_tcp_nodelay`, so Nagle's algorithm holds
    small packets back), otherwise as the other benches run it."""
    return (f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 1000\n"
            f"persistence false\n{BROKER_SYS}")


def lag(rate: int, seconds: float, root: Path, replicas: int = 2,
        profile_dir: Path | None = None, stock_broker: bool = False,
        drain_timeout: float = 30.0, config: str = "",
        prefix: Sequence[str] = ()) -> dict[str, Any]:
    """Writes at `rate`/s for `seconds` on A; lag until durable on each of `replicas` copies.

    `stock_broker`: Mosquitto without `set_tcp_nodelay true`. Writes still missing on a copy
    `drain_timeout` s after the last one are reported ("missing"), not waited for.
    `config`: top-level config lines for every daemon (`batch_window = 0.01`); `prefix`: a
    command in front of `python -m syncd run` (bench_against.py: `env -C TREE`, another
    tree's code)."""
    root.mkdir(parents=True, exist_ok=True)
    broker = (Broker(root / "broker", config=stock_broker_config) if stock_broker else
              Broker(root / "broker", max_queued_messages=1000, extra=BROKER_SYS))
    broker.start()
    names = REPLICA_NAMES[:replicas]
    traces = {n: root / f"trace-{n}" for n in names}
    shipped = root / "trace-a"  # A traces its own appends once fsync'ed and published
    ports = {n: free_port() for n in "a" + names}
    daemons = {
        n: Daemon(root, n, broker, tuning="", log_level="warning",
                  extra=config + "\n" + metrics_extra(ports[n]), prefix=prefix,
                  env={"SYNCD_TRACE_FILE": str(traces.get(n, shipped))})
        for n in "a" + names
    }
    try:
        for d in daemons.values():
            d.start()
        src = daemons["a"].path(KEY)
        src.parent.mkdir(parents=True, exist_ok=True)
        # Warm up (connections, replica creation) before measuring.
        with src.open("ab") as f:
            f.write(ishiki_lines(1))
        wait_until(lambda: all(read_trace(t, KEY) for t in traces.values()), 15, "warm-up")

        n = max(1, int(rate * seconds))
        plan = [(KEY, src, b) for b in batches(n)]
        pids = {name: d.proc.pid for name, d in daemons.items() if d.proc is not None}
        meter = CpuMeter(pids)
        spies = [PySpy(pid, seconds + 1, profile_dir / f"lag-{rate}-{replicas}r-{name}.txt",
                       gil=PROFILE_GIL, rate=PROFILE_HZ)
                 for name, pid in pids.items() if name in "ab"] if profile_dir else []
        time.sleep(1.2)  # the broker's $SYS counters cover the warm-up
        items0 = {name: scrape_items(port) for name, port in ports.items()}
        msgs0 = broker_publishes(broker.port)
        others = BackgroundMeter()
        others.start()
        meter.start()
        writes, achieved = paced_appends(plan, rate)
        size = writes[-1].end
        drained = wait_bounded(lambda: all(reached(t, KEY, size) for t in traces.values()),
                               drain_timeout, interval=0.02)
        cpu = meter.stop()
        others_cpu = others.stop()
        rss = {name: rss_mb(pid) for name, pid in pids.items()}
        # The writer's group commit (daemon/window.py; absent from older code).
        commit = daemons["a"].status().get("group_commit")
        items = {name: item_deltas(items0[name], scrape_items(port))
                 for name, port in ports.items()}
        time.sleep(1.2)  # one more $SYS refresh: it counts everything up to the drain
        msgs1 = broker_publishes(broker.port)
        msgs = {k: msgs1[k] - msgs0[k] for k in msgs1} if msgs0 and msgs1 else {}
        for spy in spies:
            spy.wait()
        per_replica: dict[str, Stats] = {}
        rows = []
        for name, tpath in traces.items():
            trace = read_trace(tpath, KEY)
            per_replica[name] = lag_stats(writes, trace)
            rows.append(lags_ms(writes, trace)[0])
        return {
            "rate": rate, "achieved": achieved, "writes": n, "bytes": size,
            "replicas": per_replica, "all": worst_of(rows), "cpu": cpu,
            "cpu_per_write_us": {name: 1e6 * used / n for name, used in meter.seconds.items()},
            "system_per_write_us": {name: 1e6 * used / n for name, used in meter.system.items()},
            "others_cpu": others_cpu,
            "rss_mb": rss,  # each daemon's resident memory once drained
            "shipped": lag_stats(writes, read_trace(shipped, KEY)),
            "timed_out": not drained, "stock_broker": stock_broker,
            "group_commit": commit,
            # per write: items the daemons counted (syncd_frames), MQTT PUBLISH messages the
            # broker received from all clients and delivered to them
            "items_per_write": {name: {f"{d} {k}": v / n for (d, k), v in sorted(c.items())}
                                for name, c in items.items()},
            "messages_per_write": {k: v / n for k, v in msgs.items()},
        }
    finally:
        for d in daemons.values():
            d.stop()
        broker.stop()


def catchup(megabytes: int, root: Path, profile_dir: Path | None = None,
            config: str = "") -> dict[str, Any]:
    """A new standby `megabytes` MB behind: seconds and MB/s until its copy is identical.
    `config`: top-level config lines for both daemons (default: stock settings)."""
    root.mkdir(parents=True, exist_ok=True)
    broker = Broker(root / "broker-catchup", max_queued_messages=1000)
    broker.start()
    trace = root / "trace-catchup"
    a = Daemon(root / "cu", "a", broker, tuning=config, log_level="warning")
    b = Daemon(root / "cu", "b", broker, tuning=config, log_level="warning",
               env={"SYNCD_TRACE_FILE": str(trace)})
    try:
        src = a.path(KEY)
        src.parent.mkdir(parents=True, exist_ok=True)
        block = ishiki_lines(2000)
        with src.open("wb") as f:
            while f.tell() < megabytes * 1_000_000:
                f.write(block)
        size = src.stat().st_size
        a.start()
        wait_until(lambda: a.file_status(KEY).get("size") == size, 120, "a to index its file")
        # Where the daemon keeps an incremental log check (status "log_check"), let A finish
        # it first: a real source has long checked its file before a standby joins.
        t_index = time.monotonic()
        checked: float | None = None
        try:
            wait_until(lambda: a.file_status(KEY).get("log_check", {}).get("bytes", size)
                       >= size, 120, "a to finish its log check", interval=0.5)
            checked = time.monotonic() - t_index
        except AssertionError:
            pass  # reported: B's catch-up then competes with A's log check
        # A real log was written long ago: its pages are on disk, not 1 GB of dirty page
        # cache for the kernel to write back while B writes its copy.
        os.sync()
        assert a.proc is not None
        meter = CpuMeter({"a": a.proc.pid})
        meter.start()
        t0 = time.monotonic_ns()
        b.start(wait=False)
        assert b.proc is not None
        spies = [PySpy(b.proc.pid, 8, profile_dir / "catchup-b.txt", gil=True,
                       rate=PROFILE_HZ),
                 PySpy(a.proc.pid, 8, profile_dir / "catchup-a.txt", gil=True,
                       rate=PROFILE_HZ)
                 ] if profile_dir else []
        wait_until(lambda: reached(trace, KEY, size), 600, "catch-up", interval=0.05)
        # b is a new process: all its CPU time so far belongs to the catch-up.
        b_user, b_system = cpu_split(b.proc.pid)
        b_seconds = b_user + b_system
        b_cpu = 100 * b_seconds / ((time.monotonic_ns() - t0) / 1e9)
        cpu = {**meter.stop(), "b": b_cpu}
        cpu_s = {**meter.seconds, "b": b_seconds}
        entries = read_trace(trace, KEY)[KEY]
        first, done = entries[0][1], entries[-1][1]
        total = (done - t0) / 1e9
        streaming = (done - first) / 1e9
        for spy in spies:
            spy.wait()
        identical = _same_bytes(b.path(KEY), src)
        assert identical, "copies differ after catch-up"
        return {"bytes": size, "seconds": total, "mb_s": size / 1e6 / total,
                "streaming_mb_s": size / 1e6 / streaming, "identical": identical, "cpu": cpu,
                "a_log_check_s": checked, "cpu_s": cpu_s, "b_system_s": b_system}
    finally:
        a.stop()
        b.stop()
        broker.stop()


def _same_bytes(x: Path, y: Path) -> bool:
    if x.stat().st_size != y.stat().st_size:
        return False
    with x.open("rb") as fx, y.open("rb") as fy:
        while True:
            bx, by = fx.read(1 << 22), fy.read(1 << 22)
            if bx != by:
                return False
            if not bx:
                return True


def print_lag(r: dict[str, Any]) -> None:
    broker = "stock Mosquitto (no set_tcp_nodelay)" if r.get("stock_broker") else "Mosquitto"
    print(f"lag: {r['writes']} writes at {r['achieved']:.0f}/s ({r['rate']}/s asked), "
          f"{r['bytes'] / 1e6:.1f} MB, {len(r['replicas'])} replica(s), {broker}")
    if r.get("timed_out"):
        print("  TIMED OUT: some writes never arrived (counted as missing below)")
    for node, s in r["replicas"].items():
        print(f"  replica {node}: p50 {s.p50:.2f} ms  p90 {s.p90:.2f} ms  p99 {s.p99:.2f} ms  "
              f"max {s.max:.2f} ms  missing {s.missing}")
    s = r["shipped"]
    print(f"  writer a, fsync'ed and published: p50 {s.p50:.2f} ms  p90 {s.p90:.2f} ms  "
          f"p99 {s.p99:.2f} ms  max {s.max:.2f} ms")
    cpu = "  ".join(f"{n} {p:.0f}%" for n, p in r["cpu"].items())
    print(f"  daemon CPU (100% = one core): {cpu}")
    per_write = "  ".join(f"{n} {us:.0f} us" for n, us in r["cpu_per_write_us"].items())
    print(f"  daemon CPU per write (user + system): {per_write}  (others' CPU meanwhile: "
          f"{r['others_cpu']:.0f}%)")
    system = "  ".join(f"{n} {us:.0f} us" for n, us in r.get("system_per_write_us", {}).items())
    print(f"    of which system (kernel) time: {system}")
    if r.get("rss_mb"):
        print("  resident memory once drained: "
              + "  ".join(f"{n} {mb:.1f} MiB" for n, mb in r["rss_mb"].items()))
    for name, per in r.get("items_per_write", {}).items():
        if per:
            print(f"  {name} items per write: " + "  ".join(f"{k} {v:.2f}" for k, v in per.items()))
    if r.get("messages_per_write"):
        m = r["messages_per_write"]
        print(f"  MQTT messages per write (broker $SYS): received {m['received']:.2f}  "
              f"sent {m['sent']:.2f}")


def print_profiles(profile_dir: Path) -> None:
    for raw in sorted(profile_dir.glob("*.txt")):
        print(f"profile {raw}:")
        print("  top self frames (% of samples):")
        for frame, pct in top_self_frames(raw, 12):
            print(f"    {pct:5.1f}%  {frame}")
        print("  top syncd frames, inclusive:")
        for frame, pct in top_inclusive_frames(raw, "syncd/", 15):
            print(f"    {pct:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=500, help="writes per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=2, choices=(1, 2))
    parser.add_argument("--catchup-mb", type=int, default=512)
    parser.add_argument("--stock-broker", action="store_true",
                        help="Mosquitto's stock config (without set_tcp_nodelay true)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="attach py-spy to the daemons; raw profiles go to DIR")
    parser.add_argument("--config", default="", metavar="LINES",
                        help="top-level config lines for the lag daemons, e.g. "
                             "'batch_window = 0.01' (default: stock settings)")
    parser.add_argument("--catchup-config", default="", metavar="LINES",
                        help="top-level config lines for the catch-up daemons, e.g. "
                             "'fetch_window_bytes = 16777216' (default: stock settings)")
    args = parser.parse_args()
    profile: Path | None = args.profile.resolve() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="syncd-bench-") as tmp:
        root = Path(tmp)
        if args.seconds:
            print_lag(lag(args.rate, args.seconds, root / "lag", args.replicas, profile,
                          args.stock_broker, config=args.config.replace("\\n", "\n")))
        if args.catchup_mb:
            r = catchup(args.catchup_mb, root, profile,
                        config=args.catchup_config.replace("\\n", "\n"))
            print(f"catch-up: {r['bytes'] / 1e6:.0f} MB to a new standby in {r['seconds']:.2f} s "
                  f"including its start-up = {r['mb_s']:.0f} MB/s; streaming "
                  f"{r['streaming_mb_s']:.0f} MB/s (target >= 200 MB/s); daemon CPU "
                  + ", ".join(f"{n} {sec:.1f} s" for n, sec in r["cpu_s"].items())
                  + f" (b's system time {r['b_system_s']:.1f} s)")
        if profile is not None:
            print_profiles(profile)


if __name__ == "__main__":
    main()
