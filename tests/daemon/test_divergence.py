"""Divergence and failover, end to end: refuse, explain, resolve, and never lose a byte."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines


def syncd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def adopt(d: Daemon, source: str, key: str = KEY) -> subprocess.CompletedProcess[str]:
    return syncd("adopt", key, "--from", source, "--config", str(d.config), "--yes")


def located(d: Daemon, peer: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        lambda: (f := d.file_status(KEY)) and f["diverged"].get(peer, {}).get("line")
        and f["diverged"][peer], 15, f"{d.node} to locate its divergence with {peer}")
    return found


def archived(d: Daemon) -> list[tuple[bytes, dict[str, Any]]]:
    folder = d.state / "archive" / KEY
    out = []
    for manifest in sorted(folder.glob("*.manifest.json")):
        copy = manifest.with_name(manifest.name.removesuffix(".manifest.json"))
        out.append((copy.read_bytes(), json.loads(manifest.read_text())))
    return out


def replicated_pair(broker: Broker, make_daemon: Callable[..., Daemon],
                    lines: int) -> tuple[Daemon, Daemon, bytes]:
    """Hosts a and b, with `lines` lines written on a and replicated to b."""
    a, b = (make_daemon(n, broker) for n in "ab")
    data = ishiki_lines(lines)
    append(a.path(KEY), data)
    wait_equal(data, b)
    return a, b, data


def test_hand_edit_on_active_host_is_refused_everywhere_and_adopt_resolves(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    src = a.path(KEY)
    append(src, ishiki_lines(40))
    original = src.read_bytes()
    wait_equal(original, b, c)
    # The seed's documented repair: delete a bad line (here line 6) while the bot is stopped.
    lines = original.splitlines(keepends=True)
    edited = b"".join(lines[:5] + lines[6:])
    src.write_bytes(edited)  # same inode, shorter: an in-place rewrite
    for d in (a, b, c):
        wait_state(d, "diverged")
    where = sum(len(x) for x in lines[:5])
    for d, peer in ((b, "a"), (c, "a"), (a, "b")):
        found = located(d, peer)
        assert found["offset"] == where + first_diff(lines[5], lines[6])
        assert found["line"] == 6
    # Every host kept its bytes.
    assert content(b.path(KEY)) == original and content(c.path(KEY)) == original
    assert content(src) == edited
    # status says so in text and exit code, and --json carries the same facts.
    text = syncd("status", "--config", str(b.config))
    assert text.returncode == 1
    assert "DIVERGED from a" in text.stdout and "line 6" in text.stdout
    js = json.loads(syncd("status", "--json", "--config", str(b.config)).stdout)
    assert js["files"][0]["diverged"]["a"]["line"] == 6
    # The operator keeps the repaired copy: B and C adopt A's.
    for d in (b, c):
        done = adopt(d, "a")
        assert done.returncode == 0, done.stderr
        assert "archived" in done.stdout
    wait_equal(edited, a, b, c)
    for d in (a, b, c):
        wait_state(d, "in_sync")
    for d in (b, c):
        [(copy, manifest)] = archived(d)
        assert copy == original  # the losing copy, bit for bit
        assert manifest["sha256"] == hashlib.sha256(original).hexdigest()
        assert manifest["adopted_from"] == "a" and manifest["node"] == d.node
    append(src, ishiki_lines(2))  # replication resumes
    wait_equal(content(src), b, c)


def first_diff(x: bytes, y: bytes) -> int:
    return next(i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)


def test_split_brain_both_refuse_each_other(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, common = replicated_pair(broker, make_daemon, 10)
    # The bot runs on both hosts at once; B's syncd is paused so neither sees the other first.
    b.pause()
    ours, theirs = ishiki_lines(3), ishiki_lines(2)
    append(a.path(KEY), ours)
    append(b.path(KEY), theirs)
    b.resume()
    for d, peer in ((a, "b"), (b, "a")):
        wait_state(d, "diverged")
        found = located(d, peer)
        assert found["offset"] == len(common) + first_diff(ours, theirs)
        assert found["line"] == common.count(b"\n") + 1
    assert content(a.path(KEY)) == common + ours
    assert content(b.path(KEY)) == common + theirs
    # Nothing moves between the two: a's next line is recorded (and shipped) by a, never taken
    # by b. (Neither is frozen: each would go on with any host whose copy agrees.)
    append(a.path(KEY), ishiki_lines(1))
    wait_until(lambda: a.file_status(KEY)["size"] > len(common + ours), 10, "a to take it")
    assert a.file_status(KEY)["mode"] == "live"
    assert content(b.path(KEY)) == common + theirs
    # Restart keeps the divergence.
    a.stop()
    a.start()
    wait_state(a, "diverged")


def test_split_brain_with_a_third_host_it_follows_the_side_that_reached_it_first(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """a and b write different lines after the same prefix; c takes a's (b's syncd is paused,
    so a's reach c first). c then refuses b, a and c replicate on, b shows the fork with both;
    nothing is overwritten anywhere (issue #13)."""
    a, b, c = (make_daemon(n, broker) for n in "abc")
    common = ishiki_lines(10)
    append(a.path(KEY), common)
    wait_equal(common, b, c)
    b.pause()
    ours, theirs = ishiki_lines(3), ishiki_lines(2)
    append(a.path(KEY), ours)
    append(b.path(KEY), theirs)
    wait_equal(common + ours, c)
    b.resume()
    for d, forks in ((a, {"b"}), (b, {"a", "c"}), (c, {"b"})):
        wait_until(lambda d=d, forks=forks: set(d.file_status(KEY)["diverged"]) == forks, 15,
                   f"{d.node} to show its divergences {sorted(forks)}")
        assert d.file_status(KEY)["mode"] == "live"
    later = ishiki_lines(2)
    append(a.path(KEY), later)  # a and c go on together
    wait_equal(common + ours + later, c)
    assert content(b.path(KEY)) == common + theirs
    for d, other in ((a, "c"), (c, "a")):
        wait_until(lambda d=d, other=other: d.file_status(KEY)["peers"][other]["state"]
                   == "in_sync", 10, f"{d.node} in sync with {other}")
        assert d.file_status(KEY)["peers"]["b"]["state"] == "diverged"
        assert d.file_status(KEY)["ready"] is False  # which side is right is not decided
    # The operator keeps a's history: b adopts it, and every divergence clears.
    done = adopt(b, "a")
    assert done.returncode == 0, done.stderr
    wait_equal(common + ours + later, b)
    for d in (a, b, c):
        wait_state(d, "in_sync")
    [(copy, _)] = archived(b)
    assert copy == common + theirs


def test_cleared_file_is_a_reset_not_a_truncation_of_the_standbys(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, old = replicated_pair(broker, make_daemon, 20)
    # clear(): the writer deletes the file and starts again from byte 0.
    a.path(KEY).unlink()
    fresh = ishiki_lines(2)
    append(a.path(KEY), fresh)
    found = wait_state(a, "reset")
    assert "deleted" in str(found["freeze"]) or "new inode" in str(found["freeze"])
    # Neither direction moves: B keeps the old history, A's new file gets nothing poured in,
    # while a new standby that never had the file fills normally (from B).
    c = make_daemon("c", broker)
    wait_equal(old, c)
    wait_state(b, "in_sync")  # with C; A's frozen copy is not pulled from
    assert content(b.path(KEY)) == old
    assert content(a.path(KEY)) == fresh
    assert syncd("status", "--config", str(a.config)).returncode == 1
    # The operator meant the clear: A keeps its new copy; B and C adopt it.
    keep = adopt(a, "a")
    assert keep.returncode == 0 and "keeping the local copy" in keep.stdout
    for d in (b, c):
        wait_state(d, "diverged")  # they hold the other history now
        done = adopt(d, "a")
        assert done.returncode == 0, done.stderr
    wait_equal(fresh, a, b, c)
    [(copy, manifest)] = archived(b)
    assert copy == old and manifest["reason"]


def test_truncated_copy_is_a_reset_and_is_not_refilled_silently(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, old = replicated_pair(broker, make_daemon, 20)
    with b.path(KEY).open("r+b") as f:
        f.truncate(100)
    found = wait_state(b, "reset")
    assert "truncated from" in str(found["freeze"])
    assert content(b.path(KEY)) == old[:100]  # not refilled by "longer wins"
    # A is not frozen (B's bytes are a prefix of A's) and shows B's freeze.
    wait_until(lambda: a.file_status(KEY)["peers"]["b"]["frozen"] == "reset", 10, "a to see it")
    assert a.file_status(KEY)["state"] == "in_sync"
    done = adopt(b, "a")
    assert done.returncode == 0, done.stderr
    wait_equal(old, b)
    [(copy, manifest)] = archived(b)
    assert copy == old[:100] and manifest["size"] == 100


def test_unshipped_tail_at_failover_is_refused_then_adopted(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, shipped = replicated_pair(broker, make_daemon, 15)
    a.kill()  # the active host dies ...
    unshipped = ishiki_lines(3)
    append(a.path(KEY), unshipped)  # ... with lines the standby never received
    taken_over = ishiki_lines(4)
    append(b.path(KEY), taken_over)  # the standby takes over and writes
    a.start()
    for d in (a, b):
        wait_state(d, "diverged")
    assert located(a, "b")["offset"] == len(shipped) + first_diff(unshipped, taken_over)
    assert content(a.path(KEY)) == shipped + unshipped
    assert content(b.path(KEY)) == shipped + taken_over
    # Failback: the old host adopts the new writer's copy; its unshipped lines are archived.
    done = adopt(a, "b")
    assert done.returncode == 0, done.stderr
    wait_equal(shipped + taken_over, a, b)
    for d in (a, b):
        wait_state(d, "in_sync")
    [(copy, _)] = archived(a)
    assert copy == shipped + unshipped


def test_adopt_refuses_unknown_and_offline_nodes(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, _ = replicated_pair(broker, make_daemon, 3)
    unknown = adopt(b, "nosuch")
    assert unknown.returncode == 1 and "unknown node 'nosuch'" in unknown.stderr
    a.stop()
    wait_until(lambda: not b.status()["peers"]["a"]["online"], 10, "b to see a offline")
    offline = adopt(b, "a")
    assert offline.returncode == 1 and "a is offline" in offline.stderr
    assert content(b.path(KEY)) == content(a.path(KEY))  # nothing was archived or changed
    assert not (b.state / "archive").exists()


def test_roles_source_never_takes_and_replica_never_ships(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker, extra='role = "source"')
    b = make_daemon("b", broker, extra='role = "replica"')
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    assert b.file_status(KEY)["role"] == "replica"
    before = content(a.path(KEY))
    append(b.path(KEY), ishiki_lines(1))  # someone wrote on the replica
    found = wait_state(b, "diverged")
    assert "replica" in str(found["freeze"])
    assert content(a.path(KEY)) == before  # the source took nothing


def test_role_change_takes_effect_on_reload(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    _, b, _ = replicated_pair(broker, make_daemon, 3)
    good = b.config.read_text()
    b.config.write_text(good + "\n[mqtt.oops]\n")  # invalid: the running config stays
    b.reload()
    wait_until(lambda: "reload refused" in b.read_log(), 10, "the refusal in the log")
    b.config.write_text('role = "replica"\n' + good)
    b.reload()
    wait_until(lambda: b.file_status(KEY)["role"] == "replica", 10, "b to become a replica")
    append(b.path(KEY), ishiki_lines(1))
    wait_state(b, "diverged")
