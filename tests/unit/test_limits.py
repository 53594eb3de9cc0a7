"""The pure side of the peer limits (docs/peer-limits.md): keys, holdings, request costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncd.config import ConfigError, parse_config
from syncd.core.budget import (
    ANSWER_OVERHEAD,
    Holdings,
    Limits,
    chunked_cost,
    probe_cost,
)
from syncd.core.keyspace import KeySpace, ancestors
from syncd.core.telemetry import LIMIT_REASONS, REJECT_REASONS, Telemetry
from syncd.ops.metrics import families


def test_ancestors_are_the_keys_a_key_would_be_inside_of() -> None:
    assert ancestors("a") == []
    assert ancestors("a/b/c") == ["a", "a/b"]


def test_no_key_inside_or_above_a_known_one() -> None:
    ks = KeySpace()
    for key in ("bot-1", "onebot_1/group_2", "alice/main"):
        ks.add(key)
    assert ks.refusal("bot-1/workspace", 100) == ("nested", "inside the instance bot-1")
    assert ks.refusal("bot-1/resources/artifacts/shake", 100) == (
        "nested", "inside the instance bot-1")
    reason, why = ks.refusal("onebot_1", 100) or ("", "")
    assert reason == "nested" and why.startswith("above 1 instance")
    assert ks.refusal("onebot_1/group_3", 100) is None  # a sibling is fine
    assert ks.refusal("bot-10", 100) is None  # a prefix of the text is not of the path
    assert ks.refusal("bot-1", 100) is None  # known: nothing to refuse
    ks.discard("onebot_1/group_2")
    assert ks.refusal("onebot_1", 100) is None  # nothing below it any more
    assert len(ks) == 2 and "bot-1" in ks


def test_no_more_keys_than_max_keys_counting_every_key() -> None:
    ks = KeySpace()
    for i in range(3):
        ks.add(f"k{i}")
    assert ks.refusal("new", 4) is None
    ks.add("new")
    refused = ks.refusal("newer", 4)
    assert refused is not None and refused[0] == "keys" and "max_keys (4)" in refused[1]
    assert ks.refusal("k1", 4) is None  # a key already held is no new key


def test_holdings_bound_each_peer_alone_and_give_back() -> None:
    h = Holdings(1000)
    assert h.take("x", 600) and h.take("x", 400)
    assert not h.take("x", 1)  # x is full
    assert h.take("y", 1000)  # y has its own account
    h.give("x", 500)
    assert h.take("x", 500)
    assert h.status()["x"] == {"held_bytes": 1000, "refused": 1}
    h.give("x", 5000)  # never below zero
    assert "x" not in h.held
    h.forget("y")
    assert "y" not in h.status()


def test_a_probe_costs_what_it_makes_us_send_capped_per_item() -> None:
    block, digest = 65536, 32
    # 100 bytes probes of a 7 MB log cost one block each, whatever they ask for.
    assert probe_cost(False, 0, 1 << 40, 7 << 20, 107, 8192, block, digest) == \
        ANSWER_OVERHEAD + block
    assert probe_cost(False, (7 << 20) - 10, block, 7 << 20, 107, 8192, block, digest) == \
        ANSWER_OVERHEAD + 10  # the end of the copy
    assert probe_cost(False, 1 << 50, 1, 100, 0, 8192, block, digest) == ANSWER_OVERHEAD
    # Chain values: no more than one frame's worth, nor than the blocks held.
    assert probe_cost(True, 0, 1 << 40, 0, 107, 8192, block, digest) == \
        ANSWER_OVERHEAD + 107 * digest
    assert probe_cost(True, 0, 1 << 40, 0, 10**6, 8192, block, digest) == \
        ANSWER_OVERHEAD + 8192 * digest
    assert probe_cost(True, 200, 5, 0, 107, 8192, block, digest) == ANSWER_OVERHEAD


def test_chunked_cost_counts_a_header_per_item() -> None:
    assert chunked_cost(0, 256) == ANSWER_OVERHEAD
    assert chunked_cost(1000, 256) == 1000 + 4 * ANSWER_OVERHEAD


def test_refusals_are_counted_by_reason_and_reach_the_metrics() -> None:
    t = Telemetry(0.0)
    t.refuse("keys", 3)
    t.refuse("nested")
    assert t.refusals() == {"keys": 3, "nested": 1}
    assert set(LIMIT_REASONS) <= set(REJECT_REASONS)
    with pytest.raises(AssertionError):
        t.refuse("no such reason")
    status = {"connected": True, "rejected_frames": 0, "peers": {}, "files": [],
              "peer_limits": {"keys": 7, "remote_growth": {"stopped": True},
                              "held": {"x": {"held_bytes": 123, "refused": 4}}},
              "telemetry": t.snapshot()}
    got = {m.name: m for m in families(status)}
    assert got["syncd_remote_growth_stopped"].samples[0].value == 1
    assert got["syncd_keys"].samples[0].value == 7
    assert got["syncd_peer_held_bytes"].samples[0].labels == {"peer": "x"}
    by_reason = {s.labels["reason"]: s.value for s in got["syncd_rejected_frames_by_reason"]
                 .samples if s.name.endswith("_total")}
    assert by_reason["keys"] == 3 and by_reason["disk_low"] == 0


def test_limits_from_the_config_name_key_and_line(tmp_path: Path) -> None:
    base = {"node": "a", "runtimes_dir": "r", "state_dir": "s"}
    c = parse_config({**base, "limits": {"max_keys": 50, "min_free_bytes": 0}},
                     tmp_path / "c.toml")
    assert c.limits == Limits(max_keys=50, min_free_bytes=0)
    assert Limits().max_keys == 10_000 and Limits().min_free_bytes == 1 << 30
    text = "[limits]\nmax_keys = 0\n"
    with pytest.raises(ConfigError, match=r"c.toml:2: limits.max_keys: must be between 1"):
        parse_config({**base, "limits": {"max_keys": 0}}, tmp_path / "c.toml", text)
    text = '[limits]\n\nmin_free_bytes = "1G"\n'
    with pytest.raises(ConfigError, match=r"c.toml:3: limits.min_free_bytes: must be an int"):
        parse_config({**base, "limits": {"min_free_bytes": "1G"}}, tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=r"limits.max_peer_bytes: must be between"):
        parse_config({**base, "limits": {"max_peer_bytes": 10}}, tmp_path / "c.toml")
