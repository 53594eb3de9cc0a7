"""The same append workload through lsyncd (rsync to a local target directory), for comparison.

lsyncd writes no trace, so bench/watch_target.py watches the target directory with inotify and
dates each growth of the target file (CLOCK_MONOTONIC, after a stat). A write counts as
arrived when the target's size first reaches the write's end offset. That is "present in the
target's page cache": rsync does not fsync, so lsyncd is measured against a weaker
"durable" than syncd, whose trace is taken after fdatasync.

Two configurations:
  tuned     delay = 0, inotifyMode = "Modify", rsync append_verify (its fastest settings)
  defaults  lsyncd's defaults (delay 15 s, inotifyMode "CloseWrite", whole-file rsync)

    python -m bench.bench_lsyncd [--rate 500] [--seconds 10] [--mode tuned|defaults]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CpuMeter, batches, lag_stats, paced_appends, reached, read_trace
from tests.support.cluster import wait_until
from tests.support.ishiki import ishiki_lines

KEY = "bench"
FILE = "events.jsonl"
DEFAULT_DELAY = 15.0  # lsyncd 2.2's default.rsync delay, seconds

_SETTINGS = """settings {{
    logfile = "{log}",
    statusFile = "{status}",
    nodaemon = true,{extra}
}}
"""
_SYNC = """sync {{
    default.rsync,
    source = "{source}",
    target = "{target}",{extra}
}}
"""
MODES = {
    "tuned": ('\n    inotifyMode = "Modify",',
              "\n    delay = 0,\n    rsync = { append_verify = true },"),
    "defaults": ("", ""),
}


def binaries() -> dict[str, str]:
    """lsyncd and rsync paths; exits with an install hint when either is missing."""
    found = {name: shutil.which(name) for name in ("lsyncd", "rsync")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        sys.exit(f"bench: {' and '.join(missing)} not installed; on Debian/Ubuntu run:\n"
                 "  apt-get update && apt-get install -y lsyncd rsync")
    return {name: path for name, path in found.items() if path is not None}


def config_text(mode: str, source: Path, target: Path, log: Path, status: Path) -> str:
    settings_extra, sync_extra = MODES[mode]
    return (_SETTINGS.format(log=log, status=status, extra=settings_extra)
            + _SYNC.format(source=f"{source}/", target=f"{target}/", extra=sync_extra))


def lag(rate: int, seconds: float, root: Path, mode: str,
        settle: float = 30.0) -> dict[str, Any]:
    """Writes at `rate`/s for `seconds` into a watched source; lag until present in target."""
    lsyncd = binaries()["lsyncd"]
    root.mkdir(parents=True, exist_ok=True)
    source, target = root / "src" / KEY, root / "dst" / KEY
    source.mkdir(parents=True)
    target.mkdir(parents=True)
    src = source / FILE
    src.write_bytes(ishiki_lines(1))  # warm-up: lsyncd's start-up rsync copies it
    conf = root / "lsyncd.conf.lua"
    conf.write_text(config_text(mode, source, target, root / "lsyncd.log",
                                root / "lsyncd.status"))
    trace = root / "trace"
    watcher = subprocess.Popen(
        [sys.executable, "-m", "bench.watch_target", str(target), FILE, KEY, str(trace)],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    proc: subprocess.Popen[bytes] | None = None
    try:
        assert watcher.stdout is not None
        if watcher.stdout.readline().strip() != b"ready":
            raise RuntimeError("watch_target did not start")
        out = (root / "lsyncd.out").open("ab")
        proc = subprocess.Popen([lsyncd, "-nodaemon", str(conf)], stdout=out,
                                stderr=subprocess.STDOUT)
        wait_until(lambda: reached(trace, KEY, src.stat().st_size), 30,
                   "lsyncd's start-up sync")
        n = max(1, int(rate * seconds))
        plan = [(KEY, src, b) for b in batches(n)]
        # lsyncd waits for its rsync children, so their CPU time lands in its cutime/cstime.
        meter = CpuMeter({"lsyncd+rsync": proc.pid}, children=True)
        meter.start()
        writes, achieved = paced_appends(plan, rate)
        size = writes[-1].end
        timed_out = False
        try:
            wait_until(lambda: reached(trace, KEY, size), settle, "lsyncd to finish",
                       interval=0.05)
        except AssertionError:
            timed_out = True  # reported as missing writes
        cpu = meter.stop()
        return {"rate": rate, "achieved": achieved, "writes": n, "bytes": size,
                "lag": lag_stats(writes, read_trace(trace, KEY)), "cpu": cpu,
                "timed_out": timed_out, "config": conf.read_text(),
                "command": f"{lsyncd} -nodaemon lsyncd.conf.lua"}
    finally:
        for p in (proc, watcher):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=500, help="writes per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mode", choices=sorted(MODES), default="tuned")
    args = parser.parse_args()
    binaries()
    with tempfile.TemporaryDirectory(prefix="lsyncd-bench-") as tmp:
        settle = 30.0 if args.mode == "tuned" else DEFAULT_DELAY * 2 + 10
        r = lag(args.rate, args.seconds, Path(tmp), args.mode, settle)
    s = r["lag"]
    print(f"lsyncd {args.mode}: {r['writes']} writes at {r['achieved']:.0f}/s, "
          f"p50 {s.p50:.2f} ms  p90 {s.p90:.2f} ms  p99 {s.p99:.2f} ms  max {s.max:.2f} ms"
          f"{f'  ({s.missing} never arrived)' if s.missing else ''}; "
          f"CPU {r['cpu']['lsyncd+rsync']:.0f}%")


if __name__ == "__main__":
    main()
