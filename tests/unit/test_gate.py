"""The words the frame gate's refusal log lines use for each bound (syncd/daemon/gate.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from syncd.core import frames
from syncd.core.budget import Limits
from syncd.core.telemetry import LIMIT_REASONS
from syncd.daemon.gate import bound_of


def test_each_bound_is_named_with_its_setting_and_value() -> None:
    lim = Limits(max_keys=7, max_peer_bytes=1234, min_free_bytes=99, max_resource_files=5)
    assert bound_of("keys", lim) == "over [limits] max_keys (7)"
    assert bound_of("peer_bytes", lim) == ("its frames hold [limits] max_peer_bytes (1234) "
                                           "here already")
    assert bound_of("disk_low", lim).endswith("min_free_bytes (99)")
    assert bound_of("entries", lim) == "over [limits] max_resource_files (5)"


def test_a_reason_without_words_of_its_own_is_said_as_it_is() -> None:
    assert bound_of("budget", Limits()) == "budget"
    for reason in LIMIT_REASONS:
        assert bound_of(reason, Limits())


def _gate(rejected: list[str]) -> Any:
    from syncd.daemon.gate import FrameGate

    host = SimpleNamespace(
        node="b",
        config=SimpleNamespace(mqtt=SimpleNamespace(topic_prefix="test/syncd"),
                               peer_keys=dict),
        telemetry=SimpleNamespace(reject=rejected.append))
    return FrameGate(host, SimpleNamespace())  # type: ignore[arg-type]


def test_a_topic_that_does_not_parse_is_refused_every_time_and_not_kept() -> None:
    rejected: list[str] = []
    gate = _gate(rejected)
    for _ in range(3):
        gate.on_message("test/syncd/zz/x", b"frame")
    assert len(rejected) == 3 and all("unknown topic kind" in r for r in rejected)
    assert not gate._routes


def test_parsed_topics_are_kept_within_their_bound(monkeypatch: Any) -> None:
    from syncd.daemon import gate as gate_module

    monkeypatch.setattr(gate_module, "ROUTES_KEPT", 2)
    rejected: list[str] = []
    gate = _gate(rejected)
    for node in ("x", "y", "z", "x"):
        gate.on_message(f"test/syncd/a/{frames.level(node)}", b"frame")
        assert len(gate._routes) <= 2
    # Each still judged as a frame: from a host not in [peers], refused every time.
    assert len(rejected) == 4 and all("not listed in [peers]" in r for r in rejected)
    assert gate._routes[f"test/syncd/a/{frames.level('x')}"] == frames.parse_topic(
        "test/syncd", f"test/syncd/a/{frames.level('x')}")
