"""A bot's huge unfinished line through the daemon's log check (issue #23, case 12).

Writes a few lines and then `--mib` MiB of one message line without its end, follows it with
the daemon's IncrementalVerifier (logfollow.py) on an event loop of its own, saves its state
(the daemon saves every 30 s), then ends the line and follows again. Prints the process's RSS
growth, the longest the event loop was held (a 5 ms ticker's longest gap), the save's time and
size, and the seconds until the ended line was checked.

    python -m bench.bench_longline [--mib 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import rss_mb
from syncd.daemon.logfollow import IncrementalVerifier
from tests.daemon.test_long_lines import write_huge_unfinished_line


async def follow(verifier: IncrementalVerifier, target: int, gaps: list[float]) -> float:
    """Seconds until `target` bytes are checked; the loop's gaps go to `gaps`."""
    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    t = time.monotonic()
    try:
        while verifier.size < target:
            verifier._followed_at = -1e9  # no pause between catch-ups
            verifier.follow(lambda: target)
            await asyncio.sleep(0.05)
        if verifier._task is not None:
            await verifier._task
    finally:
        ticker.cancel()
    return time.monotonic() - t


async def scenario(folder: Path, mib: int) -> None:
    log_file, state = folder / "events.jsonl", folder / "state" / "events.jsonl.verify"
    tail = write_huge_unfinished_line(log_file, mib << 20)
    rss0 = rss_mb(os.getpid())
    verifier = IncrementalVerifier(log_file, state)
    gaps: list[float] = []
    took = await follow(verifier, log_file.stat().st_size, gaps)
    rss1 = rss_mb(os.getpid())
    t = time.monotonic()
    verifier.save(force=True)
    save_s = time.monotonic() - t
    rss2 = rss_mb(os.getpid())
    following = max(gaps)
    with log_file.open("ab") as f:
        f.write(tail)
    gaps.clear()
    ended = await follow(verifier, log_file.stat().st_size, gaps)
    report = verifier.report()
    print(f"unfinished line of {mib} MiB: followed in {took:.1f} s, RSS +{rss1 - rss0:.0f} MB, "
          f"loop held at most {following * 1000:.0f} ms")
    print(f"save: {save_s * 1000:.0f} ms on the loop, RSS +{rss2 - rss0:.0f} MB at its peak "
          f"so far, state {state.stat().st_size / 1024:.0f} KiB")
    print(f"line ended: checked after {ended:.1f} s, loop held at most "
          f"{max(gaps) * 1000:.0f} ms, entries {report.entries if report else '?'}")
    await verifier.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-longline-") as tmp:
        asyncio.run(scenario(Path(tmp), args.mib))


if __name__ == "__main__":
    main()
