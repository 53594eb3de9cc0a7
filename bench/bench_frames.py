"""Cost of the wire format per frame and per item: encode+sign, verify+decode.

    python -m bench.bench_frames [--rounds N]

Prints microseconds per frame for a single live item (one Ishiki line) and for batches of
10 and 100 items, so the per-item cost of batching is visible next to the per-frame cost of
the signature.
"""

from __future__ import annotations

import argparse
import time

from syncd.core import frames
from syncd.core.frames import Data, Frame, Item, Kind
from tests.support.cluster import node_identity
from tests.support.ishiki import ishiki_lines

P = "syncd"


def measure(items: int, rounds: int) -> tuple[float, float, int]:
    me = node_identity("a")
    key = me.key.public_key()
    line = ishiki_lines(1)
    batch = tuple(Item(Kind.LIVE, Data(i * len(line), bytes(32), line), f"bot-{i}",
                       "events.jsonl") for i in range(items))
    topic = frames.all_topic(P, "a")
    route = frames.parse_topic(P, topic)
    start = time.perf_counter()
    for seq in range(rounds):
        raw = frames.encode(Frame("a", 1, seq, 0, batch), me, topic)
    encode = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        frames.decode(route, raw, "a", 1 << 20, key, topic)
    decode = (time.perf_counter() - start) / rounds
    return encode * 1e6, decode * 1e6, len(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    print(f"{'items/frame':>11} {'bytes':>7} {'encode+sign µs':>15} {'verify+decode µs':>17} "
          f"{'per item µs':>12}")
    for items in (1, 10, 100):
        enc, dec, size = measure(items, max(args.rounds // items, 50))
        print(f"{items:>11} {size:>7} {enc:>15.1f} {dec:>17.1f} {(enc + dec) / items:>12.1f}")


if __name__ == "__main__":
    main()
