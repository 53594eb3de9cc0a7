"""A client on the broker without the cluster secret: it cannot write, truncate, freeze or stall.

The daemons run for real; a raw MQTT client floods them with 10 000 seeded hostile frames.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from syncd import frames
from syncd.frames import Announce, Data, Refuse, Request, Stamp
from tests.cluster import Broker, Daemon, wait_until
from tests.conftest import ishiki_lines
from tests.test_replication import KEY, append, content, wait_equal

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
    wrong = b"not the cluster secret, but long"
    stamp = Stamp("feedfacecafebeef", 1, 1)
    names = [KEY, "bot-2", "..", "../../etc/passwd", ".hidden", "a b", "x" * 300, "é"]
    out = []
    for i in range(n):
        pick = i % 8
        node = rng.choice(["a", "b", "mallory"])
        key = rng.choice(names)
        if pick == 0:  # random bytes on a valid-looking topic
            topic = f"{P}/{rng.choice(['pos', 'live'])}/{node}/{KEY}/events.jsonl"
            out.append((topic, rng.randbytes(rng.randrange(0, 300))))
        elif pick == 1:  # a well-formed frame with the wrong secret: append garbage
            topic = f"{P}/live/a/{KEY}/events.jsonl"
            data = Data(rng.randrange(0, 10_000), ZERO, b'{"evil":true}\n')
            out.append((topic, frames.encode(data, stamp, wrong, topic)))
        elif pick == 2:  # wrong secret: claim a shorter or different copy (freeze attempt)
            topic = f"{P}/pos/a/{KEY}/events.jsonl"
            out.append((topic, frames.encode(Announce(rng.randrange(0, 99), ZERO), stamp,
                                             wrong, topic)))
        elif pick == 3:  # wrong secret: refusals and requests addressed to b
            topic = f"{P}/{rng.choice(['refuse', 'req'])}/b/a/{KEY}/events.jsonl"
            body = Refuse(0, ZERO) if "refuse" in topic else Request(0, ZERO, 0, 1 << 30)
            out.append((topic, frames.encode(body, stamp, wrong, topic)))
        elif pick == 4 and real:  # a real frame replayed on its own topic
            out.append(rng.choice(real))  # (a position replayed as is is accepted: no news)
        elif pick == 5 and real:  # a real frame replayed for another key, file or sender
            topic, payload = rng.choice(real)
            parts = topic.split("/")
            parts[-2] = rng.choice(["bot-2", "other"])
            out.append(("/".join(parts), payload))
        elif pick == 6:  # hostile names and shapes of topics
            topic = f"{P}/{rng.choice(['pos', 'live', 'fill/b'])}/{node}/{key}/events.jsonl"
            out.append((topic, frames.PREAMBLE + rng.randbytes(40)))
        else:  # huge declared header length
            topic = f"{P}/live/a/{KEY}/events.jsonl"
            out.append((topic, frames.PREAMBLE + bytes(32) + b"\xff\xff\xff\xf0" + b"{}"))
    return out


def delivered_to(node: str, topic: str) -> bool:
    """Whether `node` subscribes to `topic` and does not skip it as its own echo."""
    levels = topic.split("/")[2:]
    kind, names = levels[0], levels[1:]
    if kind in ("req", "fill", "refuse", "probe", "probed"):
        return len(names) >= 2 and names[0] == node and names[1] != node
    return len(names) >= 1 and names[0] != node


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
        wait_until(lambda: attacker.captured("live") and attacker.captured("pos"), 10,
                   "the attacker to capture real frames")
        before = {d.node: tree(d.runtimes) for d in (a, b)}
        real = attacker.captured("live") + attacker.captured("pos") + attacker.captured("req")
        flood = hostile_frames(random.Random(20261130), real, 10_000)
        real_positions = set(attacker.captured("pos"))
        attacker.publish_all(flood)
        # Each daemon receives the frames not sent in its own name and not addressed to the
        # other one; it must reject every one of them.
        for d in (a, b):
            expected = sum(1 for t, p in flood
                           if delivered_to(d.node, t) and (t, p) not in real_positions)
            wait_until(lambda d=d, n=expected: d.status()["rejected_frames"] >= n, 30,
                       f"{d.node} to reject {expected} frames")
            assert d.proc is not None and d.proc.poll() is None  # still running
            assert tree(d.runtimes) == before[d.node]  # no byte written, no file created
            assert d.file_status(KEY)["state"] == "in_sync"  # nothing frozen
            rejections = d.read_log().count("rejected frame")
            assert 1 <= rejections <= 20  # said so, without flooding the log
        assert not any(p.name == "passwd" for p in Path(a.root).rglob("*"))
        # Replication goes on at full speed.
        append(a.path(KEY), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b, timeout=5)
    finally:
        attacker.close()
        broker.stop()


def test_a_node_with_another_secret_cannot_join(
    broker: Broker, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    a = make_daemon("a", broker)
    intruder = Daemon(tmp_path / "elsewhere", "x", broker,
                      secret="a different secret of enough length\n")
    intruder.start()
    try:
        append(intruder.path(KEY), ishiki_lines(3))
        append(a.path(KEY), ishiki_lines(2))
        wait_until(lambda: a.status()["rejected_frames"] > 0, 10, "a to reject x's frames")
        wait_until(lambda: intruder.status()["rejected_frames"] > 0, 10, "x to reject a's")
        assert "x" not in a.status()["peers"]
        assert content(a.path(KEY)) != content(intruder.path(KEY))
    finally:
        intruder.kill()


def test_refuses_to_start_with_a_secret_readable_by_others(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    d = make_daemon("a", broker, start=False)
    d.secret.chmod(0o644)
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(15) == 2
    log = d.read_log()
    assert "readable or writable by others (mode 0644); run: chmod 600" in log
    assert d.secret.read_text().strip() not in log  # never printed
    os.chmod(d.secret, 0o600)


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
