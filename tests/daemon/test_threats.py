"""The threat model, case by case (docs/security.md, "Threat model"): what a stranger on the
broker, or a listed host that was compromised, can and cannot do. Real daemons, a real
Mosquitto, and a raw MQTT client that signs what it likes with the keys it holds."""

from __future__ import annotations

import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames
from syncd.core.frames import Announce, Data, Frame, Item, Kind
from syncd.core.identity import Identity
from syncd.core.ledger import Ledger
from tests.daemon.test_hostile import Attacker
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

P = "test/syncd"
FILE = "events.jsonl"
INJECTED = b'{"id": "X", "role": "system", "content": "INJECTED"}\n'


def digest_of(data: bytes) -> bytes:
    ledger = Ledger()
    ledger.extend(data)
    return ledger.digest()


def publish(broker: Broker, topic: str, payload: bytes, retain: bool = False) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{time.monotonic_ns()}")
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def signed(identity: Identity, sender: str, topic: str, *items: Item) -> bytes:
    # A run far in the future and a fresh sequence: nothing but the signature can stop it.
    frame = Frame(sender, int(time.time()) + 10**6, 1, int(time.time() * 1000), items)
    return frames.encode(frame, identity, topic)


def inject(broker: Broker, identity: Identity, sender: str, copy: bytes) -> None:
    """A data frame that extends `copy` (its size and digest are public) by one line."""
    topic = frames.all_topic(P, sender)
    data = Data(len(copy), digest_of(copy), INJECTED)
    publish(broker, topic, signed(identity, sender, topic, Item(Kind.LIVE, data, KEY, FILE)))


def test_memory_injection_needs_the_senders_own_key_and_a_writers_seat(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 1: a client that read the retained position cannot append a line: not in c's
    name without c's key, and not even with c's key when the key's `writers` leave c out."""
    writers = f'[keys."{KEY}"]\nwriters = ["a", "b"]\n'
    a, b = make_daemon("a", broker, extra=writers), make_daemon("b", broker, extra=writers)
    append(a.path(KEY), ishiki_lines(10))
    wait_equal(content(a.path(KEY)), b)
    copy = content(a.path(KEY))
    inject(broker, node_identity("mallory"), "d", copy)  # d's name, another key
    inject(broker, node_identity("c"), "c", copy)  # c's real key: c is no writer of KEY
    for d in (a, b):
        wait_until(lambda d=d: d.status()["rejected_frames"] >= 2, 10,
                   f"{d.node} to refuse both")
    log = a.read_log()
    assert "'test/syncd/a/d': bad signature" in log and "c is not among the writers" in log
    append(a.path(KEY), ishiki_lines(2))  # and replication goes on
    wait_equal(content(a.path(KEY)), b)
    for d in (a, b):
        assert INJECTED not in content(d.path(KEY))


def test_a_forged_retained_position_freezes_nothing(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 2: one retained bogus position in a's name (signed by another key) for a key."""
    a, b, c = (make_daemon(n, broker) for n in "abc")
    append(a.path(KEY), ishiki_lines(10))
    wait_equal(content(a.path(KEY)), b, c)
    topic = frames.position_topic(P, "a", KEY, FILE)
    bogus = Item(Kind.POS, Announce(5, bytes(32)), KEY, FILE)
    publish(broker, topic, signed(node_identity("mallory"), "a", topic, bogus), retain=True)
    for d in (b, c):
        wait_until(lambda d=d: d.status()["rejected_frames"] >= 1, 10, f"{d.node} to refuse it")
    c.stop()
    c.start()  # handed the bogus retained position at connect: refused too
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b, c)
    for d in (a, b, c):
        wait_until(lambda d=d: d.file_status(KEY)["state"] == "in_sync", 10,
                   f"{d.node} in sync, nothing frozen")


def test_sessions_follow_epochs_not_clocks(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 3: a host that ran with its clock 10 minutes fast (its run counter says so) and
    restarts with the clock corrected is heard at once."""
    a = make_daemon("a", broker, start=False)
    b = make_daemon("b", broker)
    a.state.mkdir(parents=True, exist_ok=True)
    fast = int(time.time()) + 600
    (a.state / "epoch").write_text(f"{fast}\n")  # what the run with the fast clock left
    a.start()
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    a.stop()
    wait_until(lambda: not b.status()["peers"]["a"]["online"], 10, "b to see a offline")
    a.start()
    wait_until(lambda: b.status()["peers"]["a"]["online"], 10, "b to see a online again")
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    assert int((a.state / "epoch").read_text()) == fast + 2  # counted up, never back


def test_a_replayed_offline_presence_cannot_hide_a_live_host(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 4: an old, authentic "offline" presence re-published as retained by a client
    without any key; a peer that restarts then still sees the live host, and replicates."""
    attacker = Attacker(broker)
    try:
        a, b = make_daemon("a", broker), make_daemon("b", broker)
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b)
        a.kill()  # the broker publishes a's will: an authentic "offline"
        presence = frames.presence_topic(P, "a")
        wait_until(lambda: any(t == presence for t, _ in attacker.captured("n")), 10,
                   "the attacker to record a's will")
        wait_until(lambda: not b.status()["peers"]["a"]["online"], 10, "b to see a offline")
        a.start()
        wait_until(lambda: b.status()["peers"]["a"]["online"], 10, "b to see a back")
        old_offline = [p for t, p in attacker.captured("n") if t == presence][-1]
        publish(broker, presence, old_offline, retain=True)  # replayed, retained
        b.stop()
        b.start()
        wait_until(lambda: b.status()["peers"].get("a", {}).get("online"), 10,
                   "the restarted b to see a online despite the replay")
        append(a.path(KEY), ishiki_lines(3))
        wait_equal(content(a.path(KEY)), b)
    finally:
        attacker.close()


def test_a_compromised_hosts_bogus_position_isolates_only_that_host(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Issue #13: c is listed and its key is real (compromised); it publishes a retained
    position for a key that no copy can be consistent with. a and b refuse c, show the
    divergence with c, and keep replicating that key between themselves."""
    a, b = make_daemon("a", broker), make_daemon("b", broker)
    append(a.path(KEY), ishiki_lines(10))
    wait_equal(content(a.path(KEY)), b)
    topic = frames.position_topic(P, "c", KEY, FILE)
    bogus = Item(Kind.POS, Announce(5, bytes(32)), KEY, FILE)
    publish(broker, topic, signed(node_identity("c"), "c", topic, bogus), retain=True)
    for d in (a, b):
        f = wait_until(lambda d=d: (f := d.file_status(KEY)) and "c" in f["diverged"] and f,
                       10, f"{d.node} to show the divergence with c")
        assert f["diverged"]["c"]["offset"] == 5 and f["freeze"] is None
        assert f["mode"] == "live" and f["state"] == "diverged"
    # a's writer goes on: b takes every line, and both say so of each other.
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b)
    b.stop()
    b.start()  # handed c's bogus retained position at connect: the same again
    append(a.path(KEY), ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b)
    for d, other in ((a, "b"), (b, "a")):
        wait_until(lambda d=d, other=other: (f := d.file_status(KEY))["peers"][other]["state"]
                   == "in_sync" and f["peers"]["c"]["state"] == "diverged"
                   and f["state"] == "diverged" and f["size"] == len(content(a.path(KEY))),
                   10, f"{d.node} in sync with {other}, diverged from c")
        assert "DIVERGED from c" in d.read_log()


def captured_body(topic: str, payload: bytes, sender: str) -> frames.Payload:
    """What a captured, authentic frame says (its first item)."""
    frame = frames.decode(frames.parse_topic(P, topic), payload, sender, 1 << 20,
                          node_identity(sender).key.public_key(), topic)
    return frame.items[0].payload


def test_an_old_retained_position_replayed_with_the_hosts_login_is_refused_after_a_restart(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Issue #23, case 11: someone holding a's broker login (no key) re-publishes, as retained,
    a's authentic position and presence of an earlier run, after a's newer run was heard. b,
    restarted, is handed only those: it refuses both (it kept a's newest run in state_dir)."""
    attacker = Attacker(broker)
    try:
        a, b = make_daemon("a", broker), make_daemon("b", broker)
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b)
        old_size = len(content(a.path(KEY)))
        position = frames.position_topic(P, "a", KEY, FILE)
        presence = frames.presence_topic(P, "a")
        # Sealed (wire version 6): the login's holder cannot read which position is which;
        # it replays the last one it recorded of that run.
        wait_until(lambda: b.file_status(KEY)["peers"]["a"]["size"] == old_size, 10,
                   "b to hear a's position")
        wait_until(lambda: any(t == position for t, _ in attacker.captured("p")), 10,
                   "the attacker to record a's position")
        old_position = [p for t, p in attacker.captured("p") if t == position][-1]
        old_online = next(p for t, p in attacker.captured("n") if t == presence
                          and getattr(captured_body(t, p, "a"), "online", False))
        a.stop()
        a.start()  # a's next run
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b)
        wait_until(lambda: b.file_status(KEY)["peers"]["a"]["size"] == len(content(a.path(KEY))),
                   10, "b to hear a's new run's position")
        a.stop()
        wait_until(lambda: not b.status()["peers"]["a"]["online"], 10, "b to see a offline")
        b.stop()
        publish(broker, position, old_position, retain=True)  # replayed, retained
        publish(broker, presence, old_online, retain=True)
        b.start()
        # Both refused (the log names the first only: one line a minute per sender); the
        # position was sealed for b's earlier run: this run of b cannot even open it.
        wait_until(lambda: b.status()["rejected_frames"] >= 1
                   and b.status()["rejected_frames"] + b.status()["sealed_not_for_us"] >= 2, 10,
                   "the restarted b to refuse the old position and presence")
        assert "from an earlier run" in b.read_log()
        f = b.file_status(KEY)
        assert f["peers"].get("a", {}).get("size") != old_size
        assert b.status()["peers"].get("a", {}).get("online") is not True
        assert (b.state / "peer-epochs.json").exists()
    finally:
        attacker.close()
