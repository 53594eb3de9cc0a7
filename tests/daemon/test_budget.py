"""Per-peer budgets for serving requests: the pure decision, and a real daemon under a flood.

The flood is made of authentic requests (signed by a listed host, c, whose key was stolen):
the daemon must serve one peer no more than its budget, count and report what it drops, and go on
replicating with the others.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from syncd.config import ConfigError, load_config, parse_config
from syncd.core import frames
from syncd.core.budget import REPORT_EVERY, Budgets, Limits, serve_cost
from syncd.core.identity import Identity
from syncd.core.ledger import Ledger
from tests.daemon.test_hostile import Attacker
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

MiB = 1 << 20


# --- the decision ------------------------------------------------------------------------------

def test_a_burst_is_served_then_the_rate() -> None:
    b = Budgets(Limits(requests_per_second=10, request_burst=5, bytes_per_second=0,
                       byte_burst=1))
    assert [b.admit("p", 0, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert not b.admit("p", 0, 0.05)  # half a token since
    assert b.admit("p", 0, 0.2)  # 2 tokens since the burst was spent
    assert b.admit("q", 0, 0.2)  # each peer has its own buckets
    s = b.status()
    assert s["p"]["served_requests"] == 6 and s["p"]["dropped_requests"] == 3
    assert s["q"] == {"served_requests": 1, "served_bytes": 0, "dropped_requests": 0,
                      "dropped_bytes": 0}


def test_bytes_served_stay_within_burst_plus_rate_times_time() -> None:
    lim = Limits(requests_per_second=0, request_burst=1, bytes_per_second=MiB,
                 byte_burst=4 * MiB)
    b = Budgets(lim)
    served = 0
    for i in range(10_000):  # 100 requests a second of 2 MiB each, for 100 s
        now = i / 100
        if b.admit("p", 2 * MiB, now):
            served += 2 * MiB
    elapsed = 9999 / 100
    assert served <= lim.byte_burst + lim.bytes_per_second * elapsed
    assert served >= lim.bytes_per_second * elapsed - 2 * MiB  # and the rate is really given
    assert b.status()["p"]["served_bytes"] == served


def test_a_request_larger_than_the_bucket_is_served_when_full_and_leaves_a_debt() -> None:
    b = Budgets(Limits(requests_per_second=0, request_burst=1, bytes_per_second=MiB,
                       byte_burst=MiB))
    assert b.admit("p", 8 * MiB, 0.0)  # a window larger than the bucket: never starved
    assert not b.admit("p", 1, 1.0)  # 7 MiB in debt, 1 MiB refilled
    assert not b.admit("p", 8 * MiB, 7.5)
    assert b.admit("p", 8 * MiB, 9.0)  # full again


def test_the_default_does_not_slow_a_catch_up_at_200_mb_per_second() -> None:
    b = Budgets(Limits())
    window = 4 * MiB
    per_second = 200_000_000 // window + 1
    for i in range(per_second * 30):  # 30 s of one window after the other
        assert b.admit("p", window, i / per_second)
    for _ in range(1000):  # a host that reconnects asks once for each of 1000 files
        assert b.admit("q", 0, 0.0)


def test_a_rate_of_zero_turns_a_bucket_off() -> None:
    b = Budgets(Limits(requests_per_second=0, request_burst=1, bytes_per_second=0,
                       byte_burst=1))
    assert all(b.admit("p", 1 << 30, 0.0) for _ in range(1000))


def test_drops_are_reported_at_once_then_at_most_once_a_minute() -> None:
    b = Budgets(Limits(requests_per_second=1, request_burst=1))
    assert b.report("p", 0.0) is None  # nothing dropped: nothing to say
    b.admit("p", 0, 0.0)
    b.admit("p", 0, 0.0)
    first = b.report("p", 0.0)
    assert first is not None and "peer p is over its budget" in first and "dropped 1 " in first
    for t in range(1, 30):
        b.admit("p", 0, t * 0.001)
        assert b.report("p", t * 0.001) is None
    later = b.report("p", REPORT_EVERY)
    assert later is not None and "dropped 29 of its requests in the last 60s" in later
    assert b.report("p", REPORT_EVERY + 1) is None


def test_reload_keeps_counts_and_caps_tokens() -> None:
    b = Budgets(Limits(requests_per_second=1, request_burst=100))
    assert b.admit("p", 0, 0.0)
    b.configure(Limits(requests_per_second=1, request_burst=2))
    assert [b.admit("p", 0, 0.0) for _ in range(3)] == [True, True, False]
    assert b.status()["p"]["served_requests"] == 3
    b.forget("p")
    assert "p" not in b.status()


def test_serve_cost_is_what_the_replica_would_send() -> None:
    assert serve_cost(have=0, start=0, length=10 * MiB, held=3 * MiB, window=4 * MiB) == 3 * MiB
    assert serve_cost(have=0, start=0, length=10 * MiB, held=9 * MiB, window=4 * MiB) == 4 * MiB
    assert serve_cost(have=5, start=2, length=10, held=100, window=1000) == 10
    assert serve_cost(have=0, start=50, length=10, held=20, window=1000) == 0  # beyond our end


def test_limits_from_the_config(tmp_path: Path) -> None:
    base = {"node": "a", "runtimes_dir": "r", "state_dir": "s"}
    assert parse_config(base, tmp_path / "c.toml").limits == Limits()
    text = "[limits]\nbytes_per_second = 1048576\nrequest_burst = 10\n"
    c = parse_config({**base, "limits": {"bytes_per_second": 1 << 20, "request_burst": 10}},
                     tmp_path / "c.toml", text)
    assert c.limits == Limits(bytes_per_second=1 << 20, request_burst=10)
    with pytest.raises(ConfigError, match=r"c.toml:2: limits.request_burst: must be between"):
        parse_config({**base, "limits": {"request_burst": 0}}, tmp_path / "c.toml",
                     "[limits]\nrequest_burst = 0\n")
    with pytest.raises(ConfigError, match=r"limits\.bytes_per_sec: unknown key"):
        parse_config({**base, "limits": {"bytes_per_sec": 1}}, tmp_path / "c.toml")
    example = load_config(Path(__file__).parents[2] / "config" / "syncd.example.toml")
    assert example.limits == Limits()  # the example shows the defaults


# --- a real daemon, flooded with authentic requests --------------------------------------------

P = "test/syncd"


def signed_frames(identity: Identity, sender: str, key: str, file: str, to: str,
                  requests: list[frames.Request]) -> list[tuple[str, bytes]]:
    """(topic, payload) of `sender`'s `requests` to `to`, one frame each, signed with its key
    as a listed host would send them. The only place in this file that knows the wire
    format."""
    epoch, ts = int(time.time()) + 10**6, time.time_ns() // 1_000_000
    topic = frames.to_topic(P, to, sender)
    return [(topic, frames.encode(frames.Frame(sender, epoch, seq, ts, (
        frames.Item(frames.Kind.REQ, r, key, file),), to), identity, topic))
        for seq, r in enumerate(requests, 1)]


def test_a_flood_of_authentic_requests_is_served_no_more_than_the_budget(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    limits = "[limits]\nbytes_per_second = 1048576\nbyte_burst = 4194304\n"
    a = make_daemon("a", broker, extra=limits)
    b = make_daemon("b", broker)
    data = b""
    while len(data) < 2 * MiB:
        data += ishiki_lines(200)
    append(a.path(KEY), data)
    wait_equal(content(a.path(KEY)), b, timeout=30)
    served_before = a.file_status(KEY)["served_bytes"]
    n = 100  # each asks for the whole file (2 MiB): 200 MiB unbounded
    flood = signed_frames(node_identity("c"), "c", KEY, "events.jsonl", "a",
                          [frames.Request(0, Ledger().digest(), 0, 4 * MiB)] * n)
    attacker = Attacker(broker)
    try:
        start = time.monotonic()
        attacker.publish_all(flood)

        def counted() -> dict[str, int] | None:
            got: dict[str, int] | None = a.status()["peer_budgets"].get("c")
            return got if got and got["served_requests"] + got["dropped_requests"] == n else None

        budget = wait_until(counted, 30, "a to see every request")
        elapsed = time.monotonic() - start
        served = a.file_status(KEY)["served_bytes"] - served_before
        bound = 4 * MiB + 1 * MiB * elapsed  # byte_burst + bytes_per_second * elapsed
        assert len(data) <= served <= bound, (served, bound)  # served, within the budget
        assert budget["served_bytes"] == served  # the cost charged is what was sent
        assert budget["dropped_requests"] > 0
        assert a.read_log().count("peer c is over its budget") == 1  # once a minute
        shown = subprocess.run([sys.executable, "-m", "syncd", "status", "--config",
                                str(a.config)], capture_output=True, text=True, timeout=30)
        assert (f"peer c: {budget['dropped_requests']} requests dropped over its budget"
                in shown.stdout)
        # b, which asked for nothing, replicates as before.
        append(a.path(KEY), ishiki_lines(3))
        wait_equal(content(a.path(KEY)), b, timeout=10)
    finally:
        attacker.close()
