"""A listed host gone bad: a raw MQTT client that signs well-formed frames with a listed key.

It holds the real private key of one node of [peers] (x by default, which every test config
lists), so the victims verify its frames and judge them on their contents alone: the bounds
and budgets (docs/peer-limits.md) are what stops it, not the signature. It also records what
the victims send it, to count bytes on the broker side.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter

import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames
from syncd.core.frames import Frame, Item
from tests.support.cluster import Broker, node_identity, wait_until

P = "test/syncd"
ANSWERS = {"fill", "probed", "rhave", "rdata", "rrefuse", "refuse"}


class HostilePeer:
    def __init__(self, broker: Broker, node: str = "x", prefix: str = P) -> None:
        self.node = node
        self.prefix = prefix
        self.identity = node_identity(node)
        # A run far ahead of any real one and a fresh counter: only the contents can stop it.
        self.epoch = int(time.time()) + 10**7
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self.received: Counter[str] = Counter()  # sender level -> payload bytes sent to us
        # sender level -> bytes of its answers to our requests (fills, probe answers, whole
        # manifests, resource chunks, refusals), each item's body and ~150 bytes of header:
        # what its budget for us bounds (its own requests to us are not answers).
        self.answers: Counter[str] = Counter()
        self.frames_received: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()  # item kinds sent to us (decoded loosely)
        # Resource files the victims' manifests name: (key, name) -> (sha256 hex, size)
        self.resources: dict[tuple[str, str], tuple[str, int]] = {}
        self.secrets: list[bytes] = []  # bytes that must never reach us (canaries, keys)
        self.leaks: Counter[str] = Counter()  # sender level -> frames holding a secret
        self._infos: list[mqtt.MQTTMessageInfo] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2,
                                  client_id=f"hostile-{node}-{time.monotonic_ns()}")
        self.client.on_message = self._record
        self.client.max_inflight_messages_set(200)
        self.client.max_queued_messages_set(0)
        self.client.connect("127.0.0.1", broker.port)
        self.client.subscribe(f"{prefix}/t/{frames.level(node)}/+", qos=1)
        self.client.loop_start()

    def _record(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        sender = msg.topic.rsplit("/", 1)[-1]
        payload = bytes(msg.payload)
        with self._lock:
            self.received[sender] += len(payload)
            self.frames_received[sender] += 1
            if any(secret in payload for secret in self.secrets):
                self.leaks[sender] += 1
            try:  # the header, unverified: which kinds came back, which files were named
                start = frames.HEADER_START
                hlen = int.from_bytes(payload[start - 4:start], "big")
                head = orjson.loads(payload[start:start + hlen])
                at = start + hlen
                for raw in head.get("items", []):
                    self.kinds[raw.get("k", "?")] += 1
                    n = raw.get("n", 0)
                    if raw.get("k") in ANSWERS:
                        self.answers[sender] += n + 150
                    if raw.get("k") == "rhave" and len(self.resources) < 10_000:
                        for e in orjson.loads(payload[at:at + n]):
                            self.resources[(raw["key"], e[0])] = (e[2], e[1])
                    at += n
            except Exception:
                pass

    def bytes_from(self, victim: str) -> int:
        with self._lock:
            return self.received[frames.level(victim)]

    def answers_from(self, victim: str) -> int:
        with self._lock:
            return self.answers[frames.level(victim)]

    def kinds_seen(self) -> Counter[str]:
        with self._lock:
            return Counter(self.kinds)

    # --- sending -----------------------------------------------------------------------------

    def seal(self, topic: str, items: tuple[Item, ...], to: str = "") -> bytes:
        f = Frame(self.node, self.epoch, next(self._seq), int(time.time() * 1000), items, to)
        return frames.encode(f, self.identity, topic)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        self._infos.append(info)

    def to(self, victim: str, *items: Item) -> None:
        """Items addressed to `victim` (requests, probes, whole manifests...)."""
        topic = frames.to_topic(self.prefix, victim, self.node)
        self.publish(topic, self.seal(topic, items, to=victim))

    def batch(self, *items: Item) -> None:
        """Items for everyone (live bytes, positions, resource summaries)."""
        topic = frames.all_topic(self.prefix, self.node)
        self.publish(topic, self.seal(topic, items))

    def position(self, item: Item, retain: bool = False) -> None:
        topic = frames.position_topic(self.prefix, self.node, item.key, item.file)
        self.publish(topic, self.seal(topic, (item,)), retain=retain)

    def flush(self, timeout: float = 60) -> None:
        """Wait until the broker has acknowledged everything published so far."""
        infos, self._infos = self._infos, []
        deadline = time.monotonic() + timeout
        for info in infos:
            info.wait_for_publish(max(0.1, deadline - time.monotonic()))

    def wait_quiet(self, victim: str, quiet: float = 1.0, timeout: float = 60) -> int:
        """Wait until `victim` has sent us nothing new for `quiet` seconds; its bytes so far."""
        last = [self.bytes_from(victim), time.monotonic()]

        def settled() -> bool:
            now = self.bytes_from(victim)
            if now != last[0]:
                last[0], last[1] = now, time.monotonic()
            return time.monotonic() - last[1] >= quiet

        wait_until(settled, timeout, f"{victim} to stop sending", interval=0.1)
        return int(last[0])

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc/<pid>/status."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]
