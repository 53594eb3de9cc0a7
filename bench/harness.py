"""Shared parts of the benches: a paced writer, trace files, lag percentiles, /proc readings.

Lag is always (moment the bytes are present on a copy) - (moment just before the writer's
write(2)), both read from CLOCK_MONOTONIC, which all processes on a host share. A copy reports
its moments as trace lines "key file size monotonic_ns": syncd writes them itself when bytes
become durable (SYNCD_TRACE_FILE); for lsyncd, bench/watch_target.py writes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.ishiki import ishiki_lines

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Write:
    key: str
    end: int  # file size just after this write
    t_ns: int  # CLOCK_MONOTONIC just before write(2)


@dataclass(frozen=True)
class Stats:
    """Lag percentiles in milliseconds over `n` writes; `missing` never arrived."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float
    missing: int = 0

    def row(self) -> list[str]:
        return [ms(self.p50), ms(self.p90), ms(self.p99), ms(self.max)]


def ms(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.2f} ms"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: every figure is a lag that happened)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def stats(lags: Sequence[float], missing: int = 0) -> Stats:
    if not lags:
        nan = float("nan")
        return Stats(0, nan, nan, nan, nan, missing)
    return Stats(len(lags), statistics.median(lags), percentile(lags, 90),
                 percentile(lags, 99), max(lags), missing)


def batches(n: int) -> list[bytes]:
    """`n` writes of Ishiki-shaped lines, 1 to 3 lines each (one appendFile per batch)."""
    return [ishiki_lines(1 + i % 3) for i in range(n)]


def paced_appends(plan: Sequence[tuple[str, Path, bytes]], rate: float
                  ) -> tuple[list[Write], float]:
    """Append plan[i] at start + i / rate; return the writes and the rate achieved."""
    sizes: dict[Path, int] = {}
    for _, path, _ in plan:
        if path not in sizes:
            sizes[path] = path.stat().st_size if path.exists() else 0
    writes: list[Write] = []
    interval = 1.0 / rate
    start = time.perf_counter()
    for i, (key, path, data) in enumerate(plan):
        # Sleep, never spin: the writer must not steal a core from what it measures.
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        t = time.monotonic_ns()
        os.write(fd, data)
        os.close(fd)
        sizes[path] += len(data)
        writes.append(Write(key, sizes[path], t))
    achieved = len(plan) / (time.perf_counter() - start)
    return writes, achieved


def read_trace(path: Path, key: str | None = None) -> dict[str, list[tuple[int, int]]]:
    """Trace lines per key: [(size, monotonic_ns)], in the order they were written."""
    out: dict[str, list[tuple[int, int]]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and (key is None or parts[0] == key):
            out.setdefault(parts[0], []).append((int(parts[2]), int(parts[3])))
    return out


def reached(path: Path, key: str, size: int) -> bool:
    trace = read_trace(path, key).get(key)
    return bool(trace) and trace[-1][0] >= size


def lags_ms(writes: Sequence[Write], trace: dict[str, list[tuple[int, int]]]
            ) -> tuple[list[float | None], int]:
    """Per write, ms until its end offset was present on the traced copy (None: never)."""
    pos: dict[str, int] = {}
    out: list[float | None] = []
    missing = 0
    for w in writes:
        entries = trace.get(w.key, [])
        j = pos.get(w.key, 0)
        while j < len(entries) and entries[j][0] < w.end:
            j += 1
        pos[w.key] = j
        if j < len(entries):
            out.append((entries[j][1] - w.t_ns) / 1e6)
        else:
            out.append(None)
            missing += 1
    return out, missing


def lag_stats(writes: Sequence[Write], trace: dict[str, list[tuple[int, int]]]) -> Stats:
    lags, missing = lags_ms(writes, trace)
    return stats([v for v in lags if v is not None], missing)


def worst_of(per_copy: Sequence[list[float | None]]) -> Stats:
    """Lag until a write is present on every copy (per write, the slowest copy)."""
    lags, missing = [], 0
    for row in zip(*per_copy, strict=True):
        if any(v is None for v in row):
            missing += 1
        else:
            lags.append(max(v for v in row if v is not None))
    return stats(lags, missing)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU time of a process (plus its reaped children's, e.g. rsync's)."""
    return sum(cpu_split(pid, children))


def cpu_split(pid: int, children: bool = False) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (plus its reaped children's)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state)
    user, system = int(fields[11]), int(fields[12])
    if children:
        user, system = user + int(fields[13]), system + int(fields[14])
    return user / CLK_TCK, system / CLK_TCK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class CpuMeter:
    """CPU % of some processes between `start()` and `stop()` (100 % = one core)."""

    def __init__(self, pids: dict[str, int], children: bool = False) -> None:
        self.pids = pids
        self.children = children
        self.percent: dict[str, float] = {}
        self.seconds: dict[str, float] = {}  # CPU seconds used between start() and stop()
        self.system: dict[str, float] = {}  # of which in the kernel (system time)
        self._t0 = 0.0
        self._c0: dict[str, tuple[float, float]] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._c0 = {n: cpu_split(p, self.children) for n, p in self.pids.items()}

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        now = {n: cpu_split(p, self.children) for n, p in self.pids.items()}
        self.seconds = {n: sum(now[n]) - sum(self._c0[n]) for n in self.pids}
        self.system = {n: now[n][1] - self._c0[n][1] for n in self.pids}
        self.percent = {n: 100 * used / wall for n, used in self.seconds.items()}
        return self.percent


def _process_times() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds of it and its reaped children), user processes only."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        pid, ppid = int(entry), int(fields[1])
        if pid == 2 or ppid == 2:
            continue  # kernel threads: the I/O and networking we cause land there too
        # Children's time, except init's: it reaps orphans, whose whole life would count.
        last = 13 if pid == 1 else 15
        out[pid] = (ppid, sum(int(v) for v in fields[11:last]) / CLK_TCK)
    return out


def _descendants(procs: dict[int, tuple[int, float]], root: int) -> set[int]:
    ours = {root}
    grew = True
    while grew:
        before = len(ours)
        ours |= {pid for pid, (ppid, _) in procs.items() if ppid in ours}
        grew = len(ours) > before
    return ours


class BackgroundMeter:
    """CPU % used by user processes outside this process tree (the host may be shared).

    Approximate: a process that exits inside the window is counted through its parent's
    children time, including what it used before the window. 100 % = one core.
    """

    def __init__(self) -> None:
        self._t0 = 0.0
        self._before: dict[int, tuple[int, float]] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._before = _process_times()

    def stop(self) -> float:
        wall = time.monotonic() - self._t0
        after = _process_times()
        me = os.getpid()
        ours = _descendants(self._before, me) | _descendants(after, me)
        used = sum(t - self._before.get(pid, (0, 0.0))[1]
                   for pid, (_, t) in after.items() if pid not in ours)
        return min(100.0 * (os.cpu_count() or 1), max(0.0, 100 * used / wall))


def wait_quiet(threshold: float = 10.0, max_wait: float = 300.0) -> float:
    """Wait until processes other than ours use < `threshold` % CPU over a second.

    Returns the last reading; gives up (and returns it) after `max_wait` seconds.
    """
    deadline = time.monotonic() + max_wait
    meter = BackgroundMeter()
    while True:
        meter.start()
        time.sleep(1)
        load = meter.stop()
        if load < threshold or time.monotonic() > deadline:
            return load


def py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a virtualenv not activated)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


class PySpy:
    """`py-spy record` attached to a running process, raw (folded) output."""

    def __init__(self, pid: int, seconds: float, out: Path, gil: bool = False,
                 rate: int = 100) -> None:
        """`gil`: only samples of the thread holding the GIL (where Python spends CPU; time
        blocked in a system call or waiting is left out)."""
        self.out = out
        exe = py_spy()
        self.proc: subprocess.Popen[bytes] | None = None
        if exe is None:
            print("  (py-spy not found: no profile)", file=sys.stderr)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-f", "raw",
             "-o", str(out), "--nonblocking", "-r", str(rate), *(["--gil"] if gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stacks(raw: Path) -> list[tuple[list[str], int]]:
    out = []
    try:
        lines = raw.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            out.append((stack.split(";"), int(count)))
    return out


def top_self_frames(raw: Path, n: int = 10) -> list[tuple[str, float]]:
    """The leaf frames of a py-spy raw profile with their share of non-idle samples."""
    counts: dict[str, int] = {}
    stacks = _stacks(raw)
    total = sum(c for _, c in stacks) or 1
    for frames, c in stacks:
        counts[frames[-1]] = counts.get(frames[-1], 0) + c
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return [(frame, 100 * c / total) for frame, c in ranked]


def top_inclusive_frames(raw: Path, contains: str = "syncd/", n: int = 10
                         ) -> list[tuple[str, float]]:
    """Frames whose text contains `contains`, by share of samples they are on the stack of.

    Leaf frames of a daemon are mostly library code; this says which syncd code calls it.
    """
    counts: dict[str, int] = {}
    stacks = _stacks(raw)
    total = sum(c for _, c in stacks) or 1
    for frames, c in stacks:
        for frame in set(frames):
            if contains in frame:
                counts[frame] = counts.get(frame, 0) + c
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return [(frame, 100 * c / total) for frame, c in ranked]


# --- counters the daemons and the broker expose ---------------------------------------------

def metrics_extra(port: int) -> str:
    """Config lines that make a daemon serve /metrics on 127.0.0.1:`port` (Daemon `extra`)."""
    return f'[metrics]\nlisten = "127.0.0.1:{port}"\n'


def scrape_items(port: int, timeout: float = 5.0) -> dict[tuple[str, str], float]:
    """(direction, kind) -> items counted by the daemon's `syncd_frames` counter (one per
    batched item: a live write, a position...), from its /metrics; {} when it does not answer."""
    import re
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[tuple[str, str], float] = {}
    pattern = re.compile(r'^syncd_frames_total\{(?P<labels>[^}]*)\} (?P<v>\S+)$')
    for line in text.splitlines():
        m = pattern.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        out[labels.get("direction", ""), labels.get("kind", "")] = float(m["v"])
    return out


def item_deltas(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
                ) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


BROKER_SYS = "sys_interval 1\n"  # $SYS counters published every second (Broker `extra`)
_SYS_TOPICS = {"$SYS/broker/publish/messages/received": "received",
               "$SYS/broker/publish/messages/sent": "sent"}


def broker_publishes(port: int, timeout: float = 5.0) -> dict[str, int]:
    """PUBLISH messages Mosquitto received from and sent to clients so far ($SYS, retained,
    refreshed every sys_interval); {} when they cannot be read within `timeout`."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    got: dict[str, int] = {}
    client = mqtt.Client(CallbackAPIVersion.VERSION2)

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        name = _SYS_TOPICS.get(msg.topic)
        if name is not None:
            with contextlib.suppress(ValueError):
                got[name] = int(msg.payload)

    client.on_message = on_message
    client.on_connect = lambda c, *_: c.subscribe([(t, 0) for t in _SYS_TOPICS])
    try:
        client.connect("127.0.0.1", port, 10)
    except OSError:
        return {}
    client.loop_start()
    deadline = time.monotonic() + timeout
    while len(got) < len(_SYS_TOPICS) and time.monotonic() < deadline:
        time.sleep(0.02)
    client.loop_stop()
    client.disconnect()
    return got if len(got) == len(_SYS_TOPICS) else {}


def wait_bounded(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll until `predicate()` is true; False (no exception) once `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
