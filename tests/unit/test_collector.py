"""ops/collector.py: what is alive once started is frozen, after a collection."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from syncd.ops import collector


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    """settle() changes the process's thresholds: the other tests get CPython's back."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


class Node:
    other: object = None


def test_settle_collects_the_start_ups_garbage_then_freezes_what_is_alive() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle of the start-up, garbage once dropped
    gone = weakref.ref(a)
    del a, b
    kept = [Node() for _ in range(10)]
    frozen_before = gc.get_freeze_count()
    try:
        collector.settle()
        assert gone() is None  # collected, not frozen with the rest
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        assert not any(o is kept[0] for o in gc.get_objects())  # out of the collector's walks
    finally:
        gc.unfreeze()


def test_settle_makes_full_collections_rarer_and_keeps_the_young_thresholds() -> None:
    gc.set_threshold(700, 10, 10)  # CPython's
    try:
        collector.settle()
        assert gc.get_threshold() == (700, 10, collector.FULL_EVERY)
        assert collector.FULL_EVERY > 10
    finally:
        gc.unfreeze()
