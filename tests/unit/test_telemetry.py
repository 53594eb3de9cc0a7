"""Telemetry bookkeeping: latency, lag in seconds, refusals by reason (no daemon needed)."""

from __future__ import annotations

import pytest

from syncd.core.telemetry import BUCKETS, Telemetry, reject_reason


def test_latency_is_observed_when_the_bytes_become_durable() -> None:
    t = Telemetry(started=0.0)
    t.expect("k", "f", "host-a", end=100, ts_ms=1_000_000, have=0)
    t.expect("k", "f", "host-a", end=200, ts_ms=1_000_010, have=0)
    t.expect("k", "f", "host-a", end=50, ts_ms=1_000_020, have=60)  # already held: ignored
    t.durable("k", "f", 100, now_wall=1000.003, now=5.0)
    hist = t.latency["host-a"]
    assert sum(hist.counts) == 1 and hist.total == pytest.approx(0.003)
    # A fill closes the gap later: the bytes count from their live stamp, not the fill's.
    t.durable("k", "f", 250, now_wall=1000.510, now=5.5)
    assert sum(hist.counts) == 2 and hist.total == pytest.approx(0.503)
    buckets = dict(hist.cumulative())
    assert buckets["0.005"] == 1 and buckets["0.25"] == 1 and buckets["0.5"] == 2
    assert buckets["+Inf"] == 2 and len(buckets) == len(BUCKETS) + 1


def test_a_clock_behind_ours_counts_as_zero_not_negative() -> None:
    t = Telemetry(started=0.0)
    t.expect("k", "f", "p", end=10, ts_ms=2_000_000, have=0)
    t.durable("k", "f", 10, now_wall=1999.0, now=1.0)
    assert t.latency["p"].total == 0 and t.latency["p"].counts[0] == 1


def test_lag_in_seconds_counts_from_the_first_byte_the_peer_lacks() -> None:
    t = Telemetry(started=10.0)
    t.baseline("k", "f", 1000)  # held at start
    t.durable("k", "f", 1500, now_wall=0, now=20.0)
    t.durable("k", "f", 1800, now_wall=0, now=25.0)
    assert t.lag_seconds("k", "f", 1800, 1800, now=30.0) == 0
    assert t.lag_seconds("k", "f", 1500, 1800, now=30.0) == 5.0
    assert t.lag_seconds("k", "f", 1200, 1800, now=30.0) == 10.0
    assert t.lag_seconds("k", "f", 0, 1800, now=30.0) == 20.0  # since the start
    t.prune("k", "f", 1500)
    assert t.lag_seconds("k", "f", 1500, 1800, now=30.0) == 5.0


def test_growth_merges_without_understating_lag() -> None:
    t = Telemetry(started=0.0)
    for i in range(1, 10_000):
        t.durable("k", "f", i * 10, now_wall=0, now=float(i))
    assert len(t._growth["k", "f"]) <= 4096
    for peer_size in (5, 1234, 50_000, 99_980):
        exact = (peer_size // 10 + 1)  # the time the first missing byte became durable
        assert t.lag_seconds("k", "f", peer_size, 99_990, now=10_000.0) >= 10_000.0 - exact


@pytest.mark.parametrize(("message", "reason"), [
    ("bad signature (not signed by the key [peers] lists for the sender, or an altered frame)",
     "auth"),
    ("from 'x', a node not listed in [peers]", "unlisted"),
    ("bad preamble (not a syncd frame)", "malformed"),
    ("data frame of 99 bytes exceeds 10", "too_large"),
    ("pos topic needs 3 levels, got 2", "topic"),
    ("sequence number already seen (replayed or reordered)", "replay"),
    ("from an earlier run of a (epoch 5 < 6; replayed?)", "replay"),
])
def test_reject_reasons(message: str, reason: str) -> None:
    assert reject_reason(message) == reason


def test_forget_drops_a_peers_series() -> None:
    t = Telemetry(started=0.0)
    t.expect("k", "f", "gone", end=10, ts_ms=0, have=0)
    t.expect("k", "f", "stays", end=20, ts_ms=0, have=0)
    t.durable("k", "f", 10, now_wall=1.0, now=1.0)
    t.forget("gone")
    t.durable("k", "f", 20, now_wall=1.0, now=1.0)
    assert set(t.latency) == {"stays"}
