"""Replication while another process hammers the same filesystem (issue #23, case 6).

100 keys x 1 write/s (100 writes/s, bench_busy's writer daemon A and standby B, stock
settings), first on a quiet disk, then while a loop of
`dd if=/dev/zero of=<same filesystem> bs=1M count=2000 conv=fdatasync` runs. Meanwhile a
bare writer appends a small line to a file of its own and fdatasyncs it, SYNC_RATE times a
second: what any program gets from this disk at that moment, the floor for syncd.

Per phase: lag append -> durable on B p50 / p99 / max, and the bare append + fdatasync's
p50 / p99 / max. Targets (#23): under the loop, syncd's p50 within 5x of its quiet p50, and its
p99 within 3x of the bare sync's p99 under the same loop.

    python -m bench.bench_othersync [--keys 100] [--seconds 20] [--grace 60] [--profile DIR]

`--profile DIR`: py-spy on both daemons in each phase, every thread (a thread blocked in a
system call shows as that call: this is where a syncfs or an fdatasync on the loop shows).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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
from bench.harness import Stats, ms, stats

SYNC_RATE = 20  # bare appends + fdatasync per second (few: it must not load the disk itself)
DD = "while :; do dd if=/dev/zero of={target} bs=1M count=2000 conv=fdatasync status=none; done"


@contextlib.contextmanager
def disk_hog(folder: Path) -> Iterator[None]:
    """The dd loop, on the filesystem of `folder`, for as long as the block runs."""
    target = folder / "hog.bin"
    proc = subprocess.Popen(["bash", "-c", DD.format(target=target)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # dirty pages pile up first: measure the steady state, not the ramp
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        with contextlib.suppress(FileNotFoundError):
            target.unlink()


class BareSync:
    """A thread that appends a small line and fdatasyncs it SYNC_RATE times a second."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lags: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BareSync:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while not self._stop.wait(1 / SYNC_RATE):
                t = time.monotonic_ns()
                os.write(fd, b'{"bare": "append"}\n')
                os.fdatasync(fd)
                self.lags.append((time.monotonic_ns() - t) / 1e6)
        finally:
            os.close(fd)

    def stats(self) -> Stats:
        return stats(self.lags)


def phase(root: Path, keys: int, seconds: float, grace: float, hog: bool,
          profile: Path | None) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    bare = BareSync(root / "bare.jsonl")

    @contextlib.contextmanager
    def during(*_: object) -> Iterator[None]:
        with disk_hog(root) if hog else contextlib.nullcontext(), bare:
            yield

    name = "hog" if hog else "quiet"
    r = busy(keys, root / "busy", seconds, grace, profile_dir=profile, during=during,
             gil=False, name=name)
    r["bare"] = bare.stats()
    r["phase"] = name
    return r


def row(r: dict[str, Any]) -> str:
    lag: Stats = r["lag"]
    bare: Stats = r["bare"]
    return (f"| {r['phase']} | {ms(lag.p50)} / {ms(lag.p99)} / {ms(lag.max)} | "
            f"{lag.missing} | {ms(bare.p50)} / {ms(bare.p99)} / {ms(bare.max)} | "
            f"{r['others_cpu']:.0f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="seconds of writing per phase (each key once a second)")
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--profile", type=Path, metavar="DIR")
    parser.add_argument("--only", choices=["quiet", "hog"],
                        help="one phase only (to compare versions in turn on a shared machine)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-othersync-") as tmp:
        if args.only is not None:
            print(row(phase(Path(tmp) / args.only, args.keys, args.seconds, args.grace,
                            args.only == "hog", args.profile)))
            return
        quiet = phase(Path(tmp) / "quiet", args.keys, args.seconds, args.grace, False,
                      args.profile)
        hogged = phase(Path(tmp) / "hog", args.keys, args.seconds, args.grace, True,
                       args.profile)
    print(f"Other writers: {args.keys} keys x 1 write/s for {args.seconds:g} s per phase, "
          f"bare append + fdatasync {SYNC_RATE}/s ({time.strftime('%Y-%m-%d %H:%M UTC')})\n")
    print("| phase | syncd lag p50 / p99 / max | missing | bare sync p50 / p99 / max |"
          " others' CPU |")
    print("|---|---|---|---|---|")
    print(row(quiet))
    print(row(hogged))
    q, h, bare = quiet["lag"], hogged["lag"], hogged["bare"]
    p50_ok = h.p50 <= 5 * q.p50
    p99_ok = h.p99 <= 3 * bare.p99
    print(f"\np50 under the loop {ms(h.p50)} vs 5 x quiet p50 {ms(5 * q.p50)}: "
          f"{'met' if p50_ok else '**MISSED**'}")
    print(f"p99 under the loop {ms(h.p99)} vs 3 x bare sync p99 {ms(3 * bare.p99)}: "
          f"{'met' if p99_ok else '**MISSED**'}")


if __name__ == "__main__":
    main()
