"""Run every bench, one at a time, and write bench/RESULTS.md: the current figures, only.

    python -m bench.run_all --results bench/RESULTS.md [--quick] [--retries N]
                            [--quiet-wait S] [--profile DIR]

RESULTS.md is rewritten whole, with the date and commit at its top: it holds the figures of
one run of the code it names, and earlier figures live in its git history. The suite covers
the targets of issue 7 (lag, lsyncd, catch-up, scale, verify) and of issue 12 (CPU per write,
a stock broker, 2000 and 5000 writes/s, busy keys, 1000 idle keys, the floor of the stack),
and the cost of a frame.

Needs mosquitto, lsyncd and rsync (Debian: apt-get install -y mosquitto lsyncd rsync); py-spy
only with --profile. All traffic stays on 127.0.0.1 and every run is bounded in time: on a
quiet 2-core machine the full suite takes about ten minutes, --quick about three. The machine
may be shared, so each bench waits (up to --quiet-wait s) for other processes to quieten down
first and runs again when they took much CPU during it (--retries); RESULTS.md shows how much
they took. --profile attaches py-spy to the daemons during the measured windows and writes raw
profiles to DIR: that perturbs the figures, so compare profiled runs only with each other.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    bench_busy,
    bench_floor,
    bench_frames,
    bench_lsyncd,
    bench_replication,
    bench_scale,
)
from bench.harness import BackgroundMeter, Stats, ms, wait_quiet
from tests.support.cluster import Broker, Daemon

REPO = Path(__file__).resolve().parent.parent
RATES = (50, 500, 2000)


@dataclass(frozen=True)
class Plan:
    lag_seconds: float
    lsyncd_seconds: float
    defaults_rates: tuple[int, ...]  # lsyncd defaults: its 15 s delay makes runs long
    defaults_seconds: float
    defaults_settle: float
    catchup_mb: int
    scale_keys: int
    scale_kib: int
    idle_seconds: float
    load_seconds: float
    scrub_seconds: float
    verify_args: tuple[str, ...]
    busy_keys: tuple[int, ...]  # the busy-keys curve (bench_busy.py), keys x 1 write/s
    busy_seconds: float
    busy_grace: float
    floor_seconds: float  # the floor of the stack (bench_floor.py)
    floor_catchup_mb: int
    frame_rounds: int  # bench_frames.py


FULL = Plan(10, 8, (50, 500), 20, 25, 1024, 1000, 1024, 60, 20, 20,
            ("--mb", "200", "--runs", "3"), (100, 300, 1000, 3000), 10, 30, 10, 1024, 3000)
QUICK = Plan(3, 3, (500,), 5, 20, 200, 1000, 128, 5, 5, 0, ("--mb", "50", "--runs", "1"),
             (100,), 3, 10, 3, 100, 300)

# Targets from issue 7.
LAG_P50_MS, LAG_P99_MS, LSYNCD_FACTOR = 3.0, 20.0, 10.0
# Targets from issue 12 (bench/targets12.py measures the same, alone).
CPU_PER_WRITE_US, STOCK_P99_MS, W2000_P99_MS, W5000_P99_MS, CATCHUP12_MB_S = (
    150.0, 20.0, 20.0, 50.0, 200.0)
FLOOR_FACTOR = 1.3  # issue #26: CPU per write within 1.3 x the floor measured in the same run
# issue #26: the protection of a 700-byte frame, sealed for two recipients / opened by one
CRYPTO_FRAME_BYTES, CRYPTO_SENDER_US, CRYPTO_RECIPIENT_US = 700, 10.0, 5.0
QUIET_PCT, QUIET_WAIT = 10.0, 180.0  # others' CPU % that counts as quiet; longest wait, s
DISTURBED_PCT = 25.0  # others' CPU % during a bench that makes it run again
SCRUB_WAIT_MAX = 90.0  # wait for the first scrub pass only if it starts this soon, s
CATCHUP_MB_S, IDLE_CPU_PCT, RSS_MB, READY_S, VERIFY_MB_S = 100.0, 1.0, 150.0, 3.0, 100.0


def check_tools(profile: bool) -> None:
    missing = [t for t in ("mosquitto", "lsyncd", "rsync")
               if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if missing:
        sys.exit(f"run_all: missing {', '.join(missing)}; on Debian/Ubuntu run:\n"
                 f"  apt-get update && apt-get install -y {' '.join(missing)}")
    if profile and shutil.which("py-spy") is None:
        sys.exit("run_all: --profile needs py-spy (pip install py-spy)")


def _out(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    return (p.stdout + p.stderr).strip()


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 2**20:.1f} GiB"
    tmp = tempfile.gettempdir()
    fs = _out(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", tmp])
    return {"cores": str(os.cpu_count()), "CPU model": model, "kernel": platform.release(),
            "memory": mem, f"filesystem of {tmp}": fs}


def versions() -> dict[str, str]:
    mosq = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    found = re.search(r"mosquitto version \S+", _out([mosq, "-h"]))
    rev = _out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = _out(["git", "-C", str(REPO), "status", "--porcelain", "--", "syncd"])
    if dirty:
        # A digest of the uncommitted state, so that a change during the run shows.
        diff = _out(["git", "-C", str(REPO), "diff", "HEAD", "--", "syncd"]) + dirty
        rev += (f" + uncommitted changes in {len(dirty.splitlines())} file(s) under syncd/ "
                f"(diff digest {hashlib.sha256(diff.encode()).hexdigest()[:8]})")
    out = {
        "python": platform.python_version(),
        "mosquitto": found.group(0) if found else "unknown",
        "lsyncd": _out(["lsyncd", "--version"]).splitlines()[0],
        "rsync": _out(["rsync", "--version"]).splitlines()[0],
        "syncd git rev": rev,
    }
    for pkg in ("aiomqtt", "paho-mqtt", "watchdog", "orjson"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def config_samples(tmp: Path) -> tuple[str, str]:
    """The Mosquitto and syncd configs the benches generate (port and paths vary per run)."""
    broker = Broker(tmp / "sample-broker")
    daemon = Daemon(tmp / "sample", "a", broker, tuning="", log_level="warning")
    return broker.conf.read_text(), daemon.config.read_text()


def run_verify(plan: Plan) -> dict[str, Any]:
    cmd = [sys.executable, "bench/bench_verify.py", *plan.verify_args]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    line = p.stdout.strip().splitlines()[-1]
    found = re.search(r"= (\d+(?:\.\d+)?) MB/s", line)
    return {"line": line, "mb_s": float(found.group(1)) if found else float("nan"),
            "command": "python " + " ".join(cmd[1:])}


# The floor's protection: what wire version 6 (syncd/core/sealed.py) does per frame, AES-GCM
# under a key wrapped per recipient (version 5's Ed25519: `python -m bench.bench_floor`).
FLOOR_CRYPTO = "aes-gcm"


def run_floor(root: Path, plan: Plan) -> dict[str, Any]:
    """The floor: CPU per write and catch-up of a bare paho + AES-GCM pipeline, the standby
    reading through paho, then reading the socket itself."""
    out: dict[str, Any] = {}
    for raw in (False, True):
        reader = "own reader" if raw else "paho"
        out[reader] = {
            # syncd's defaults: no batch window (inotify and group commit), two standbys.
            "per_write": bench_floor.per_write(root / f"w-{raw}", 500, plan.floor_seconds,
                                               0.0, raw, FLOOR_CRYPTO, standbys=2),
            "catchup": bench_floor.catchup(root / f"c-{raw}", plan.floor_catchup_mb,
                                           256 * 1024, raw, FLOOR_CRYPTO),
        }
    return out


def run_frames(plan: Plan) -> dict[tuple[str, int], tuple[float, float, int]]:
    """bench_frames' figures: (wire version, items per frame) -> (sender µs, recipient µs,
    frame bytes)."""
    return {(version, items): measure(items, max(plan.frame_rounds // items, 50))
            for version, measure in bench_frames.VERSIONS for items in bench_frames.BATCHES}


def run_crypto(plan: Plan) -> dict[str, float]:
    """The protection alone of one 700-byte frame (bench_frames.crypto_only): sealed for two
    recipients by the sender, opened by one of them; what issue #26's crypto target names."""
    # A few microseconds each: enough rounds even in --quick to pass the warm-up (0.1 s).
    seal, open_, _ = bench_frames.crypto_only(CRYPTO_FRAME_BYTES,
                                              max(3 * plan.frame_rounds, 9000))
    return {"sender_us": seal, "recipient_us": open_}


class Suite:
    def __init__(self, plan: Plan, root: Path, profile: Path | None, retries: int,
                 quiet_wait: float = QUIET_WAIT) -> None:
        self.plan, self.root, self.profile, self.quiet_wait = plan, root, profile, quiet_wait
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.background: dict[str, tuple[float, float]] = {}  # others' CPU %: before, during
        self.attempts: dict[str, int] = {}
        self.retries = retries

    def step(self, name: str, fn: Callable[[Path], Any]) -> None:
        """Run one bench once the host is quiet; again if others disturbed it (keeping the
        least disturbed run); a failure is recorded and the suite goes on."""
        for attempt in range(1 + self.retries):
            print(f"[{time.strftime('%H:%M:%S')}] {name}"
                  f"{f' (again, try {attempt + 1})' if attempt else ''} ...", flush=True)
            # The host may be shared: start only when others leave the cores alone, and
            # record how much CPU they took meanwhile.
            before = wait_quiet(QUIET_PCT, self.quiet_wait)
            meter = BackgroundMeter()
            meter.start()
            t0 = time.monotonic()
            try:
                # A fresh directory per try: traces and state of an earlier try would count.
                result, error = fn(self.root / f"{name.replace(' ', '-')}-{attempt}"), None
            except Exception as e:
                result, error = None, f"{type(e).__name__}: {e}"
                traceback.print_exc()
            during = meter.stop()
            print(f"    {time.monotonic() - t0:.0f} s, other processes {during:.0f}% CPU"
                  f"{'  FAILED' if error else ''}", flush=True)
            best = self.background.get(name)
            if error is None and (name not in self.results or best is None
                                  or during < best[1]):
                self.results[name] = result
                self.background[name] = (before, during)
                self.errors.pop(name, None)
            elif name not in self.results:
                self.errors[name] = error or "failed"
                self.background[name] = (before, during)
            if name in self.results and self.background[name][1] < DISTURBED_PCT:
                break
        self.attempts[name] = attempt + 1

    def run(self) -> None:
        p = self.plan
        for rate in RATES:
            for replicas in (1, 2):
                self.step(f"syncd {rate} {replicas}", lambda d, r=rate, n=replicas: (
                    bench_replication.lag(r, p.lag_seconds, d, n, self.profile)))
        self.step("syncd 500 stock", lambda d: bench_replication.lag(
            500, p.lag_seconds, d, 1, self.profile, stock_broker=True))
        self.step("syncd 5000 1", lambda d: bench_replication.lag(
            5000, p.lag_seconds, d, 1, self.profile))
        for rate in RATES:
            self.step(f"lsyncd tuned {rate}", lambda d, r=rate: bench_lsyncd.lag(
                r, p.lsyncd_seconds, d, "tuned"))
        for rate in p.defaults_rates:
            self.step(f"lsyncd defaults {rate}", lambda d, r=rate: bench_lsyncd.lag(
                r, p.defaults_seconds, d, "defaults", p.defaults_settle))
        self.step("catch-up", lambda d: bench_replication.catchup(p.catchup_mb, d, self.profile))
        # Waiting for the first scrub pass is worth it only while it comes soon after start.
        scrub = p.scrub_seconds if bench_scale.SCRUB_INTERVAL <= SCRUB_WAIT_MAX else 0
        self.step("scale", lambda d: bench_scale.run(
            d, p.scale_keys, p.scale_kib, p.idle_seconds, p.load_seconds, self.profile, scrub))
        self.step("verify", lambda d: run_verify(p))
        self.step("busy", lambda d: {
            keys: bench_busy.busy(keys, d / str(keys), p.busy_seconds, p.busy_grace)
            for keys in p.busy_keys})
        self.step("floor", lambda d: run_floor(d, p))
        self.step("frames", lambda d: run_frames(p))
        self.step("crypto", lambda d: run_crypto(p))


# --- the report -----------------------------------------------------------------------------

def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def worst(r: dict[str, Any]) -> Stats:
    """The slower replica's percentiles (each percentile taken on its own)."""
    reps: list[Stats] = list(r["replicas"].values())
    return Stats(sum(s.n for s in reps), max(s.p50 for s in reps), max(s.p90 for s in reps),
                 max(s.p99 for s in reps), max(s.max for s in reps),
                 sum(s.missing for s in reps))


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**MISSED**")


class Report:
    def __init__(self, suite: Suite, info: dict[str, dict[str, str]], argv: list[str],
                 samples: tuple[str, str], took: float) -> None:
        self.r, self.errors, self.background = suite.results, suite.errors, suite.background
        self.quiet_wait = suite.quiet_wait
        self.retries, self.attempts = suite.retries, suite.attempts
        self.plan, self.info, self.argv, self.samples, self.took = (
            suite.plan, info, argv, samples, took)

    def get(self, name: str) -> dict[str, Any] | None:
        return self.r.get(name)

    def others(self, step: str) -> str:
        """Other processes' CPU % during a step (the host may be shared)."""
        b = self.background.get(step)
        tries = self.attempts.get(step, 1)
        return (f"{b[1]:.0f} %" + (f" (least of {tries} runs)" if tries > 1 else "")) if b else ""

    def targets(self) -> list[list[str]]:
        """[what, target, measured, verdict, others' CPU during the step]."""
        rows = []
        s500, l500 = self.get("syncd 500 2"), self.get("lsyncd tuned 500")
        lag_step = "syncd 500 2"
        if s500:
            w = worst(s500)
            rows += [
                ["lag p50 at 500 writes/s, 2 replicas (slower replica)", f"<= {LAG_P50_MS:g} ms",
                 ms(w.p50), verdict(w.p50 <= LAG_P50_MS), self.others(lag_step)],
                ["lag p99 at 500 writes/s, 2 replicas (slower replica)", f"<= {LAG_P99_MS:g} ms",
                 ms(w.p99), verdict(w.p99 <= LAG_P99_MS), self.others(lag_step)],
            ]
            if l500:
                lp99 = l500["lag"].p99
                rows.append(["lag p99 vs tuned lsyncd p99, 500 writes/s",
                             f"<= 1/{LSYNCD_FACTOR:g} of it ({ms(lp99 / LSYNCD_FACTOR)})",
                             f"{ms(w.p99)} = {w.p99 / lp99:.2f} x {ms(lp99)}",
                             verdict(w.p99 * LSYNCD_FACTOR <= lp99), self.others(lag_step)])
        else:
            rows.append(["lag at 500 writes/s, 2 replicas", "", "failed", verdict(None), ""])
        cu = self.get("catch-up")
        rows.append([f"catch-up, new standby {self.plan.catchup_mb} MB behind (incl. start-up)",
                     f">= {CATCHUP_MB_S:g} MB/s", f"{cu['mb_s']:.0f} MB/s" if cu else "failed",
                     verdict(cu["mb_s"] >= CATCHUP_MB_S if cu else None),
                     self.others("catch-up")])
        sc = self.get("scale")
        keys, kib, others = self.plan.scale_keys, self.plan.scale_kib, self.others("scale")
        if sc:
            idle = max(sc["idle_cpu"].values())
            rss = max(*sc["rss_ready"].values(), *sc["rss_idle"].values())
            ready = max(sc["ready_a"], sc["ready_b"])
            rows += [
                [f"{keys} idle keys: CPU per daemon (worse of A, B)", f"< {IDLE_CPU_PCT:g} %",
                 f"{idle:.2f} %", verdict(idle < IDLE_CPU_PCT), others],
                [f"{keys} idle keys: RSS per daemon (worse of A, B)", f"< {RSS_MB:g} MB",
                 f"{rss:.0f} MB", verdict(rss < RSS_MB), others],
                [f"READY with {keys} x {kib} KiB, positions persisted", f"< {READY_S:g} s",
                 f"{ready:.2f} s", verdict(ready < READY_S), others],
            ]
        else:
            rows.append([f"scale ({keys} keys)", "", "failed", verdict(None), others])
        v = self.get("verify")
        rows.append(["`syncd verify` throughput (target from bench_verify.py)",
                     f">= {VERIFY_MB_S:g} MB/s", f"{v['mb_s']:.0f} MB/s" if v else "failed",
                     verdict(v["mb_s"] >= VERIFY_MB_S if v else None), self.others("verify")])
        return rows

    def targets12(self) -> list[list[str]]:
        """Issue #12's fleet-scale targets: [what, target, measured, verdict, others' CPU]."""
        rows: list[list[str]] = []

        def p99_rows(step: str, what: str, limit: float) -> None:
            r = self.get(step)
            if r is None:
                rows.append([what, f"p99 <= {limit:g} ms", "failed", verdict(None), ""])
                return
            for node, s in r["replicas"].items():
                miss = f", **{s.missing} missing**" if s.missing else ""
                rows.append([f"{what}, standby {node}", f"p99 <= {limit:g} ms",
                             f"p50 {ms(s.p50)}, p99 {ms(s.p99)}{miss}",
                             verdict(s.missing == 0 and s.p99 <= limit), self.others(step)])

        r500 = self.get("syncd 500 2")
        if r500:
            cpu = r500["cpu_per_write_us"]
            limits = self.cpu_limits()
            target = f"<= {CPU_PER_WRITE_US:g} µs" + (
                f" or {FLOOR_FACTOR:g} x the floor (writer / standby {limits[0]:.0f} / "
                f"{limits[1]:.0f} µs), whichever is higher" if limits else "")
            lim = limits or (CPU_PER_WRITE_US, CPU_PER_WRITE_US)
            rows.append(["CPU per replicated write, 500 writes/s, 2 standbys (writer a / b / c)",
                         target, " / ".join(f"{us:.0f} µs" for us in cpu.values()),
                         verdict(all(us <= lim[0 if n == "a" else 1] for n, us in cpu.items())),
                         self.others("syncd 500 2")])
        for rate in (2000, 5000):
            r = self.get(f"syncd {rate} {2 if rate == 2000 else 1}")
            if r:
                rows.append([f"(reported) CPU per write at {rate} writes/s, writer", "",
                             f"{r['cpu_per_write_us']['a']:.0f} µs", "",
                             self.others(f"syncd {rate} {2 if rate == 2000 else 1}")])
        p99_rows("syncd 500 stock", "500 writes/s, stock Mosquitto (no set_tcp_nodelay)",
                 STOCK_P99_MS)
        p99_rows("syncd 2000 2", "2000 writes/s, 2 standbys", W2000_P99_MS)
        p99_rows("syncd 5000 1", "5000 writes/s, 1 standby", W5000_P99_MS)
        busy: dict[int, Any] | None = self.r.get("busy")
        for keys in self.plan.busy_keys:
            r = busy.get(keys) if busy else None
            target = bench_busy.TARGET_P99_MS.get(keys)
            what = f"{keys} busy keys x 1 write/s, standby lag"
            if r is None:
                rows.append([what, "", "failed", verdict(None), ""])
                continue
            s = r["lag"]
            miss = f", **{s.missing} missing**" if s.missing else ""
            cpu = r["cpu_per_write_us"]
            rows.append([what, f"p99 <= {target:g} ms" if target else "(reported)",
                         f"p50 {ms(s.p50)}, p99 {ms(s.p99)}{miss}; CPU per write "
                         f"a {cpu['a']:.0f} / b {cpu['b']:.0f} µs",
                         verdict(s.missing == 0 and s.p99 <= target) if target else "",
                         self.others("busy")])
        sc = self.get("scale")
        if sc:
            idle = max(sc["idle_cpu"].values())
            rows.append([f"{self.plan.scale_keys} idle keys: CPU per daemon over "
                         f"{self.plan.idle_seconds:g} s (A / B)", f"< {IDLE_CPU_PCT:g} %",
                         " / ".join(f"{v:.2f} %" for v in sc["idle_cpu"].values()),
                         verdict(idle < IDLE_CPU_PCT), self.others("scale")])
        cr = self.get("crypto")
        rows.append([f"crypto per {CRYPTO_FRAME_BYTES}-byte frame, wire version 6: sender "
                     "(2 recipients) / recipient",
                     f"<= {CRYPTO_SENDER_US:g} / <= {CRYPTO_RECIPIENT_US:g} µs",
                     f"{cr['sender_us']:.1f} / {cr['recipient_us']:.1f} µs" if cr else "failed",
                     verdict(cr["sender_us"] <= CRYPTO_SENDER_US
                             and cr["recipient_us"] <= CRYPTO_RECIPIENT_US if cr else None),
                     self.others("crypto")])
        cu = self.get("catch-up")
        rows.append([f"catch-up of a {self.plan.catchup_mb} MB log, start-up included",
                     f">= {CATCHUP12_MB_S:g} MB/s",
                     f"{cu['mb_s']:.0f} MB/s (streaming {cu['streaming_mb_s']:.0f})" if cu
                     else "failed", verdict(cu["mb_s"] >= CATCHUP12_MB_S if cu else None),
                     self.others("catch-up")])
        return rows

    def cpu_limits(self) -> tuple[float, float] | None:
        """Issue #26's CPU per write limits (writer, standby): 150 µs or FLOOR_FACTOR x the
        floor measured in the same run (the lower of its two readers), whichever is higher."""
        fl = self.get("floor")
        if fl is None:
            return None
        writer = min(r["per_write"]["writer_us"] for r in fl.values())
        standby = min(r["per_write"]["standby_us"] for r in fl.values())
        return (max(CPU_PER_WRITE_US, FLOOR_FACTOR * writer),
                max(CPU_PER_WRITE_US, FLOOR_FACTOR * standby))

    def floor_rows(self) -> list[list[str]]:
        fl = self.get("floor")
        if fl is None:
            return [["floor", f"failed: {self.errors.get('floor')}", "", ""]]
        return [[reader, f"{r['per_write']['writer_us']:.0f} µs",
                 f"{r['per_write']['standby_us']:.0f} µs", f"{r['catchup']['mb_s']:.0f} MB/s"]
                for reader, r in fl.items()]

    def frame_rows(self) -> list[list[str]]:
        fr = self.get("frames")
        if fr is None:
            return [["frames", f"failed: {self.errors.get('frames')}", "", "", "", ""]]
        return [[version, str(items), f"{size:,}".replace(",", " "), f"{enc:.1f} µs",
                 f"{dec:.1f} µs", f"{(enc + dec) / items:.1f} µs"]
                for (version, items), (enc, dec, size) in fr.items()]

    def syncd_rows(self, step: str, what: str, rate: int, n: int) -> list[list[str]]:
        r = self.get(step)
        if r is None:
            return [[what, str(rate), "failed", *[""] * 7]]
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu"].items())
        entries = [(f"replica {k}", s) for k, s in r["replicas"].items()]
        if n > 1:
            entries.append(("on both (per write, slower)", r["all"]))
        entries.append(("(writer A: fsync'ed + sent)", r["shipped"]))
        return [[f"{what}: {label}", str(rate), f"{r['achieved']:.0f}", str(s.n), *s.row(), cpu,
                 self.others(step)] for label, s in entries]

    def lag_rows(self) -> list[list[str]]:
        rows = []
        for rate in RATES:
            for n in (1, 2):
                rows += self.syncd_rows(f"syncd {rate} {n}", f"syncd {n}r", rate, n)
            if rate == 500:
                rows += self.syncd_rows("syncd 500 stock", "syncd 1r, stock Mosquitto", 500, 1)
            for mode in ("tuned", "defaults"):
                step = f"lsyncd {mode} {rate}"
                r = self.get(step)
                if r is None:
                    continue
                s = r["lag"]
                miss = f" ({s.missing} never arrived)" if s.missing else ""
                rows.append([f"lsyncd {mode}{miss}", str(rate), f"{r['achieved']:.0f}", str(s.n),
                             *s.row(), f"lsyncd+rsync {r['cpu']['lsyncd+rsync']:.0f}%",
                             self.others(step)])
        rows += self.syncd_rows("syncd 5000 1", "syncd 1r", 5000, 1)
        return rows

    def ratio_rows(self) -> list[list[str]]:
        rows = []
        for rate in RATES:
            lr = self.get(f"lsyncd tuned {rate}")
            for n in (1, 2):
                r = self.get(f"syncd {rate} {n}")
                if r is None or lr is None:
                    continue
                s, lsy = worst(r), lr["lag"]
                rows.append([str(rate), str(n), ms(s.p50), ms(lsy.p50), f"{s.p50 / lsy.p50:.3f}",
                             ms(s.p99), ms(lsy.p99), f"{s.p99 / lsy.p99:.3f}"])
        return rows

    def scale_rows(self) -> list[list[str]]:
        sc = self.get("scale")
        if sc is None:
            return [["scale", "failed"]]
        a_b = "A {:.2f} s, B {:.2f} s"
        rows = [
            ["files", f"{sc['keys']} keys x {sc['file_bytes'] / 2**20:.3f} MiB on each of A, B "
                      f"(made in {sc['make_s']:.1f} s)"],
            ["first start to READY (nothing persisted: every file hashed)",
             a_b.format(sc["cold_ready_a"], sc["cold_ready_b"])],
            ["first start until all start-up work is done (log checks included)",
             f"{sc['cold_settle_s']:.1f} s from B's spawn"],
            ["SIGTERM to exit after the first start (every position saved)",
             a_b.format(sc["stop_a"], sc["stop_b"])],
            ["restart to READY (positions persisted; A alone, then B with A up)",
             a_b.format(sc["ready_a"], sc["ready_b"])],
            ["`syncd status` right after READY",
             f"A {sc['states_a']}; B {sc['states_b']}"],
            ["RSS at READY", _pair(sc["rss_ready"], "{:.0f} MB")],
            [f"idle CPU over {self.plan.idle_seconds:g} s", _pair(sc["idle_cpu"], "{:.2f} %")],
            ["RSS after idle", _pair(sc["rss_idle"], "{:.0f} MB")],
            [f"load: every key appends once a second for {self.plan.load_seconds:g} s",
             f"{sc['load_writes']} writes at {sc['load_rate']:.0f}/s"
             + (" (B had not caught up 60 s after the end)" if sc.get("load_timed_out") else "")],
            ["load: CPU over writing + catch-up", _pair(sc["load_cpu"], "{:.0f} %")],
            ["load: lag append -> fsync'ed and sent by A (p50 / p90 / p99 / max)",
             " / ".join(sc["ship_lag"].row())],
            ["load: lag append -> durable on B (p50 / p90 / p99 / max)",
             " / ".join(sc["load_lag"].row())
             + (f", {sc['load_lag'].missing} never arrived" if sc["load_lag"].missing else "")],
            ["RSS after load", _pair(sc["rss_load"], "{:.0f} MB")],
            ["SIGTERM to exit after the load (every position changed)",
             _pair(sc["stop_after_load"], "{:.2f} s")],
            ["SIGTERM to exit after a restart that changed nothing",
             _pair(sc["stop_unchanged"], "{:.2f} s")],
        ]
        if "scrub_cpu" not in sc:
            rows.append(["background scrub",
                         f"not measured: its first pass starts {bench_scale.SCRUB_INTERVAL:g} s "
                         "after start; `python -m bench.bench_scale --scrub 20` waits for it"])
        else:
            total = sc["keys"] * sc["file_bytes"]
            rows.append([f"CPU over {self.plan.scrub_seconds:g} s from "
                         f"{sc['scrub_start_s']:.0f} s after restart (the first background "
                         f"scrub pass: {total / 1e6:.0f} MB at "
                         f"{bench_scale.SCRUB_RATE / 2**20:.0f} MiB/s, every "
                         f"{bench_scale.SCRUB_INTERVAL:g} s)", _pair(sc["scrub_cpu"], "{:.1f} %")])
        return rows

    def render(self) -> str:
        p = self.plan
        now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        broker_conf, daemon_conf = self.samples
        lsyncd_confs = {m: self.get(f"lsyncd {m} 500") for m in ("tuned", "defaults")}
        out = [
            "# syncd benchmarks: the current figures",
            "",
            f"Written by `{' '.join(self.argv)}` on {now}, at commit "
            f"{self.info['versions']['syncd git rev']}; the suite took {self.took / 60:.1f} "
            "min. Every bench ran alone, one after the other; all traffic on 127.0.0.1. "
            "This file holds one run's figures only: earlier runs are in its git history "
            "(`git log -p bench/RESULTS.md`). What the figures mean: docs/development.md, "
            "\"Benchmarks\".",
            "",
            "## Targets",
            "",
            "Issue 7's targets:",
            "",
            table(["what", "target", "measured", "", "others' CPU"], self.targets()),
            "",
            "Issue 12's fleet-scale targets (`python -m bench.targets12` measures them alone):",
            "",
            table(["what", "target", "measured", "", "others' CPU"], self.targets12()),
            "",
            "\"others' CPU\": CPU % (100 % = one core) used meanwhile by processes outside "
            "this suite (the machine may be shared): busy time from /proc/stat minus this "
            f"process tree's. Each bench waited for it to fall below {QUIET_PCT:g} % (at most "
            f"{self.quiet_wait:g} s) before starting, and ran again (up to {self.retries} more "
            f"times) while they took more than {DISTURBED_PCT:g} %; the least disturbed run is "
            "shown. A large figure means the run was disturbed all the same.",
            "",
            "## Machine",
            "",
            table(["", ""], [[k, v] for k, v in self.info["machine"].items()]),
            "",
            "## Versions",
            "",
            table(["", ""], [[k, v] for k, v in self.info["versions"].items()]),
            "",
            "## Lag: append -> durable on each replica",
            "",
            "Ishiki-shaped lines (`ishiki_lines` from tests/support/ishiki.py), 1 to 3 lines per "
            "write, each write one `open(O_APPEND)` + `write(2)` + `close` (the reference "
            "writer's `appendFile`), paced by sleeping.",
            "",
            f"- syncd: {p.lag_seconds:g} s per configuration; writer daemon A, replicas B "
            "(and C), default tuning, a fresh Mosquitto per configuration. Lag = the replica's "
            "trace line, written once the bytes are `fdatasync`'ed, minus CLOCK_MONOTONIC just "
            "before the writer's `write(2)`. The \"writer A\" row is A's own trace: the "
            "append read, published and `fdatasync`'ed on the writer's host.",
            f"- lsyncd: the same writer, rsync to a local target directory; tuned "
            f"{p.lsyncd_seconds:g} s per rate; defaults {p.defaults_seconds:g} s at "
            f"{', '.join(map(str, p.defaults_rates))} writes/s, then at most "
            f"{p.defaults_settle:g} s more for the last sync (the 15 s delay makes longer "
            "runs costly; with defaults a sync also starts early once about 1000 events are "
            "queued, consistent with lsyncd's maxDelays, so at 500 writes/s batches leave "
            "every ~2 s and only the tail after the last batch waits the full 15 s; how much "
            "of the run that tail is depends on the run's length). Lag = the first moment "
            "`bench/watch_target.py` (inotify on the target directory, a stat after each "
            "batch of events, CLOCK_MONOTONIC taken after the stat) sees the target's size "
            "reach the write's end offset. That is bytes in the target's page cache: rsync "
            "does not fsync, so lsyncd is held to a weaker \"durable\" than syncd. The "
            "watcher adds about 0.1 ms (p50, measured against direct appends).",
            "- CPU: 100 % = one core, over writing + draining; for lsyncd including its "
            "rsync children.",
            "",
            table(["copy", "asked /s", "achieved /s", "writes", "p50", "p90", "p99", "max",
                   "CPU", "others' CPU"], self.lag_rows()),
            "",
            "### syncd vs tuned lsyncd (slower syncd replica; ratio < 1: syncd is faster)",
            "",
            table(["writes/s", "replicas", "syncd p50", "lsyncd p50", "ratio p50", "syncd p99",
                   "lsyncd p99", "ratio p99"], self.ratio_rows()),
            "",
            "## Catch-up",
            "",
        ]
        cu = self.get("catch-up")
        if cu:
            out += [f"A holds one {cu['bytes'] / 1e6:.0f} MB file of Ishiki-shaped lines and "
                    f"has indexed it; B starts with nothing. From spawning B until B's trace "
                    f"shows the last byte durable: **{cu['seconds']:.2f} s = {cu['mb_s']:.0f} "
                    f"MB/s** (streaming, first to last byte: {cu['streaming_mb_s']:.0f} MB/s). "
                    f"Copies compared byte for byte afterwards: "
                    f"{'identical' if cu['identical'] else 'DIFFERENT'}. CPU: "
                    + _pair(cu["cpu"], "{:.0f} %") + ". Before B started, A's incremental log "
                    "check of its file "
                    + (f"took {cu['a_log_check_s']:.1f} s after indexing."
                       if cu.get("a_log_check_s") is not None else
                       "had not finished after 120 s; B started anyway, competing with it.")]
        else:
            out.append(f"failed: {self.errors.get('catch-up')}")
        out += ["", "## Scale", "",
                "Two daemons (A, B) with default tuning, identical copies on both; see "
                "bench/bench_scale.py for the steps. READY = the daemon's \"ready\" log line "
                "(replicas loaded, broker connected), timed from spawning the process (Python "
                "start-up included), warm page cache.", "",
                table(["", ""], self.scale_rows()), "", "## Verify", ""]
        v = self.get("verify")
        out.append(f"`{v['command']}`: {v['line']}" if v else
                   f"failed: {self.errors.get('verify')}")
        out += ["", "## The floor of the stack", "",
                "`bench/bench_floor.py`: the same two measurements for a pipeline with none of "
                "syncd's logic, only the work every copy must do. At 500 writes/s, with syncd's "
                "default batching (no window: woken by inotify, what is appended meanwhile goes "
                "in the next look), the writer reads what was appended, fdatasyncs it, seals "
                "it (AES-GCM under a key wrapped for each of two standbys, as wire version 6 "
                "does: syncd/core/sealed.py) and publishes it through paho; each standby opens "
                "it, appends and fdatasyncs (the standby column: the costlier of the two). "
                "The catch-up sends 256 KiB pieces of a "
                f"{p.floor_catchup_mb} MB file. Each runs twice: the standby reading through "
                "paho, then reading the socket itself.", "",
                table(["standby reads with", "CPU per write, writer", "CPU per write, standby",
                       "catch-up"], self.floor_rows()), "",
                "## Frames", "",
                "`python -m bench.bench_frames`: one frame with 1, 10 and 100 live items of "
                "one Ishiki line each, in wire version 5 (the sender encodes and signs it with "
                "Ed25519, the recipient verifies and decodes it) and in version 6 (sealed for "
                "two recipients, opened by one). The crypto alone of a 700-byte frame (sealing "
                "for two recipients, opening as one: `sealed.seal_bytes` / `open_bytes`, "
                "without the items' codec) is the row of the targets above.", "",
                table(["wire version", "items per frame", "frame bytes", "sender",
                       "recipient", "per item"], self.frame_rows())]
        out += ["", "## Commands", "",
                f"- the suite: `{' '.join(self.argv)}` (`--quick` for a short smoke run; "
                "`--profile DIR` to attach py-spy). Each part runs alone too: "
                "`python -m bench.bench_replication`, `python -m bench.bench_lsyncd`, "
                "`python -m bench.bench_scale`, `python bench/bench_verify.py`, "
                "`python -m bench.bench_busy`, `python -m bench.bench_floor`, "
                "`python -m bench.bench_frames`.",
                "- Mosquitto, one per scenario: `mosquitto -c mosquitto.conf` with",
                "", "```", broker_conf.strip(), "```", "",
                "- each syncd daemon: `python -m syncd run --config syncd.toml --log-level "
                "warning` (`info` in the scale bench, to see \"ready\"), environment "
                "`SYNCD_TRACE_FILE=<trace>` on replicas, with", "",
                "```toml", daemon_conf.strip(), "```", ""]
        for mode, r in lsyncd_confs.items():
            if r:
                out += [f"- lsyncd {mode}: `lsyncd -nodaemon lsyncd.conf.lua` with", "",
                        "```lua", r["config"].strip(), "```", ""]
        out += ["- target watcher: `python -m bench.watch_target <target dir> events.jsonl "
                "bench <trace file>`", ""]
        if self.errors:
            out += ["## Failures", ""]
            out += [f"- {name}: {err}" for name, err in self.errors.items()]
            out.append("")
        return "\n".join(out)


def _pair(d: dict[str, float], fmt: str) -> str:
    return ", ".join(f"{k.upper() if len(k) == 1 else k} {fmt.format(v)}" for k, v in d.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short smoke run (~2 min)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="attach py-spy to the daemons; raw profiles go to DIR")
    parser.add_argument("--results", "--out", dest="out", type=Path,
                        default=REPO / "bench" / "RESULTS.md", metavar="FILE",
                        help="where to write the report (bench/RESULTS.md)")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT, metavar="S",
                        help=f"wait up to S s before each bench for other processes to take "
                             f"less than {QUIET_PCT:g} %% CPU (default {QUIET_WAIT:g})")
    parser.add_argument("--retries", type=int, default=2, metavar="N",
                        help=f"run a bench up to N more times while other processes take "
                             f"more than {DISTURBED_PCT:g} %% CPU during it (default 2)")
    args = parser.parse_args()
    check_tools(args.profile is not None)
    os.chdir(REPO)  # the daemons run `python -m syncd` from this checkout
    plan = QUICK if args.quick else FULL
    info = {"machine": machine(), "versions": versions()}
    argv = ["python", "-m", "bench.run_all", *(shlex.quote(a) for a in sys.argv[1:])]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="syncd-bench-") as tmp:
        samples = config_samples(Path(tmp))
        suite = Suite(plan, Path(tmp), args.profile, args.retries, args.quiet_wait)
        suite.run()
    end_rev = versions()["syncd git rev"]
    if end_rev != info["versions"]["syncd git rev"]:
        # Someone changed syncd/ while the suite ran: say so next to the figures.
        info["versions"]["syncd git rev"] += f" at the start; {end_rev} at the end"
    report = Report(suite, info, argv, samples, time.monotonic() - t0)
    args.out.write_text(report.render() + "\n")
    print(f"wrote {args.out}")
    for row in report.targets() + report.targets12():
        print(f"  {row[3]:>12}  {row[0]}: {row[2]} (target {row[1]})")
    if suite.errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
