"""End to end: real syncd processes, a real Mosquitto, real files (issue: the core)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines


def test_appends_reach_every_host_byte_identical(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    src = a.path(KEY)
    for n in (1, 5, 50):
        append(src, ishiki_lines(n))
    append(src, b'{"bytes":"\xff\xfe not utf-8"}\n')  # bytes are bytes
    wait_equal(src.read_bytes(), b, c)
    for d in (a, b, c):
        wait_state(d, "in_sync")
    # Received bytes do not echo back as local growth.
    assert a.file_status(KEY)["applied_bytes"] == 0
    assert b.file_status(KEY)["shipped_bytes"] == 0


def test_torn_last_line_is_not_shipped_until_completed(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    src = a.path(KEY)
    whole = ishiki_lines(3)
    append(src, whole)
    wait_equal(whole, b)
    torn = ishiki_lines(1)
    append(src, torn[:40])
    # The sweep (0.2 s) and the watcher have both seen the torn bytes by the time a later
    # complete write to another key has arrived.
    append(a.path("other"), ishiki_lines(1))
    wait_equal(content(a.path("other")), b, key="other")
    assert content(b.path(KEY)) == whole
    append(src, torn[40:])
    wait_equal(whole + torn, b)


def test_host_away_longer_than_the_broker_queue_catches_up(
    tmp_path: Path, make_daemon: Callable[..., Daemon]
) -> None:
    small = Broker(tmp_path / "small-broker", max_queued_messages=5)
    small.start()
    try:
        a, b, c = (make_daemon(n, small) for n in "abc")
        src = a.path(KEY)
        append(src, ishiki_lines(5))
        wait_equal(src.read_bytes(), b, c)
        # C stays connected but reads nothing (the broker queues, then drops) ...
        c.pause()
        for _ in range(60):
            append(src, ishiki_lines(2))
        wait_equal(src.read_bytes(), b)
        c.resume()
        wait_equal(src.read_bytes(), b, c)
        # ... and C stopped entirely while A writes more than the queue holds.
        c.stop()
        for _ in range(60):
            append(src, ishiki_lines(3))
        wait_equal(src.read_bytes(), b)
        c.start()
        wait_equal(src.read_bytes(), a, b, c)
        wait_state(c, "in_sync")
    finally:
        small.stop()


def test_failback_old_writer_fast_forwards_from_the_new_one(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    append(a.path(KEY), ishiki_lines(10))
    wait_equal(content(a.path(KEY)), b)
    a.stop()  # failover: the bot now runs on B
    append(b.path(KEY), ishiki_lines(7))
    append(b.path(KEY), ishiki_lines(1))
    a.start()  # failback: A's copy is a clean prefix of B's
    wait_equal(content(b.path(KEY)), a)
    wait_state(a, "in_sync")
    wait_state(b, "in_sync")
    append(a.path(KEY), ishiki_lines(2))  # and A can be the writer again
    wait_equal(content(a.path(KEY)), b)


def test_edit_inside_replicated_prefix_freezes_and_changes_nothing(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    src = a.path(KEY)
    append(src, ishiki_lines(20))
    original = src.read_bytes()
    wait_equal(original, b, c)
    # An operator "repairs" a line in place (same size), then the bot appends.
    edited = bytearray(original)
    edited[100] = ord("X") if edited[100] != ord("X") else ord("Y")
    with src.open("r+b") as f:
        f.seek(100)
        f.write(bytes(edited[100:101]))
    append(src, ishiki_lines(2))
    a_state = wait_state(a, "diverged")
    assert "changed locally" in str(a_state["note"])
    for d in (b, c):
        f = wait_state(d, "diverged")
        assert "a" in f["diverged"]  # type: ignore[operator]
    # Nothing was overwritten or appended anywhere.
    assert content(b.path(KEY)) == original
    assert content(c.path(KEY)) == original
    assert content(src).startswith(bytes(edited))
    assert "DIVERGED" in b.read_log() or "DIVERGED" in c.read_log()
    # The freeze survives a restart.
    b.stop()
    b.start()
    wait_state(b, "diverged")
    assert content(b.path(KEY)) == original


def test_edit_while_syncd_was_stopped_is_detected_on_restart(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    src = a.path(KEY)
    append(src, ishiki_lines(30))
    original = src.read_bytes()
    wait_equal(original, b)
    a.stop()
    # Delete a whole line (the seed's documented repair), then append: the file grows.
    lines = original.splitlines(keepends=True)
    src.write_bytes(b"".join(lines[:3] + lines[4:]) + ishiki_lines(5))
    a.start()
    wait_state(a, "diverged")
    wait_state(b, "diverged")
    assert content(b.path(KEY)) == original


def test_new_instance_directory_is_picked_up(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    for key in ("late-1", "late-2"):
        append(a.path(key), ishiki_lines(4))
    for key in ("late-1", "late-2"):
        wait_equal(content(a.path(key)), b, key=key)


def test_restart_resends_nothing_and_resumes(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    append(a.path(KEY), ishiki_lines(200))
    wait_equal(content(a.path(KEY)), b)
    a.stop()
    b.stop()
    a.start()
    b.start()
    wait_state(b, "in_sync")
    assert b.file_status(KEY)["applied_bytes"] == 0
    assert a.file_status(KEY)["served_bytes"] == 0
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b)


def test_broker_restart_loses_nothing(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    broker.stop()
    append(a.path(KEY), ishiki_lines(5))  # written while the broker is down
    wait_until(lambda: not a.status()["connected"], 10, "a to notice the broker is gone")
    broker.start()
    wait_equal(content(a.path(KEY)), b)
    assert "unreachable" in a.read_log()


def test_kill_9_mid_stream_leaves_only_prefixes(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    src = a.path(KEY)
    for round_ in range(3):
        victim = (b, c, a)[round_]
        for i in range(40):
            append(src, ishiki_lines(1 + i % 4))
            if i == 20:
                victim.kill()
        source = src.read_bytes()
        for d in (b, c):
            assert source.startswith(content(d.path(KEY))), f"{d.node} is not a prefix"
        victim.start()
        wait_equal(source, b, c)


def test_large_backlog_and_a_line_longer_than_a_frame(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    small_frames = "chunk_bytes = 8192\nfetch_window_bytes = 65536"
    a = make_daemon("a", broker, extra=small_frames)
    backlog = ishiki_lines(6000)  # ~2.4 MB: many windows of many frames
    append(a.path(KEY), backlog)
    b = make_daemon("b", broker, extra=small_frames)  # a new standby with nothing
    wait_equal(backlog, b, timeout=30)
    long_line = b'{"id":"big","data":"' + b"z" * 50_000 + b'"}\n'
    append(a.path(KEY), long_line + ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b)


def test_scrub_finds_an_edit_that_hides_its_mtime(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker, extra="scrub_interval = 1")
    b = make_daemon("b", broker)
    src = a.path(KEY)
    append(src, ishiki_lines(400))  # > 64 KiB: the edit lands in a full block
    original = src.read_bytes()
    wait_equal(original, b)
    st = src.stat()
    a.pause()  # so that it cannot look between the edit and the mtime put back
    with src.open("r+b") as f:  # same size, and the old mtime put back
        f.seek(1000)
        f.write(b"X" if original[1000:1001] != b"X" else b"Y")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    a.resume()
    wait_state(b, "diverged", timeout=20)
    assert content(b.path(KEY)) == original
    assert "scrub" in str(a.file_status(KEY)["note"])


def test_kill_9_in_the_middle_of_a_long_line_resumes_it(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    small = "chunk_bytes = 4096\nfetch_window_bytes = 16384"
    a = make_daemon("a", broker, extra=small)
    b = make_daemon("b", broker, extra=small)
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b)
    start = len(content(a.path(KEY)))
    append(a.path(KEY), b'{"id":"long","data":"' + b"y" * 3_000_000 + b'"}\n')
    # Kill b while it holds only the first pieces of the long line (no final newline yet).
    wait_until(lambda: start < len(content(b.path(KEY))) and not content(b.path(KEY))
               .endswith(b"\n"), 20, "b to be in the middle of the long line", interval=0.001)
    b.pause()  # stopped at once: the copy read below is the one the kill leaves
    torn = content(b.path(KEY))
    b.kill()
    assert not torn.endswith(b"\n") and content(a.path(KEY)).startswith(torn)
    b.start()
    wait_equal(content(a.path(KEY)), b, timeout=30)
    wait_state(b, "in_sync")


def test_a_write_on_a_standby_right_after_its_own_append_is_noticed_at_once(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """The watcher reports a standby's own appends too, and syncd skips those hints when the
    file is exactly as its append left it (FileTask.changed). A bot's write on
    that host just after must still be looked at at once, not at the next sweep (5 s here):
    it becomes the longer tail, and reaches the other host within seconds."""
    slow_sweep = "sweep_interval = 5\nrequest_timeout = 1.0\n"
    a = make_daemon("a", broker, tuning=slow_sweep)
    b = make_daemon("b", broker, tuning=slow_sweep)
    for n in range(5):  # b appends what a ships, several times
        append(a.path(KEY), ishiki_lines(1 + n))
        wait_equal(content(a.path(KEY)), b, timeout=4)
    append(b.path(KEY), ishiki_lines(2))
    wait_equal(content(b.path(KEY)), a, timeout=3)


def test_appends_made_while_a_commit_is_under_way_go_together_in_the_next(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Group commit (daemon/window.py): a backlog written while the writer's host was stopped
    keeps one commit in flight for a while (read, ship, sync, 4 MiB at a time); appends made
    meanwhile must join the next commit, not start their own, and all arrive."""
    a, b = (make_daemon(n, broker) for n in "ab")
    src = a.path(KEY)
    append(src, ishiki_lines(1))
    wait_equal(content(src), b)
    block = ishiki_lines(2000)

    def backlog_under_way() -> dict[str, int]:
        a.pause()
        try:
            with src.open("ab") as f:
                end = f.tell() + (64 << 20)
                while f.tell() < end:
                    f.write(block)
        finally:
            a.resume()
        return wait_until(lambda: (g := a.status()["group_commit"])["in_flight"] and g,
                          what="the backlog's commit under way")

    base = seen = backlog_under_way()
    # How fast the backlog drains is the machine's business: when it is done before five
    # appends joined, another backlog gives the next appends a commit to join.
    for _ in range(3):
        while seen["in_flight"] and seen["joined"] - base["joined"] < 5:
            append(src, ishiki_lines(1))
            # One change notice per append: the watcher merges the notices of one read.
            seen = wait_until(lambda n=seen["changes"]: (g := a.status()["group_commit"])
                              ["changes"] > n and g, what="the append's notice")
        if seen["joined"] - base["joined"] >= 5:
            break
        seen = backlog_under_way()
    wait_equal(content(src), b, timeout=60)
    g = wait_until(lambda: (g := a.status()["group_commit"])["in_flight"] == 0 and g,
                   what="every commit done")
    assert g["joined"] - base["joined"] >= 5, (base, g)
    # The joined appends left in one commit each time the one under way was done.
    assert g["reads"] - base["reads"] < g["changes"] - base["changes"], (base, g)
