"""Issue #26: what the broker and every other login on it see of a full replication (wire
version 6, docs/security.md): topic levels, sizes and timing; not one byte written, nor its
SHA-256, nor a resource's name."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames
from syncd.core.frames import Kind
from syncd.core.ledger import Ledger
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import KEY, append, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines
from tests.support.ishiki_writer import put_artifact, shake_line


class Sniffer:
    """A login of its own on the broker, subscribed to everything (`#`)."""

    def __init__(self, broker: Broker) -> None:
        self.payloads: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="eve-sniffer")
        self.client.username_pw_set("eve")
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe("#", qos=1)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.payloads.append((msg.topic, bytes(msg.payload)))

    def seen(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.payloads)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def sniffer(broker: Broker) -> Iterator[Sniffer]:
    s = Sniffer(broker)
    wait_until(lambda: s.client.is_connected(), 10, "the sniffer to connect")
    yield s
    s.close()


def secrets_of(*texts: bytes) -> list[bytes]:
    """Each text, and its SHA-256 raw and in hex (lower and upper case)."""
    out = []
    for t in texts:
        h = hashlib.sha256(t).digest()
        out += [t, h, h.hex().encode(), h.hex().upper().encode()]
    return out


def chain_digest(data: bytes) -> bytes:
    ledger = Ledger()
    ledger.extend(data)
    return ledger.digest()


def test_nothing_written_reaches_the_broker_in_clear(
    broker: Broker, make_daemon: Callable[..., Daemon], sniffer: Sniffer
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    inst = a.runtimes / KEY
    log = a.path(KEY)
    lines = ishiki_lines(30)
    append(log, lines)
    blob = os.urandom(300_000)  # more than one chunk (chunk_bytes 256 KiB)
    ref = put_artifact(inst, "shake", "secret-report.log", blob)
    tail = shake_line("s1", ref)
    append(log, tail)
    wait_equal(log.read_bytes(), b, c)
    artifact = inst / "resources" / "artifacts" / "shake" / "secret-report.log"
    for d in (b, c):
        wait_until(lambda d=d: (d.runtimes / KEY / artifact.relative_to(inst)).exists()
                   and (d.runtimes / KEY / artifact.relative_to(inst)).read_bytes() == blob,
                   30, f"the artifact on {d.node}")
    replicated = log.read_bytes()
    # A divergence: a's copy rewritten in place (one line dropped); the hosts probe each
    # other's copies to locate the fork, with chain values and bytes.
    kept = replicated.splitlines(keepends=True)
    edited = b"".join(kept[:5] + kept[6:])
    log.write_bytes(edited)
    for d in (a, b, c):
        wait_state(d, "diverged", timeout=30)
    wait_until(lambda: b.file_status(KEY)["diverged"].get("a", {}).get("line"), 20,
               "b to locate the fork")
    time.sleep(0.5)  # what is in flight reaches the sniffer too (its subscription is 1 hop)
    seen = sniffer.seen()
    assert len(seen) > 50, "the sniffer heard the replication"
    assert any(t.startswith("test/syncd/a/") for t, _ in seen)
    secrets = secrets_of(replicated, edited, blob, tail,
                         *replicated.splitlines(keepends=True),
                         *(blob[i : i + 32] for i in range(0, len(blob), 50_000)))
    secrets += [chain_digest(replicated), chain_digest(replicated).hex().encode(),
                chain_digest(edited).hex().encode(), b"secret-report", b"resources/artifacts"]
    leaks = [(topic, s[:40]) for topic, p in seen for s in secrets if s in p]
    assert not leaks, f"{len(leaks)} leaks, first: {leaks[:3]}"
    # What travels in clear (signed, version 5) is the presence, with its versions and run
    # key, and the asks a host sends at connect to peers whose presence it has not heard yet
    # (their versions unknown): they say nothing of any file.
    clear = [(t, p) for t, p in seen if p.startswith(b"sd\x05")]
    assert {t for t, _ in clear if t.startswith("test/syncd/n/")} == {
        f"test/syncd/n/{n}" for n in "abc"}
    for topic, payload in clear:
        if not topic.startswith("test/syncd/n/"):
            sender = topic.rsplit("/", 1)[1]
            frame = frames.decode(frames.parse_topic("test/syncd", topic), payload, sender,
                                  1 << 20, node_identity(sender).key.public_key(), topic)
            assert {i.kind for i in frame.items} == {Kind.ASK}, (topic, frame)
    for d in (a, b, c):
        peers = d.status()["peers"]
        assert all(p["wire_version"] == 6 and p["speaks"] == [5, 6]
                   for n, p in peers.items() if p["online"]), peers
