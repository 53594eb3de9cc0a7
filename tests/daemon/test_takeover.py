"""Taking over a whole profile: `syncd status --ready --wait` and selectors, end to end.

Real `syncd run` daemons with two profiles' roots (`profiles/*/runtimes`) against a real
Mosquitto; the CLI is run as a process, as a bot's unit runs it (ExecStartPre).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncd.ops.control import ControlError, query
from tests.daemon.test_keys_e2e import append, memory, with_profiles
from tests.daemon.test_readiness import finished_turn
from tests.support.cluster import Broker, Daemon, wait_until

ALICE = ["main", "onebot_123/group_456", "onebot_123/group_789", "cross_大厅"]
BOB = ["main"]


def syncd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def status_of(d: Daemon, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return syncd("status", "--config", str(d.config), *args, timeout=timeout)


def digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def hosts(make_daemon: Callable[..., Daemon], broker: Broker) -> tuple[Daemon, Daemon]:
    """a (alice's and bob's writer) and b (the standby), neither started."""
    return (with_profiles(make_daemon("a", broker, start=False)),
            with_profiles(make_daemon("b", broker, start=False)))


_TURNS = iter(range(10**9))


def turns(n: int) -> bytes:
    """n whole turns (3 lines each): a log the checks behind READY accept."""
    return b"".join(finished_turn(f"turn-{next(_TURNS)}") for _ in range(n))


def write(a: Daemon, n: int) -> None:
    for rel in ALICE:
        append(memory(a, "alice", rel), turns(n))
    for rel in BOB:
        append(memory(a, "bob", rel), turns(n))


def identical(a: Daemon, b: Daemon, profile: str, rels: list[str]) -> bool:
    return all(digest(memory(b, profile, r)) == digest(memory(a, profile, r)) is not None
               for r in rels)


def ready_keys(d: Daemon) -> set[str]:
    return {f["key"] for f in d.status()["files"] if f["ready"]}


def in_sync(a: Daemon, b: Daemon) -> None:
    """b holds every file of a, each READY."""
    def done() -> bool:
        keys = {f["key"] for f in a.status()["files"]}
        return bool(keys) and ready_keys(b) == keys and all(
            digest(memory(b, *k.split("/", 1))) == digest(memory(a, *k.split("/", 1)))
            for k in keys)

    wait_until(done, 30, "b holding every file of a, READY")


def test_wait_returns_once_the_profile_is_complete_and_ready(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = hosts(make_daemon, broker)
    a.start()
    b.start()
    write(a, 20)
    in_sync(a, b)
    b.stop()
    write(a, 300)  # 120 kB per key that b lacks when it comes back
    # The bot's unit on b asks before syncd there runs: it waits, also for syncd.
    waiting = subprocess.Popen(
        [sys.executable, "-m", "syncd", "status", "--config", str(b.config), "--ready",
         "--wait", "60", "alice/*"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiting.stderr is not None
        said = [waiting.stderr.readline(), waiting.stderr.readline()]  # asked once, in vain
        assert said[0].startswith("syncd status: waiting up to 60s until every file of alice/*")
        assert "syncd is not running" in said[1] and "asking again" in said[1]
        b.start()
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    # READY means complete: every file of alice's is byte-identical the moment it says so.
    assert identical(a, b, "alice", ALICE)
    assert out == f"alice/*: ready ({len(ALICE)} keys, {len(ALICE)} files)\n"
    assert "READY after" in err
    # The root's name selects the same keys; bob is named on its own.
    assert status_of(b, "--ready", "alice").returncode == 0
    assert status_of(b, "--ready", "--wait", "30", "bob").returncode == 0


def test_wait_gives_up_at_the_deadline_naming_what_is_behind(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = hosts(make_daemon, broker)
    a.start()
    b.start()
    write(a, 20)
    in_sync(a, b)
    b.stop()
    # b comes back to a writer that serves it one request, then nothing (its byte budget,
    # [limits], is in debt for ever): b knows what a holds and cannot fetch it.
    a.stop()
    a.edit_config("[mqtt]", "[limits]\nbytes_per_second = 1\nbyte_burst = 1\n[mqtt]")
    a.start()
    for rel in ALICE:
        append(memory(a, "alice", rel), turns(5))
    b.start()
    started = time.monotonic()
    done = status_of(b, "--ready", "--wait", "3", "alice/*")
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - started >= 3
    head, *reasons = done.stdout.splitlines()
    assert head.startswith("alice/*: NOT READY (") and head.endswith(
        f" of {len(ALICE)} files not ready, {len(ALICE)} keys)")
    assert len(reasons) >= len(ALICE) - 1  # one request was served: at most one file complete
    assert all(r.startswith("  alice/") and " a holds " in r and "more bytes" in r
               for r in reasons), reasons
    assert "NOT READY after 3." in done.stderr
    # bob's profile is complete: naming it alone, b may take it over.
    assert status_of(b, "--ready", "bob/*").returncode == 0
    # The same verdict as JSON, for scripts.
    js = status_of(b, "--ready", "--json", "alice", "bob")
    assert js.returncode == 1
    verdict = json.loads(js.stdout)
    assert verdict["ready"] is False and verdict["node"] == "b"
    alice, bob = verdict["selectors"]
    assert (alice["selector"], alice["ready"], alice["files"]) == ("alice", False, len(ALICE))
    assert alice["ready_files"] <= 1 and len(alice["not_ready"]) == len(ALICE) - alice[
        "ready_files"]
    assert all("a holds " in f["reasons"][0] for f in alice["not_ready"])
    assert bob["ready"] is True and bob["keys"] == ["bob/main"]
    # A selector that names nothing never passes: a typo in a unit must not start a bot.
    typo = status_of(b, "--ready", "--wait", "1", "alcie/*")
    assert typo.returncode == 1 and "alcie/*: NOT READY: names no file b replicates" in typo.stdout


def test_selectors_in_status_text_json_and_the_control_request(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = hosts(make_daemon, broker)
    (a.root / "profiles" / "-dash" / "runtimes").mkdir(parents=True)
    a.start()
    b.start()
    write(a, 5)
    append(memory(a, "-dash", "main"), turns(5))
    in_sync(a, b)
    wait_until(lambda: "-dash/main" in ready_keys(b), 15, "b ready for -dash/main")

    text = status_of(b, "alice/onebot_123")
    assert text.returncode == 0
    rows = [line.split()[0] for line in text.stdout.splitlines()[3:] if line.startswith("alice")]
    assert rows == ["alice/onebot_123/group_456", "alice/onebot_123/group_789"]
    assert text.stdout.splitlines()[-1] == "2 files: 2 in_sync; 2 ready to take over"

    js = json.loads(status_of(b, "--json", "*/main").stdout)
    assert [f["key"] for f in js["files"]] == ["-dash/main", "alice/main", "bob/main"]
    assert js["ready_count"] == {"yes": 3, "no": 0}
    # A key (here a root's name) that begins with '-' follows --.
    dash = status_of(b, "--ready", "--wait", "10", "--", "-dash")
    assert dash.returncode == 0 and dash.stdout == "-dash: ready (1 key, 1 file)\n"

    # The daemon narrows the document itself: a poll names what it needs, not thousands.
    sock = b.state / "syncd.sock"
    narrowed: dict[str, Any] = query(sock, "status", select=["bob"])["status"]
    assert [f["key"] for f in narrowed["files"]] == ["bob/main"]
    assert narrowed["node"] == "b" and "peers" in narrowed
    for bad in ("bob", [""], [1]):
        try:
            query(sock, "status", select=bad)
        except ControlError as e:
            assert "select: a list of at most 1000 selectors" in str(e)
        else:
            raise AssertionError(f"select={bad!r} was accepted")


def test_a_new_standby_hears_of_every_key_past_the_brokers_queue(
    tmp_path: Path, make_daemon: Callable[..., Daemon]
) -> None:
    """A profile of more files than the broker queues for a client: the retained positions
    (one MQTT message per file) past its queue are dropped, and a standby that held none of
    the keys used to hear of the first ones only and call the profile READY without the
    rest. Every position now also goes in the batch when a peer comes online."""
    broker = Broker(tmp_path / "small-queue", max_queued_messages=5,
                    extra="max_inflight_messages 5\n")
    broker.start()
    try:
        a, b = hosts(make_daemon, broker)
        keys = [f"chat_{i:03d}" for i in range(40)]  # 4 times what the broker queues
        for rel in keys:
            append(memory(a, "alice", rel), turns(1))
        a.start()
        wait_until(lambda: len(ready_keys(a)) == len(keys), 30, "a ready for every key")
        b.start()
        wait_until(lambda: len(b.status()["files"]) == len(keys), 30,
                   f"b to hear of all {len(keys)} keys")
        done = status_of(b, "--ready", "--wait", "30", "alice")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == f"alice: ready ({len(keys)} keys, {len(keys)} files)\n"
        assert identical(a, b, "alice", keys)
    finally:
        broker.stop()
