"""Per-peer budgets for serving requests: how much one peer may make this host read and send.

A request costs its server a read, a digest check and up to `fetch_window_bytes` of fills on
the broker; the requester's frame is a few hundred bytes. Without a bound, one peer (a
compromised host, or anyone holding the cluster's key) that sends requests as fast as it can
makes a host serve gigabytes a second. Each peer therefore has two token buckets:

- requests: `requests_per_second`, holding at most `request_burst` (a host that reconnects
  asks once for every file it lags on, all at once);
- bytes: `bytes_per_second`, holding at most `byte_burst`, charged with what a request would
  make us send (its range, cut to our window and to what we hold).

A request is served when both buckets can pay for it, and then paid for; otherwise it is
dropped (not queued: the requester asks again by itself after its request_timeout). A request
larger than the whole byte bucket is served when the bucket is full and leaves it in debt, so
that no window setting can starve a peer. Over any span of T seconds one peer is therefore
served at most byte_burst + bytes_per_second * T bytes (plus one window), and request_burst +
requests_per_second * T requests. A rate of 0 turns that bucket off.

The defaults do not slow a normal catch-up: a host far behind streams one window at a time
from one peer, at the 256 MiB/s allowed, more than syncd reaches on a small machine
(bench/RESULTS.md: 119 MB/s). Tighten them where a host must not serve that much.

Pure bookkeeping: no I/O, the clock is passed in; the node asks before it hands a peer's
request to the file's replica, and logs what `report` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

REPORT_EVERY = 60.0  # seconds: at most one log line per peer over its budget


@dataclass(frozen=True)
class Limits:
    """`[limits]`: what peers may cost this host (docs/peer-limits.md says why each default)."""

    requests_per_second: float = 200.0
    request_burst: int = 1000
    bytes_per_second: int = 256 << 20
    byte_burst: int = 64 << 20
    # Instance keys this host replicates, at most, counting its own: past it a peer's new key
    # is refused (~25 KiB of memory, a directory and a record each; 1000 busy keys is what
    # bench/ measures, a fleet host ten times that).
    max_keys: int = 10_000
    # Free bytes below which no peer's bytes are written here (appends, resource files, new
    # keys), so that the local writer keeps this much: a full disk would pause it.
    min_free_bytes: int = 1 << 30
    # Memory one peer's frames may hold here at once (queued events, manifest entries,
    # whole manifests in parts), estimated: a catch-up of 16 files holds 16 fetch windows.
    max_peer_bytes: int = 64 << 20
    # Entries one manifest of one instance may hold, a peer's as heard here.
    max_resource_files: int = 100_000


@dataclass
class _Bucket:
    rate: float
    capacity: float
    tokens: float
    stamp: float

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def can_pay(self, cost: float) -> bool:
        return self.rate <= 0 or self.tokens >= min(cost, self.capacity)

    def pay(self, cost: float) -> None:
        if self.rate > 0:
            self.tokens -= cost


@dataclass
class _Peer:
    requests: _Bucket
    bytes: _Bucket
    served_requests: int = 0
    served_bytes: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    unreported: int = 0  # dropped since the last report
    reported_at: float | None = None


def serve_cost(have: int, start: int, length: int, held: int, window: int) -> int:
    """Bytes a request makes us send: [max(start, have), + min(length, window)) cut to `held`
    (what the replica serves; see FileMachine._serve_range)."""
    first = max(start, have)
    return max(0, min(held, first + min(length, window)) - first)


ANSWER_OVERHEAD = 200  # bytes of header an answer item costs besides its body


def probe_cost(sums: bool, start: int, count: int, held: int, blocks: int, max_sums: int,
               block: int, digest_size: int) -> int:
    """Bytes a probe makes us send (see FileMachine._answer_probe): chain values of blocks
    [start, start + count) cut to `max_sums` and to the blocks we hold, or bytes from `start`
    cut to one block and to `held`."""
    if sums:
        first = min(start, blocks)
        return ANSWER_OVERHEAD + digest_size * max(0, min(count, max_sums, blocks - first))
    first = min(start, held)
    return ANSWER_OVERHEAD + max(0, min(held, first + min(count, block)) - first)


def chunked_cost(length: int, chunk: int) -> int:
    """`length` bytes sent in items of at most `chunk` bytes, headers included."""
    return length + ANSWER_OVERHEAD * max(1, -(-length // max(1, chunk)))


class Budgets:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._peers: dict[str, _Peer] = {}

    def configure(self, limits: Limits) -> None:
        """New limits (reload): each bucket keeps what it holds, up to its new capacity."""
        self.limits = limits
        for p in self._peers.values():
            for bucket, rate, capacity in (
                    (p.requests, limits.requests_per_second, limits.request_burst),
                    (p.bytes, limits.bytes_per_second, limits.byte_burst)):
                bucket.rate, bucket.capacity = float(rate), float(capacity)
                bucket.tokens = min(bucket.tokens, bucket.capacity)

    def _peer(self, peer: str, now: float) -> _Peer:
        p = self._peers.get(peer)
        if p is None:
            lim = self.limits
            p = self._peers[peer] = _Peer(
                _Bucket(lim.requests_per_second, lim.request_burst, lim.request_burst, now),
                _Bucket(lim.bytes_per_second, lim.byte_burst, lim.byte_burst, now))
        return p

    def admit(self, peer: str, cost: int, now: float) -> bool:
        """Whether to serve `peer` a request that sends `cost` bytes; paid for if so."""
        p = self._peer(peer, now)
        p.requests.refill(now)
        p.bytes.refill(now)
        if p.requests.can_pay(1) and p.bytes.can_pay(cost):
            p.requests.pay(1)
            p.bytes.pay(cost)
            p.served_requests += 1
            p.served_bytes += cost
            return True
        p.dropped += 1
        p.dropped_bytes += cost
        p.unreported += 1
        return False

    def report(self, peer: str, now: float) -> str | None:
        """A log line about `peer`'s dropped requests, at most one per REPORT_EVERY seconds
        (the first drop is reported at once); None when there is nothing to say yet."""
        p = self._peers.get(peer)
        if p is None or not p.unreported:
            return None
        if p.reported_at is not None and now - p.reported_at < REPORT_EVERY:
            return None
        since = ("" if p.reported_at is None
                 else f" in the last {now - p.reported_at:.0f}s")
        lim = self.limits
        line = (f"peer {peer} is over its budget ({lim.requests_per_second:g} requests/s, "
                f"{lim.bytes_per_second} bytes/s; [limits] in the config): dropped "
                f"{p.unreported} of its requests{since}, {p.dropped} in all; it asks again by "
                "itself")
        p.unreported = 0
        p.reported_at = now
        return line

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def status(self) -> dict[str, dict[str, int]]:
        """Per peer: requests served and dropped, and the bytes they asked for."""
        return {name: {"served_requests": p.served_requests, "served_bytes": p.served_bytes,
                       "dropped_requests": p.dropped, "dropped_bytes": p.dropped_bytes}
                for name, p in sorted(self._peers.items())}


class Holdings:
    """Memory held here on each peer's word, in estimated bytes, within `limit` per peer.

    What a peer's frames make this host keep until something else happens (events queued
    for a replica that is busy or loading, manifest entries it announced, the parts of a
    whole manifest still incomplete) is taken from that peer's account first, and given
    back when it is let go. A peer at its limit has its new items refused (the caller counts
    them): its frames cannot grow this host's memory, however many it sends, and the other
    peers' accounts are untouched.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[str, int] = {}
        self.refused: dict[str, int] = {}  # peer -> items refused at the limit

    def take(self, peer: str, size: int) -> bool:
        held = self.held.get(peer, 0)
        if size > 0 and held + size > self.limit:
            self.refused[peer] = self.refused.get(peer, 0) + 1
            return False
        self.held[peer] = held + size
        return True

    def room(self, peer: str, size: int) -> bool:
        """Whether `take(peer, size)` would succeed (nothing taken)."""
        return self.held.get(peer, 0) + size <= self.limit

    def give(self, peer: str, size: int) -> None:
        held = self.held.get(peer, 0) - size
        if held > 0:
            self.held[peer] = held
        else:
            self.held.pop(peer, None)

    def forget(self, peer: str) -> None:
        self.held.pop(peer, None)
        self.refused.pop(peer, None)

    def status(self) -> dict[str, dict[str, int]]:
        peers = sorted(set(self.held) | set(self.refused))
        return {p: {"held_bytes": self.held.get(p, 0), "refused": self.refused.get(p, 0)}
                for p in peers}
