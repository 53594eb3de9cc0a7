"""What a `.zstd` log's records cost: finding frame ends, and the log check of frames.

    python3 bench/bench_zstd_records.py [--mb 64]

Writes a dsh-shaped session (about MB megabytes of JSONL, one checksummed Zstandard frame per
batch of 20 events, as tests/support/dshwriter.py writes it) and the same events as plain
JSONL to a temporary directory, then prints, one core:
- the walk over every frame's headers that finds the last whole frame from byte 0 (what a
  start-up rehash and a record count do; a look walks only the frames past what it shipped),
  against the backwards search for the last newline of the plain file;
- the log check: FrameChecker (decompress each frame, check its lines) against LogChecker
  on the plain file, in MB/s of JSONL checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncd.core.framecheck import FrameChecker
from syncd.core.logcheck import LogChecker
from syncd.disk import logfile
from tests.support.dshwriter import DshWriter


def _write(folder: Path, mb: int) -> tuple[Path, Path, int]:
    zst, plain = DshWriter(folder / "session.jsonl.zstd"), DshWriter(folder / "session.jsonl",
                                                                     "none")
    frames, size = 0, 0
    while size < mb * 1_000_000:
        turn = zst.turn(frames) + zst.turn(frames + 1) + zst.turn(frames + 2)
        zst.write_batch(turn)
        plain.seq = zst.seq
        size += len(plain.write_batch(turn))
        frames += 1
    return zst.path, plain.path, frames


def _best(fn: object, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()  # type: ignore[operator]
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zst, plain, frames = _write(Path(tmp), args.mb)
        zsize, psize = zst.stat().st_size, plain.stat().st_size
        print(f"session: {frames} frames, {zsize / 1e6:.1f} MB compressed, "
              f"{psize / 1e6:.1f} MB of JSONL")
        fd = os.open(zst, os.O_RDONLY)
        try:
            walk = _best(lambda: logfile._last_frame_end(fd, 0, zsize))
        finally:
            os.close(fd)
        print(f"last whole frame from byte 0: {walk * 1e3:.1f} ms CPU "
              f"({walk / frames * 1e6:.2f} us per frame)")
        search = _best(lambda: logfile.last_line_end(plain, 0, psize))
        print(f"last whole line (plain file, backwards): {search * 1e3:.3f} ms CPU")

        def check(checker: LogChecker | FrameChecker, path: Path) -> None:
            for chunk in logfile.chunks(path, 0, path.stat().st_size):
                checker.feed(chunk)
            assert checker.report().problem_counts == {}, checker.report().problem_counts

        framed = _best(lambda: check(FrameChecker(), zst), 1)
        lines = _best(lambda: check(LogChecker(), plain), 1)
        print(f"log check, frames: {psize / framed / 1e6:.0f} MB/s of JSONL "
              f"({zsize / framed / 1e6:.0f} MB/s compressed)")
        print(f"log check, plain lines: {psize / lines / 1e6:.0f} MB/s")


if __name__ == "__main__":
    main()
