"""Faults of the environment: a full disk, a blind watcher, a file that cannot be read."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root, as CI has; skipped elsewhere)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_on_a_replica_pauses_and_resumes(
    broker: Broker, make_daemon: Callable[..., Daemon], small_disk: Path
) -> None:
    a = make_daemon("a", broker)
    # No floor: this is the disk itself refusing (ENOSPC); the floor that keeps free space for
    # the local writer is test_bounds.py::test_remote_growth_stops_above_min_free_bytes...
    b = make_daemon("b", broker, start=False, extra="[limits]\nmin_free_bytes = 0\n")
    b.runtimes.rmdir()
    b.runtimes.symlink_to(small_disk)  # b's copies live on the small disk
    b.start()
    src = a.path(KEY)
    while src.exists() is False or src.stat().st_size < 1_500_000:
        append(src, ishiki_lines(200))
    found = wait_state(b, "paused")
    assert "No space left" in str(found["paused"])
    copy = content(b.path(KEY))
    assert src.read_bytes().startswith(copy) and copy.endswith(b"\n")  # whole-line prefix
    assert b.read_log().count("PAUSED") == 1  # said once, not per frame
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    wait_equal(src.read_bytes(), b, timeout=20)
    wait_state(b, "in_sync")
    assert "replication resumed" in b.read_log()


def test_without_inotify_the_sweep_still_replicates(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker, extra="watch = false")
    b = make_daemon("b", broker, extra="watch = false")
    for _ in range(3):
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b)
    append(a.path("late-key"), ishiki_lines(2))  # new directories too
    wait_equal(content(a.path("late-key")), b, key="late-key")


def test_an_unreadable_key_does_not_stop_the_others(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker, start=False)
    a.path("broken").mkdir(parents=True)  # events.jsonl is a directory: cannot be read
    a.start()
    b = make_daemon("b", broker)
    append(a.path(KEY), ishiki_lines(4))
    wait_equal(content(a.path(KEY)), b)
    wait_until(lambda: "broken/events.jsonl: cannot read" in a.read_log(), 10,
               "an error naming the file")
    assert "is a directory" in a.file_status("broken")["error"].lower()
    assert a.file_status("broken")["state"] == "error"
    assert "Traceback" not in a.read_log()
    assert a.proc is not None and a.proc.poll() is None
