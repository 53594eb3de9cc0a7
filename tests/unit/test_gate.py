"""The words the frame gate's refusal log lines use for each bound (syncd/daemon/gate.py)."""

from __future__ import annotations

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
