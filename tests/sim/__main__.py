"""Run the simulator: `python -m tests.sim --seeds 100000` (long mode, prints a summary),
`python -m tests.sim --seed S -v` (replay one seed and print its history); `--records
zstd-frames` for a log of Zstandard frames."""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import time

from tests.sim import resworld
from tests.sim.world import Violation, run_seed

RESOURCES = False  # --resources: run resworld.py's seeds instead of the log's
RECORDS = "lines"  # --records zstd-frames: the log's records are Zstandard frames


def _run(seed: int) -> resworld.ResWorld | object:
    return resworld.run_seed(seed) if RESOURCES else run_seed(seed, RECORDS)


def _one(seed: int) -> tuple[int, str | None, collections.Counter[str]]:
    try:
        world = _run(seed)
    except Violation as v:
        return seed, str(v), collections.Counter()
    kinds = collections.Counter(line.split()[1] for line in world.history)  # type: ignore
    return seed, None, kinds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=2000, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--jobs", type=int, default=multiprocessing.cpu_count())
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--resources", action="store_true",
                        help="simulate resources/ (tests/sim/resworld.py) instead of the log")
    parser.add_argument("--records", choices=("lines", "zstd-frames"), default="lines",
                        help="what one record of the simulated log is")
    args = parser.parse_args()
    global RESOURCES, RECORDS
    RESOURCES, RECORDS = args.resources, args.records
    if args.seed is not None:
        try:
            world = _run(args.seed)
        except Violation as v:
            print(v)
            return 1
        if args.verbose:
            print("\n".join(world.history))  # type: ignore[attr-defined]
        print(f"seed {args.seed}: ok ({len(world.history)} steps)")  # type: ignore
        return 0
    t0 = time.monotonic()
    failures: list[str] = []
    kinds: collections.Counter[str] = collections.Counter()
    seeds = range(args.first, args.first + args.seeds)
    with multiprocessing.Pool(args.jobs) as pool:
        for i, (_seed, failure, counted) in enumerate(pool.imap_unordered(_one, seeds, 64)):
            kinds.update(counted)
            if failure:
                failures.append(failure)
                print(failure, file=sys.stderr)
            if (i + 1) % 10000 == 0:
                print(f"  {i + 1} seeds, {len(failures)} violations, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    took = time.monotonic() - t0
    print(f"simulator: {args.seeds} seeds from {args.first} in {took:.0f} s, "
          f"{len(failures)} invariant violations")
    for kind, n in sorted(kinds.items()):
        print(f"  {kind:16} {n:9}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
