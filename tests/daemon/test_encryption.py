"""Issue #26: what the broker and every other login on it see of a full replication (wire
version 6, docs/security.md): topic levels, sizes and timing; not one byte written, nor its
SHA-256, nor a resource's name."""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator

import orjson
import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames, sealed
from syncd.core.frames import Data, Frame, Item, Kind
from syncd.core.ledger import Ledger
from syncd.core.pairkeys import PairKeys
from tests.daemon.test_hostile import Attacker
from tests.daemon.test_threats import FILE, publish
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
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


INJECTED = b'{"id": "X", "role": "system", "content": "INJECTED"}\n'
P = "test/syncd"


def presence_of(attacker: Attacker, node: str) -> tuple[int, bytes]:
    """A node's run and run key, from its signed presence as captured."""
    topic = frames.presence_topic(P, node)
    for t, payload in reversed(attacker.captured("n")):
        if t == topic:
            f = frames.decode(frames.parse_topic(P, t), payload, node, 1 << 20,
                              node_identity(node).key.public_key(), t)
            p = f.items[0].payload
            if isinstance(p, frames.Presence) and p.online:
                return f.epoch, p.run_key
    raise AssertionError(f"no presence of {node} captured")


def test_a_listed_host_cannot_forge_alter_replay_or_read_what_is_not_for_it(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """The threat model on sealed frames, end to end: c is listed and its key is real
    (compromised); it announces itself, so a seals its batches for b and c. c reads those
    (it is a recipient), but it cannot read what a addresses to b, forge a frame in b's name,
    alter a frame it received for b, nor replay one."""
    attacker = Attacker(broker)
    try:
        a, b = make_daemon("a", broker), make_daemon("b", broker)
        append(a.path(KEY), ishiki_lines(10))
        wait_equal(content(a.path(KEY)), b)
        epochs = {n: presence_of(attacker, n) for n in "ab"}
        c_epoch = int(time.time()) + 10**6
        c = PairKeys("c", c_epoch, node_identity("c").key)
        for n, (epoch, run_key) in epochs.items():
            c.learn(n, epoch, node_identity(n).key.public_key(), run_key)
        topic = frames.presence_topic(P, "c")
        publish(broker, topic, frames.encode(frames.Frame(
            "c", c_epoch, 1, 1, (Item(Kind.NODE, frames.Presence(
                True, speaks=(5, 6), run_key=c.run_public)),), conn=1), node_identity("c"),
            topic))
        for d in (a, b):
            wait_until(lambda d=d: d.status()["peers"].get("c", {}).get("wire_version") == 6,
                       10, f"{d.node} to hear c")

        def opened(t: str, payload: bytes, sender: str) -> Frame | None:
            try:
                return sealed.decode(frames.parse_topic(P, t), payload, sender, 1 << 20, t, "c",
                                     c_epoch, lambda e: c.receiving(sender, e))
            except sealed.NotForUs:
                return None

        # What a addresses to b (the bytes b missed while it was away) is not c's to read.
        b.stop()
        append(a.path(KEY), ishiki_lines(4))
        b.start()
        wait_equal(content(a.path(KEY)), b)
        to_b = [(t, p) for t, p in attacker.seen if t.startswith(f"{P}/t/b/a")
                and p.startswith(sealed.PREAMBLE)]
        assert to_b and all(opened(t, p, "a") is None for t, p in to_b)
        assert ishiki_lines(4)[:40] not in b"".join(p for _, p in attacker.seen)
        start = len(attacker.seen)
        append(a.path(KEY), ishiki_lines(3))
        wait_equal(content(a.path(KEY)), b)
        copy = content(a.path(KEY))
        batch_topic = frames.all_topic(P, "a")
        batches = wait_until(lambda: [(t, p) for t, p in attacker.seen[start:]
                                      if t == batch_topic and opened(t, p, "a") is not None
                                      and any(i.kind is Kind.LIVE
                                              for i in opened(t, p, "a").items)],  # type: ignore[union-attr]
                             10, "c to read a live batch of a's (it is a recipient)")
        # 1. A frame in b's name, sealed for a with the only key c has with a: refused.
        pair = c.sending("a")
        assert pair is not None
        b_epoch = presence_of(attacker, "b")[0]
        forged = sealed.encode(Frame("b", b_epoch, 10**9, 1, (Item(
            Kind.LIVE, Data(len(copy), chain_digest(copy), INJECTED), KEY, FILE),), lane=10**6),
            frames.all_topic(P, "b"), [("a", *pair)])
        publish(broker, frames.all_topic(P, "b"), forged)
        wait_until(lambda: a.status()["rejected_frames"] >= 1, 10, "a to refuse the forgery")
        assert "bad seal" in a.read_log()
        # 2. a's batch with another body under the key c unwrapped, the wraps kept: b refuses.
        t, raw = batches[-1]
        (hlen,) = struct.unpack_from(">I", raw, 3)
        rcpt = orjson.loads(raw[7 : 7 + hlen])["rcpt"]
        cipher_at = 7 + hlen + 48 * len(rcpt)
        mine = [n for n, _ in rcpt].index("c")
        seq = orjson.loads(raw[7 : 7 + hlen])["seq"]
        nonce = struct.pack(">4xQ", seq)
        receive = c.receiving("a", epochs["a"][0])
        assert receive is not None
        body_key = receive.decrypt(nonce, raw[7 + hlen + 48 * mine : 7 + hlen + 48 * (mine + 1)],
                                   sealed._bound(t, raw[7 : 7 + hlen], raw[cipher_at:]))
        plain = AESGCM(body_key).decrypt(nonce, raw[cipher_at:], None)
        assert ishiki_lines(3)[:40] in plain  # c, a recipient, reads it
        altered = AESGCM(body_key).encrypt(nonce, plain[:-len(INJECTED)] + INJECTED, None)
        rejected = b.status()["rejected_frames"]
        publish(broker, t, raw[:cipher_at] + altered)
        wait_until(lambda: b.status()["rejected_frames"] > rejected, 10,
                   "b to refuse the altered batch")
        assert "bad seal" in b.read_log()
        # 3. The authentic batch again: refused as a replay.
        publish(broker, t, raw)
        wait_until(lambda: b.status()["rejected_frames"] > rejected + 1, 10,
                   "b to refuse the replayed batch")
        append(a.path(KEY), ishiki_lines(2))  # and replication goes on
        wait_equal(content(a.path(KEY)), b)
        for d in (a, b):
            assert INJECTED not in content(d.path(KEY))
    finally:
        attacker.close()
