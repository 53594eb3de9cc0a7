"""Clients on the broker that are not listed hosts: they cannot write, truncate, freeze or stall.

The daemons run for real; a raw MQTT client floods them with 10 000 seeded hostile frames
(signed with a key nobody lists, replayed, moved to other topics, malformed), and a fourth
syncd host with its own unlisted key, a copy of the log and a longer tail tries to join.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.client import topic_matches_sub
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames
from syncd.core.frames import Announce, Data, Frame, Item, Kind, Refuse, Request
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

P = "test/syncd"
ZERO = bytes(32)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class Attacker:
    """A plain MQTT client that records what it sees and publishes anything it likes."""

    def __init__(self, broker: Broker) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mallory")
        self.client.on_message = self._record
        self.client.max_inflight_messages_set(1000)
        self.client.connect("127.0.0.1", broker.port)
        self.client.subscribe(f"{P}/#", qos=1)
        self.client.loop_start()

    def _record(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.seen.append((msg.topic, bytes(msg.payload)))

    def captured(self, kind: str) -> list[tuple[str, bytes]]:
        with self._lock:
            return [(t, p) for t, p in self.seen if t.startswith(f"{P}/{kind}/")]

    def publish_all(self, messages: list[tuple[str, bytes]]) -> None:
        self.client.unsubscribe(f"{P}/#")  # stop recording: only the daemons should read these
        infos = [self.client.publish(t, p, qos=1) for t, p in messages]
        for info in infos:
            info.wait_for_publish(30)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def hostile_frames(rng: random.Random, real: list[tuple[str, bytes]],
                   n: int) -> list[tuple[str, bytes]]:
    mallory = node_identity("mallory")  # a key that no [peers] table lists
    names = [KEY, "bot-2", "..", "../../etc/passwd", ".hidden", "a b", "x" * 300, "é"]
    out = []

    def signed(topic: str, *items: Item, to: str = "", sender: str = "a") -> bytes:
        f = Frame(sender, rng.randrange(1, 1 << 40), rng.randrange(0, 1 << 20), 1, items, to)
        return frames.encode(f, mallory, topic)

    for i in range(n):
        pick = i % 8
        node = rng.choice(["a", "b", "mallory"])
        key = rng.choice(names)
        if pick == 0:  # random bytes on a valid-looking topic
            topic = rng.choice([frames.all_topic(P, node),
                                frames.position_topic(P, node, KEY, "events.jsonl")])
            out.append((topic, rng.randbytes(rng.randrange(0, 300))))
        elif pick == 1:  # a well-formed batch in a's name, another key: append garbage
            topic = frames.all_topic(P, "a")
            data = Data(rng.randrange(0, 10_000), ZERO, b'{"evil":true}\n')
            out.append((topic, signed(topic, Item(Kind.LIVE, data, KEY, "events.jsonl"))))
        elif pick == 2:  # in a's name: claim a shorter or different copy (freeze attempt)
            topic = frames.position_topic(P, "a", KEY, "events.jsonl")
            ann = Announce(rng.randrange(0, 99), ZERO)
            out.append((topic, signed(topic, Item(Kind.POS, ann, KEY, "events.jsonl"))))
        elif pick == 3:  # in a's name, or its own: refusals and requests addressed to b
            sender = rng.choice(["a", "mallory"])
            topic = frames.to_topic(P, "b", sender)
            body: frames.Payload = rng.choice([Refuse(0, ZERO), Request(0, ZERO, 0, 1 << 30)])
            kind = Kind.REFUSE if isinstance(body, Refuse) else Kind.REQ
            out.append((topic, signed(topic, Item(kind, body, KEY, "events.jsonl"), to="b",
                                      sender=sender)))
        elif pick == 4 and real:  # a real frame replayed on its own topic
            out.append(rng.choice(real))  # (a position replayed as is is accepted: no news)
        elif pick == 5 and real:  # a real frame replayed on another topic
            topic, payload = rng.choice(real)
            other = rng.choice([frames.position_topic(P, "a", "bot-2", "events.jsonl"),
                                frames.all_topic(P, "b"), frames.to_topic(P, "b", "a")])
            out.append((other if other != topic else frames.all_topic(P, "mallory"), payload))
        elif pick == 6:  # hostile names and shapes of topics
            topic = f"{P}/{rng.choice(['p', 'a', 't/b'])}/{node}/{key}/events.jsonl"
            out.append((topic, frames.PREAMBLE + rng.randbytes(80)))
        else:  # huge declared header length
            topic = frames.all_topic(P, "a")
            out.append((topic, frames.PREAMBLE + bytes(64) + b"\xff\xff\xff\xf0" + b"{}"))
    return out


def delivered_to(d: Daemon, topic: str) -> bool:
    """Whether `d` subscribes to `topic` (frames.subscriptions: presence of everyone, batches
    and positions of its peers, what is addressed to it) and does not skip it as its own."""
    subs = frames.subscriptions("test/syncd", d.node, d.peers())
    if not any(topic_matches_sub(sub, topic) for sub in subs):
        return False
    kind, *names = topic.split("/")[2:]
    sender = names[1] if kind == "t" else names[0]
    return sender != frames.level(d.node)


def test_ten_thousand_hostile_frames_change_nothing(
    tmp_path: Path, make_daemon: Callable[..., Daemon]
) -> None:
    # A queue deep enough for the whole flood, so that every frame reaches the daemons (a
    # default Mosquitto would drop most of a burst this size: that is a broker limit, and not
    # what this test is about).
    broker = Broker(tmp_path / "deep-broker", max_queued_messages=50_000)
    broker.start()
    attacker = Attacker(broker)
    try:
        a, b = (make_daemon(n, broker) for n in "ab")
        append(a.path(KEY), ishiki_lines(30))
        wait_equal(content(a.path(KEY)), b)
        append(a.path(KEY), ishiki_lines(3))  # live frames, once both know the file
        wait_equal(content(a.path(KEY)), b)
        wait_until(lambda: attacker.captured("a") and attacker.captured("p"), 10,
                   "the attacker to capture real frames")
        before = {d.node: tree(d.runtimes) for d in (a, b)}
        real = attacker.captured("a") + attacker.captured("p") + attacker.captured("t")
        flood = hostile_frames(random.Random(20261130), real, 10_000)
        real_positions = set(attacker.captured("p"))
        attacker.publish_all(flood)
        # Each daemon receives the frames on its subscriptions not sent in its own name; it
        # must reject every one of them (an empty payload is no frame: a retained message
        # being cleared, ignored).
        for d in (a, b):
            expected = sum(1 for t, p in flood
                           if p and delivered_to(d, t) and (t, p) not in real_positions)
            # A real sealed frame replayed where it was not sealed for this host (sent before
            # it was heard) is dropped unopened, counted apart from the rejections.
            wait_until(lambda d=d, n=expected: (st := d.status())["rejected_frames"]
                       + st["sealed_not_for_us"] >= n, 30,
                       f"{d.node} to reject {expected} frames")
            assert d.proc is not None and d.proc.poll() is None  # still running
            assert tree(d.runtimes) == before[d.node]  # no byte written, no file created
            assert d.file_status(KEY)["state"] == "in_sync"  # nothing frozen
            rejections = d.read_log().count("rejected frame")
            assert 1 <= rejections <= 20  # said so, at most once a minute per sender
        assert not any(p.name == "passwd" for p in Path(a.root).rglob("*"))
        # Replication goes on at full speed.
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b, timeout=5)
    finally:
        attacker.close()
        broker.stop()


def test_an_unlisted_host_with_the_log_and_a_longer_tail_cannot_get_a_byte_in(
    broker: Broker, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A fourth host with its own key that [peers] does not list: same config otherwise, a
    copy of the log and a longer tail. Nothing of it lands anywhere; the cluster goes on."""
    a, b, c = (make_daemon(n, broker) for n in "abc")
    append(a.path(KEY), ishiki_lines(20))
    wait_equal(content(a.path(KEY)), b, c)
    intruder = Daemon(tmp_path, "intruder", broker, listed=False)
    intruder.path(KEY).parent.mkdir(parents=True)
    intruder.path(KEY).write_bytes(content(a.path(KEY)) + ishiki_lines(5))  # longer tail
    intruder.start()
    try:
        for d in (a, b, c):
            wait_until(lambda d=d: d.status()["rejected_frames"] > 0, 10,
                       f"{d.node} to reject the intruder's frames")
            assert "intruder" not in d.status()["peers"]
            wait_until(lambda d=d: "a node not listed in [peers]" in d.read_log(), 10,
                       "the rejection to be logged")
        append(a.path(KEY), ishiki_lines(3))
        wait_equal(content(a.path(KEY)), b, c)  # the cluster keeps replicating
        assert content(b.path(KEY)) == content(a.path(KEY))
        assert content(intruder.path(KEY)) != content(a.path(KEY))
        for d in (a, b, c):
            wait_until(lambda d=d: d.file_status(KEY)["state"] == "in_sync", 10,
                       f"{d.node} in sync")
    finally:
        intruder.kill()


def test_refuses_to_start_with_an_identity_readable_by_others(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    d = make_daemon("a", broker, start=False)
    d.identity_file.chmod(0o644)
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(15) == 2
    log = d.read_log()
    assert "readable or writable by others (mode 0644); run: chmod 600" in log
    assert "PRIVATE KEY" not in log  # never printed
    os.chmod(d.identity_file, 0o600)


def test_symbolic_links_never_lead_out_of_runtimes_dir(
    broker: Broker, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "events.jsonl"
    secret.write_bytes(b'{"private":"do not ship"}\n')
    a, b = (make_daemon(n, broker) for n in "ab")
    (a.runtimes / "linked-key").symlink_to(outside)  # a key directory that is a link
    (b.runtimes / "linked-key").symlink_to(outside)
    a.path("linked-file").parent.mkdir()
    a.path("linked-file").symlink_to(secret)  # a file that is a link
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b)
    wait_until(lambda: "linked-key is not replicated" in a.read_log(), 10, "the refusal")
    wait_until(lambda: a.file_status("linked-file").get("state") == "error", 10,
               "the linked file to be refused")
    assert not b.path("linked-file").exists()
    assert secret.read_bytes() == b'{"private":"do not ship"}\n'
    assert "linked-key" not in {f["key"] for f in b.status()["files"]}
