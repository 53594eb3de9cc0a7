"""The quick mode of the chaos suite (the long mode: python -m tests.support.chaos --faults 200)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import netns
from tests.support.chaos import MAIN_FAULTS, PARTITION_FAULTS, RESOURCE_FAULTS, run


def test_quick_chaos_loses_and_changes_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261130"))
    summary = run(tmp_path, faults=int(os.environ.get("CHAOS_FAULTS", "40")), seed=seed,
                  check_every=5, big_line=2 << 20, log=lambda line: None)
    print(summary.table())
    assert summary.bytes_lost == 0 and summary.bytes_changed == 0, summary.table()
    assert summary.refused == summary.refusals_expected, summary.table()
    assert summary.copies_checked >= 16
    assert len(set(summary.injected) & set(MAIN_FAULTS)) >= 5  # a real mix of faults
    assert set(summary.injected) & set(RESOURCE_FAULTS), summary.table()
    assert summary.resources_checked > 0 and summary.temp_files_copied == 0, summary.table()


def test_quick_chaos_with_network_partitions(tmp_path: Path) -> None:
    """Each host in a network namespace; cuts of the writer's and the replicas' links join
    the faults (the long mode: python -m tests.support.chaos --partitions)."""
    netns.require()
    summary = run(tmp_path, faults=12, seed=int(os.environ.get("CHAOS_SEED", "20261201")),
                  check_every=4, big_line=1 << 20, log=lambda line: None, partitions=True)
    print(summary.table())
    assert summary.bytes_lost == 0 and summary.bytes_changed == 0, summary.table()
    assert summary.refused == summary.refusals_expected, summary.table()
    assert set(summary.injected) & set(PARTITION_FAULTS), summary.table()


def test_quick_hostile_chaos_bounds_hold(tmp_path: Path) -> None:
    """Issue #23: a listed host sending hostile frames of every kind, and a local bot planting
    links, deep trees and unreadable directories (the long mode: python -m
    tests.support.chaos --hostile --frames 10000 --plants 200)."""
    from tests.support.hostile_chaos import run_hostile

    summary = run_hostile(tmp_path, frames_total=int(os.environ.get("CHAOS_FRAMES", "200")),
                          plants=12, seed=int(os.environ.get("CHAOS_SEED", "20261202")),
                          check_every=10, log=lambda line: None)
    print(summary.table())
    assert not summary.failures(), summary.table()
    assert summary.copies_checked >= 4 and summary.resources_checked > 0, summary.table()
    assert sum(summary.frames.values()) >= 200 and sum(summary.plants.values()) == 12
