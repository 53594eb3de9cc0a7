"""Every target of issue #12, measured one after the other; a markdown table to paste.

    python -m bench.targets12 [--seconds 10] [--busy 100,300,1000,3000] [--busy-seconds 10]
                              [--catchup-mb 1024] [--scale-kib 1024] [--only NAME,...]
                              [--quiet-wait 0]

Steps (names for --only): cpu500 (500 writes/s, two standbys: CPU per write of each daemon),
stock (500 writes/s through a stock-config Mosquitto, one standby), w2000 (2000 writes/s, two
standbys), w5000 (5000 writes/s, one standby), busy (the busy-keys curve, bench_busy.py),
idle (1000 idle keys: CPU and RSS, bench_scale.py), catchup (a new standby `--catchup-mb` MB
behind), floor (the same CPU per write and catch-up for a bare paho + AES-GCM pipeline without
syncd's logic, bench_floor.py: what this machine allows at all). Every wait is bounded: a copy
that never catches up is reported as missing writes.

The machine may be shared: each row shows the CPU other processes used meanwhile (100 % = one
core) and the load average at its start; --quiet-wait S waits up to S s for them to calm down
before each step. Needs mosquitto (tests/run.sh installs it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_busy, bench_floor, bench_replication, bench_scale
from bench.harness import BackgroundMeter, Stats, ms, wait_quiet

CPU_PER_WRITE_US = 150.0
STOCK_P99_MS = 20.0
W2000_P99_MS = 20.0
W5000_P99_MS = 50.0
IDLE_CPU_PCT, RSS_MB, CATCHUP_MB_S = 1.0, 150.0, 200.0
STEPS = ("cpu500", "stock", "w2000", "w5000", "busy", "idle", "catchup", "floor")


def ok(good: bool) -> str:
    return "met" if good else "**MISSED**"


def lag_cell(s: Stats) -> str:
    cell = f"p50 {ms(s.p50)}, p90 {ms(s.p90)}, p99 {ms(s.p99)}"
    return cell + (f", **{s.missing} missing**" if s.missing else "")


class Run:
    def __init__(self, root: Path, quiet_wait: float) -> None:
        self.root = root
        self.quiet_wait = quiet_wait
        self.rows: list[list[str]] = []
        self.notes: list[str] = []

    def step(self, name: str, fn: Callable[[Path], list[list[str]]]) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", file=sys.stderr, flush=True)
        if self.quiet_wait > 0:
            wait_quiet(10.0, self.quiet_wait)
        load = os.getloadavg()[0]
        meter = BackgroundMeter()
        meter.start()
        t0 = time.monotonic()
        try:
            rows = fn(self.root / name)
        except Exception as e:
            traceback.print_exc()
            rows = [[name, "-", f"failed: {type(e).__name__}: {str(e)[:200]}", "**MISSED**"]]
        others = meter.stop()
        print(f"    {time.monotonic() - t0:.0f} s, others' CPU {others:.0f} %", file=sys.stderr,
              flush=True)
        for row in rows:
            self.rows.append([*row, f"{others:.0f} % (load {load:.1f})"])


def replication_rows(r: dict[str, Any], what: str, p99_ms: float | None) -> list[list[str]]:
    rows = []
    for node, s in r["replicas"].items():
        if p99_ms is not None:
            rows.append([f"{what}: standby {node} lag p99 <= {p99_ms:g} ms", lag_cell(s),
                         ok(s.missing == 0 and s.p99 <= p99_ms)])
    rows.append([f"{what}: achieved rate, CPU per write",
                 f"{r['achieved']:.0f} writes/s; "
                 + ", ".join(f"{n} {us:.0f} µs" for n, us in r["cpu_per_write_us"].items()),
                 "(reported)"])
    msgs = r.get("messages_per_write")
    items = r.get("items_per_write", {}).get("a", {})
    if msgs or items:
        live = items.get("sent live")
        rows.append([f"{what}: per write", (f"{live:.2f} live items sent by a; " if live else "")
                     + (f"{msgs['received']:.2f} MQTT messages into the broker, "
                        f"{msgs['sent']:.2f} out" if msgs else ""), "(reported)"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds of writing per replication run")
    parser.add_argument("--busy", default="100,300,1000,3000", help="busy-keys rows")
    parser.add_argument("--busy-seconds", type=float, default=10.0)
    parser.add_argument("--busy-grace", type=float, default=30.0)
    parser.add_argument("--catchup-mb", type=int, default=1024)
    parser.add_argument("--scale-kib", type=int, default=1024,
                        help="file size of the 1000 idle keys, KiB")
    parser.add_argument("--idle", type=float, default=60.0,
                        help="idle window, s (20 s read 0.45-1.15 %% on one code: noisy)")
    parser.add_argument("--only", default=",".join(STEPS), help="comma-separated steps")
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="wait up to S s before each step for others' CPU to drop < 10 %%")
    args = parser.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(STEPS)
    if unknown:
        parser.error(f"unknown steps: {', '.join(sorted(unknown))} (known: {', '.join(STEPS)})")
    t_start = time.monotonic()
    secs = args.seconds
    with tempfile.TemporaryDirectory(prefix="syncd-targets12-") as tmp:
        run = Run(Path(tmp), args.quiet_wait)
        if "cpu500" in only:
            def cpu500(d: Path) -> list[list[str]]:
                r = bench_replication.lag(500, secs, d, 2)
                rows = [[f"CPU per replicated write <= {CPU_PER_WRITE_US:g} µs, 500 writes/s, "
                         f"daemon {n}", f"{us:.0f} µs", ok(us <= CPU_PER_WRITE_US)]
                        for n, us in r["cpu_per_write_us"].items()]
                return rows + replication_rows(r, "500 writes/s, 2 standbys", None) + [
                    ["500 writes/s, 2 standbys: lag (slower standby, per write)",
                     lag_cell(r["all"]), "(reported)"]]
            run.step("cpu500", cpu500)
        if "stock" in only:
            run.step("stock", lambda d: replication_rows(
                bench_replication.lag(500, secs, d, 1, stock_broker=True),
                "500 writes/s, stock Mosquitto (no set_tcp_nodelay)", STOCK_P99_MS))
        if "w2000" in only:
            run.step("w2000", lambda d: replication_rows(
                bench_replication.lag(2000, secs, d, 2), "2000 writes/s, 2 standbys",
                W2000_P99_MS))
        if "w5000" in only:
            run.step("w5000", lambda d: replication_rows(
                bench_replication.lag(5000, secs, d, 1), "5000 writes/s, 1 standby",
                W5000_P99_MS))
        if "busy" in only:
            def busy(d: Path) -> list[list[str]]:
                rows = []
                for keys in [int(c) for c in args.busy.split(",") if c.strip()]:
                    r = bench_busy.busy(keys, d / str(keys), args.busy_seconds, args.busy_grace)
                    s: Stats = r["lag"]
                    target = bench_busy.TARGET_P99_MS.get(keys)
                    what = (f"{keys} keys x 1 write/s: standby lag p99 <= {target:g} ms"
                            if target else f"{keys} keys x 1 write/s: standby lag")
                    cell = lag_cell(s) + (f", max {ms(s.max)}"
                                          + ("" if r["drained"] else ", timed out")
                                          + f"; CPU per write a {r['cpu_per_write_us']['a']:.0f}"
                                          f" / b {r['cpu_per_write_us']['b']:.0f} µs")
                    rows.append([what, cell, ok(s.missing == 0 and s.p99 <= target)
                                 if target else "(reported)"])
                return rows
            run.step("busy", busy)
        if "idle" in only:
            def idle(d: Path) -> list[list[str]]:
                r = bench_scale.run(d, 1000, args.scale_kib, args.idle, 1)
                cpu, rss = max(r["idle_cpu"].values()), max(r["rss_idle"].values())
                return [[f"1000 idle keys ({args.scale_kib} KiB): CPU per daemon < "
                         f"{IDLE_CPU_PCT:g} % (worse of a, b)",
                         " / ".join(f"{v:.2f} %" for v in r["idle_cpu"].values()),
                         ok(cpu < IDLE_CPU_PCT)],
                        [f"1000 idle keys: RSS per daemon < {RSS_MB:g} MB",
                         " / ".join(f"{v:.0f} MB" for v in r["rss_idle"].values()),
                         ok(rss < RSS_MB)]]
            run.step("idle", idle)
        if "catchup" in only:
            def catchup(d: Path) -> list[list[str]]:
                r = bench_replication.catchup(args.catchup_mb, d)
                return [[f"catch-up of a {args.catchup_mb} MB log >= {CATCHUP_MB_S:g} MB/s "
                         "(incl. the standby's start-up)",
                         f"{r['mb_s']:.0f} MB/s (streaming {r['streaming_mb_s']:.0f} MB/s)",
                         ok(r["mb_s"] >= CATCHUP_MB_S)]]
            run.step("catchup", catchup)
        if "floor" in only:
            def floor(d: Path) -> list[list[str]]:
                rows = []
                for raw in (False, True):
                    reader = "its own socket reader" if raw else "paho"
                    # syncd's defaults: no batch window, wire version 6's AES-GCM, 2 standbys
                    w = bench_floor.per_write(d / f"w{raw}", 500, secs, 0.0, raw, "aes-gcm",
                                              standbys=2)
                    c = bench_floor.catchup(d / f"c{raw}", args.catchup_mb, 256 * 1024, raw,
                                            "aes-gcm")
                    rows += [[f"floor, no syncd logic, standby reading with {reader}: CPU per "
                              "write at 500 writes/s, writer / standby",
                              f"{w['writer_us']:.0f} / {w['standby_us']:.0f} µs", "(reported)"],
                             [f"floor, no syncd logic, standby reading with {reader}: catch-up "
                              f"of {args.catchup_mb} MB", f"{c['mb_s']:.0f} MB/s", "(reported)"]]
                return rows
            run.step("floor", floor)
    print(f"Issue #12 targets, `python -m bench.targets12` "
          f"({' '.join(sys.argv[1:]) or 'defaults'}), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took "
          f"{(time.monotonic() - t_start) / 60:.1f} min\n")
    print("| target | measured | | others' CPU |\n|---|---|---|---|")
    for row in run.rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
