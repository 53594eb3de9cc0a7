"""What an SRE watches, counted as it happens: traffic by kind, refusals by reason, and how
long bytes take to become durable here. Pure bookkeeping (no I/O, the clock is passed in);
the node feeds it, `ops/metrics.py` turns its snapshot into Prometheus families.

Append → durable latency, per peer: a live frame carries its sender's stamp `ts` (wall clock,
ms), taken when the sender shipped bytes it had just seen appended. When those bytes become
durable here (fdatasync done, whichever frame brought them: the live one, or a fill after a
gap), we observe `now - ts`. The two clocks are different hosts' clocks: the figure is as good
as their synchronisation (NTP keeps it within a millisecond or so on a LAN; a skewed clock
shifts every observation of that peer, and a negative one is counted as 0). Fills answering a
request are not observed at their own stamp: their `ts` is when they were served, not written.

Lag in seconds, per peer: how long ago this host made durable the first byte that the peer
still lacks. Positions are announced at most twice a second, so under steady writes a peer
shows up to ~0.5 s of lag; bytes held since before this process started count from the start
(a lower bound).
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

# Seconds. From the loopback figures (p50 ~2 ms) to a standby that was away for a minute.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0)
MAX_PENDING = 4096  # live frames awaiting durability, per file (older ones are not observed)
MAX_GROWTH = 4096  # growth points kept per file for lag in seconds (then merged pairwise)

# Why a frame was refused as a whole (reject_reason), then why one item of an authentic frame
# was, at a bound of docs/peer-limits.md (Telemetry.refuse).
FRAME_REASONS = ("auth", "unlisted", "writers", "malformed", "too_large", "topic", "replay")
LIMIT_REASONS = (
    "budget",  # a request over its peer's budget ([limits] requests_per_second ...)
    "duplicate",  # the same request twice in one frame: answered once
    "parts",  # a whole manifest in more parts than max_resource_files allows
    "unasked",  # a whole manifest nobody asked for
    "entries",  # a manifest over [limits] max_resource_files
    "peer_bytes",  # the peer's frames hold [limits] max_peer_bytes here already
    "keys",  # a new key over [limits] max_keys
    "nested",  # a new key inside or above an instance
    "disk_low",  # remote growth stopped: free space below [limits] min_free_bytes
)
REJECT_REASONS = FRAME_REASONS + LIMIT_REASONS


def reject_reason(message: str) -> str:
    """A small, stable label for why a frame was refused (the message itself is logged)."""
    text = message.lower()
    if "bad signature" in text or "bad seal" in text:
        return "auth"
    if "not listed in [peers]" in text:
        return "unlisted"
    if "not among the writers" in text:
        return "writers"
    if "exceeds" in text:
        return "too_large"
    if "topic" in text or "invalid name" in text:
        return "topic"
    if "replayed" in text or "earlier run" in text or "sequence" in text:
        return "replay"
    return "malformed"


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it), ending with +Inf, as Prometheus wants."""
        out, running = [], 0
        for bound, n in zip([*(str(b) for b in BUCKETS), "+Inf"], self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class Telemetry:
    def __init__(self, started: float) -> None:
        self.started = started  # monotonic seconds
        self.frames: Counter[tuple[str, str]] = Counter()  # (direction, kind) -> frames
        self.bytes: Counter[tuple[str, str]] = Counter()  # (direction, kind) -> payload bytes
        self.rejected: Counter[str] = Counter()
        self.latency: dict[str, Histogram] = {}
        self._pending: dict[tuple[str, str], deque[tuple[int, int, str]]] = {}
        self._growth: dict[tuple[str, str], list[tuple[int, float]]] = {}

    # --- traffic ----------------------------------------------------------------------------

    def count(self, direction: str, kind: str, size: int) -> None:
        self.frames[direction, kind] += 1
        self.bytes[direction, kind] += size

    def reject(self, message: str) -> None:
        self.rejected[reject_reason(message)] += 1

    def refuse(self, reason: str, n: int = 1) -> None:
        """An item of an authentic frame refused at a bound (one of LIMIT_REASONS)."""
        assert reason in LIMIT_REASONS, reason
        self.rejected[reason] += n

    def refusals(self) -> dict[str, int]:
        """Items refused at a bound so far, by reason (status `peer_limits`)."""
        return {r: self.rejected[r] for r in LIMIT_REASONS if self.rejected[r]}

    # --- append → durable -------------------------------------------------------------------

    def expect(self, key: str, file: str, peer: str, end: int, ts_ms: int, have: int) -> None:
        """A live frame from `peer` brings bytes up to `end` (we hold `have`), appended at
        `ts_ms` on the peer's clock: observe when they become durable here."""
        if end <= have:
            return  # bytes we already hold: nothing will become durable for them
        queue = self._pending.get((key, file))
        if queue is None:
            queue = self._pending[key, file] = deque(maxlen=MAX_PENDING)
        queue.append((end, ts_ms, peer))

    def durable(self, key: str, file: str, size: int, now_wall: float, now: float) -> None:
        """This host's copy is durable up to `size` (own or received bytes)."""
        queue = self._pending.get((key, file))
        while queue and queue[0][0] <= size:
            _, ts_ms, peer = queue.popleft()
            hist = self.latency.get(peer)
            if hist is None:
                hist = self.latency[peer] = Histogram()
            hist.observe(max(0.0, now_wall - ts_ms / 1000))
        growth = self._growth.setdefault((key, file), [])
        if growth and growth[-1][0] >= size:
            return
        growth.append((size, now))
        if len(growth) > MAX_GROWTH:
            # Merge pairs, keeping the earlier time with the larger size: lag can only be
            # overstated by the merge, never understated.
            growth[:] = [(growth[min(i + 1, len(growth) - 1)][0], growth[i][1])
                         for i in range(0, len(growth), 2)]

    def baseline(self, key: str, file: str, size: int) -> None:
        """The copy held `size` bytes when it was loaded: held since the start, for lag."""
        growth = self._growth.setdefault((key, file), [])
        if size > 0 and (not growth or growth[0][0] > size):
            growth.insert(0, (size, self.started))

    def lag_seconds(self, key: str, file: str, peer_size: int, our_size: int,
                    now: float) -> float:
        """How long ago we held the first byte a peer holding `peer_size` bytes lacks."""
        if peer_size >= our_size:
            return 0.0
        growth = self._growth.get((key, file), [])
        # Each point (size, t): bytes up to `size` were durable here at `t`.
        at = bisect.bisect_right(growth, peer_size, key=lambda g: g[0])
        since = growth[at][1] if at < len(growth) else self.started
        return max(0.0, now - since)

    def prune(self, key: str, file: str, min_peer_size: int) -> None:
        """Forget growth every peer has caught up with (no lag query can need it)."""
        growth = self._growth.get((key, file))
        if growth:
            at = bisect.bisect_right(growth, min_peer_size, key=lambda g: g[0])
            if at:
                del growth[:at]

    def forget(self, peer: str) -> None:
        """A retired node: drop its series."""
        self.latency.pop(peer, None)
        for queue in self._pending.values():
            kept = [p for p in queue if p[2] != peer]
            if len(kept) != len(queue):
                queue.clear()
                queue.extend(kept)

    def snapshot(self) -> dict[str, Any]:
        return {
            "frames": [[d, k, n] for (d, k), n in sorted(self.frames.items())],
            "bytes": [[d, k, n] for (d, k), n in sorted(self.bytes.items())],
            "rejected": dict(sorted(self.rejected.items())),
            "latency": {p: {"buckets": h.cumulative(), "sum": h.total,
                            "count": sum(h.counts)} for p, h in sorted(self.latency.items())},
        }
