"""Cost of the wire format per frame and per item: version 5 (encode+sign, verify+decode)
side by side with version 6 (seal for two recipients, open as one of them).

    python -m bench.bench_frames [--rounds N]

Prints microseconds per frame for a ~700-byte frame (one live item, one Ishiki line) and for
batches of 10 and 100 items, so the per-item cost of batching is visible next to the per-frame
cost of the signature or the sealing. Targets (issue #26): version 6 at 700 bytes, the sender
<= 10 us with two recipients, a recipient <= 5 us.
"""

from __future__ import annotations

import argparse
import time

from syncd.core import frames, sealed
from syncd.core.frames import Data, Frame, Item, Kind
from syncd.core.pairkeys import PairKeys
from tests.support.cluster import node_identity
from tests.support.ishiki import ishiki_lines

P = "syncd"


def batch_of(items: int) -> tuple[Item, ...]:
    line = ishiki_lines(1)
    return tuple(Item(Kind.LIVE, Data(i * len(line), bytes(32), line), f"bot-{i}",
                      "events.jsonl") for i in range(items))


def signed(items: int, rounds: int) -> tuple[float, float, int]:
    me = node_identity("a")
    key = me.key.public_key()
    batch = batch_of(items)
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


def three_hosts() -> tuple[dict[str, PairKeys], list[sealed.Recipient]]:
    """Hosts a, b, c (runs 1, 2, 3) that know each other, and a's recipients b and c."""
    hosts = {n: PairKeys(n, e, node_identity(n).key) for n, e in (("a", 1), ("b", 2), ("c", 3))}
    for x in hosts.values():
        for y in hosts.values():
            if x is not y:
                x.learn(y.node, y.epoch, node_identity(y.node).key.public_key(), y.run_public)
    recipients = []
    for n in ("b", "c"):
        pair = hosts["a"].sending(n)
        assert pair is not None
        recipients.append((n, *pair))
    return hosts, recipients


def sealed_for_two(items: int, rounds: int) -> tuple[float, float, int]:
    hosts, recipients = three_hosts()
    batch = batch_of(items)
    topic = frames.all_topic(P, "a")
    route = frames.parse_topic(P, topic)
    sending, opening = sealed.BodyKeys(), sealed.BodyKeys()
    start = time.perf_counter()
    for seq in range(rounds):
        raw = sealed.encode(Frame("a", 1, seq, 0, batch, lane=seq + 1), topic, recipients,
                            sending)
    encode = (time.perf_counter() - start) / rounds
    b = hosts["b"]
    start = time.perf_counter()
    for _ in range(rounds):
        sealed.decode(route, raw, "a", 1 << 20, topic, "b", 2, lambda e: b.receiving("a", e),
                      opening)
    decode = (time.perf_counter() - start) / rounds
    return encode * 1e6, decode * 1e6, len(raw)


def crypto_only(size: int, rounds: int) -> tuple[float, float, int]:
    """The sealing alone (sealed.seal_bytes / open_bytes) of `size` plaintext bytes, two
    recipients: what version 6 adds per frame; the items' codec is the same in both."""
    hosts, recipients = three_hosts()
    topic = frames.all_topic(P, "a")
    plain = bytes(size)
    sending, opening = sealed.BodyKeys(), sealed.BodyKeys()
    start = time.perf_counter()
    for seq in range(rounds):
        raw = sealed.seal_bytes(topic, "a", 1, seq, plain, recipients, sending)
    seal = (time.perf_counter() - start) / rounds
    b = hosts["b"]
    start = time.perf_counter()
    for _ in range(rounds):
        sealed.open_bytes(raw, topic, "a", "b", 2, lambda e: b.receiving("a", e), opening)
    open_ = (time.perf_counter() - start) / rounds
    return seal * 1e6, open_ * 1e6, len(raw)


def sign_only(size: int, rounds: int) -> tuple[float, float, int]:
    """What version 5 pays per frame for the same: a signature over SHA-256, and its check."""
    me = node_identity("a")
    key = me.key.public_key()
    topic = frames.all_topic(P, "a")
    rest = bytes(size)
    start = time.perf_counter()
    for _ in range(rounds):
        raw = frames.PREAMBLE + me.sign(frames.signed_part(topic, rest)) + rest
    sign = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        frames.check_signature(raw, topic, key)
    check = (time.perf_counter() - start) / rounds
    return sign * 1e6, check * 1e6, len(raw)


# What main() and bench/run_all.py measure: each wire version, at these items per frame.
VERSIONS = (("5 signed", signed), ("6 sealed, 2 rcpt", sealed_for_two))
BATCHES = (1, 10, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    print(f"{'version':>20} {'items/frame':>11} {'bytes':>7} {'sender µs':>10} "
          f"{'recipient µs':>13} {'per item µs':>12}")
    for name, measure in VERSIONS:
        for items in BATCHES:
            enc, dec, size = measure(items, max(args.rounds // items, 50))
            print(f"{name:>20} {items:>11} {size:>7} {enc:>10.1f} {dec:>13.1f} "
                  f"{(enc + dec) / items:>12.1f}")
    print(f"\nthe protection alone, per frame of 700 bytes ({args.rounds * 3} rounds)")
    print(f"{'':>20} {'sender µs':>10} {'recipient µs':>13}")
    for name, measure in (("5 sign / verify", sign_only),
                          ("6 seal 2 / open", crypto_only)):
        enc, dec, _ = measure(700, args.rounds * 3)
        print(f"{name:>20} {enc:>10.1f} {dec:>13.1f}")


if __name__ == "__main__":
    main()
