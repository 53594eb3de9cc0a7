"""What reaching files through descriptors costs (issue #23): the log's per-look read and the
resources scan's walk, by name (as before) and one level at a time from the root (tree.py).

    python3 bench/bench_opens.py [--calls 20000] [--files 1000]

- a look: logfile.snapshot of the last 4 KiB of a 1 MiB log, for a key 1 and 4 levels below its
  root; "by name" opens the file with only its directory unfollowed (the code before), "spot"
  as the daemon now does (one openat2 where the kernel has it), "one level at a time" as on
  kernels without openat2;
- a scan: listing and stat'ing a resources/ tree of --files files in 50 directories (no
  hashing: unchanged files are not read), with the recursive os.scandir walk of before and
  with tree.Walk.
"""

from __future__ import annotations

import argparse
import os
import stat as stat_mode
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncd.core.spot import Spot
from syncd.disk import logfile, tree


def per_call_us(fn: object, calls: int, rounds: int = 5) -> float:
    """The best of `rounds` batches (the machine may be shared: the least disturbed)."""
    assert callable(fn)
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls // rounds):
            fn()
        best = min(best, (time.perf_counter() - t0) / (calls // rounds) * 1e6)
    return best


def scandir_walk(folder: Path, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """The resources walk before issue #23 (recursive, by name)."""
    with os.scandir(folder) as it:
        entries = list(it)
    for e in entries:
        st = e.stat(follow_symlinks=False)
        if stat_mode.S_ISDIR(st.st_mode):
            yield from scandir_walk(Path(e.path), prefix + e.name + "/")
        elif stat_mode.S_ISREG(st.st_mode):
            yield prefix + e.name, st


def tree_walk(folder: Spot) -> int:
    top = tree.open_dir(folder)
    try:
        return sum(1 for _ in tree.Walk(top, 32))
    finally:
        os.close(top)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-opens-"))
    print(f"bench_opens: {args.calls} looks per case, a scan of {args.files} files, in {root}")
    for parts in (("bot-1",), ("p", "onebot_1", "group_2", "chan")):
        folder = root.joinpath(*parts)
        folder.mkdir(parents=True)
        log = folder / "events.jsonl"
        log.write_bytes(b"x" * ((1 << 20) - 1) + b"\n")
        ranges = (((1 << 20) - 4096, 1 << 20),)
        spot = Spot(root, (*parts, "events.jsonl"))
        by_name = per_call_us(lambda log=log, r=ranges: logfile.snapshot(log, r, None), args.calls)
        by_spot = per_call_us(lambda s=spot, r=ranges: logfile.snapshot(s, r, None), args.calls)
        works, tree._openat2.works = tree._openat2.works, False
        by_level = per_call_us(lambda s=spot, r=ranges: logfile.snapshot(s, r, None), args.calls)
        tree._openat2.works = works
        print(f"  look, key {len(parts)} level(s) deep: by name {by_name:.1f} us, spot "
              f"{by_spot:.1f} us (openat2: {'yes' if works else 'no'}), one level at a time "
              f"{by_level:.1f} us")
    res = root / "bot-1" / "resources"
    for i in range(args.files):
        f = res / "artifacts" / f"tool-{i % 50}" / f"out-{i}"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x")
    spot = Spot(root, ("bot-1", "resources"))
    assert sum(1 for _ in scandir_walk(res)) == tree_walk(spot) == args.files
    before = per_call_us(lambda: sum(1 for _ in scandir_walk(res)), 20) / 1000
    after = per_call_us(lambda: tree_walk(spot), 20) / 1000
    print(f"  scan of {args.files} files: recursive scandir {before:.2f} ms, tree.Walk "
          f"{after:.2f} ms")
    os.system(f"rm -rf {root}")


if __name__ == "__main__":
    main()
