"""The QoS 0 PUBLISH the link writes itself (net/pahoio.py, qos0_publish) is paho's, byte for
byte, at every length of the remaining-length field; and a message received costs the cyclic
garbage collector nothing."""

from __future__ import annotations

import gc
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from syncd.net.pahoio import BufferedClient, qos0_publish


def _paho_packet(topic: bytes, payload: bytes, retain: bool) -> bytes:
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    out: list[bytes] = []

    def queue(command: int, packet: Any, mid: int, qos: int, info: Any = None) -> Any:
        out.append(bytes(packet))
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS

    c._sock = object()  # type: ignore[assignment]  # never used: the packet is captured
    c._packet_queue = queue  # type: ignore[method-assign]
    c._send_publish(0, topic, payload, 0, retain)
    c._sock = None  # nothing to close
    return out[0]


@pytest.mark.parametrize("length", [0, 1, 100, 127 - 9, 128, 16383 - 9, 16384, 2_097_152])
@pytest.mark.parametrize("retain", [False, True])
def test_same_bytes_as_paho(length: int, retain: bool) -> None:
    topic = b"syncd/P/a/node"
    payload = bytes(i % 251 for i in range(length))
    head = len(topic).to_bytes(2, "big") + topic
    assert qos0_publish(head, payload, retain) == _paho_packet(topic, payload, retain)


def test_a_message_received_leaves_nothing_for_the_cyclic_collector() -> None:
    # paho's own per-topic lookup left a reference cycle per message (net/pahoio.py).
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    got: list[str] = []
    c.on_message = lambda _c, _u, msg: got.append(msg.topic)
    message = paho.MQTTMessage(topic=b"syncd/P/a/node")
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            c._handle_on_message(message)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert got == ["syncd/P/a/node"] * 100
    with pytest.raises(TypeError):
        c.message_callback_add("syncd/#", lambda *_: None)


class _Chunks:
    """A socket whose recv(2) returns the given chunks, then EAGAIN."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.calls = 0

    def recv(self, n: int) -> bytes:
        self.calls += 1
        if not self.chunks:
            raise BlockingIOError
        data, rest = self.chunks[0][:n], self.chunks[0][n:]
        if rest:
            self.chunks[0] = rest
        else:
            self.chunks.pop(0)
        return data

    def close(self) -> None:
        pass


def _qos1_publish(topic: bytes, payload: bytes, mid: int) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + mid.to_bytes(2, "big") + payload
    return bytes((0x32, len(body))) + body


def _received(chunks: list[bytes], fast: bool) -> tuple[list[tuple[str, bytes]], list[int]]:
    """What a client reading `chunks` hands on: (topic, payload) in order, and the mids it
    acknowledged."""
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    got: list[tuple[str, bytes]] = []
    acked: list[int] = []
    c.on_message = lambda _c, _u, msg: got.append((msg.topic, bytes(msg.payload)))
    if fast:
        c.on_qos0 = lambda topic, payload: got.append((topic, payload))
    c._send_puback = lambda mid: acked.append(mid) or paho.MQTTErrorCode.MQTT_ERR_SUCCESS  # type: ignore[method-assign,func-returns-value]
    c._sock = _Chunks(chunks)  # type: ignore[assignment]
    for _ in range(100):
        if c._packet_read() == paho.MQTTErrorCode.MQTT_ERR_AGAIN:
            break
    c._sock = None
    return got, acked


def _head(topic: bytes) -> bytes:
    return len(topic).to_bytes(2, "big") + topic


@pytest.mark.parametrize("cut", [None, 1, 2, 3, 7, 20, 200, 1000, 16390])
def test_a_qos0_publish_read_whole_is_what_paho_reads(cut: int | None) -> None:
    # Live frames skip paho's packet machinery (pahoio.BufferedClient._packet_read): the same
    # messages, in the same order, whatever the reads cut, QoS 1 among them still acked.
    stream = b"".join([
        qos0_publish(_head(b"syncd/P/a/node"), b"x" * 900, False),
        qos0_publish(_head(b"syncd/P/a/node"), b"", True),
        _qos1_publish(b"syncd/t/b/a", b"request", 7),
        qos0_publish(_head("syncd/~é".encode()), bytes(range(256)) * 64, False),
        qos0_publish(_head(b"syncd/P/a/node"), b"y" * 3, False),
    ])
    chunks = [stream] if cut is None else [stream[:cut], stream[cut:]]
    slow = _received(chunks, fast=False)
    assert len(slow[0]) == 5 and slow[1] == [7]
    assert _received(chunks, fast=True) == slow


def test_mqtt5_is_left_to_paho() -> None:
    # Its PUBLISH has properties between the topic and the payload: not read by hand.
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    fast: list[str] = []
    c.on_qos0 = lambda topic, payload: fast.append(topic)
    c._sock = _Chunks([qos0_publish(_head(b"t"), b"\x00x", False)])  # type: ignore[assignment]
    c._packet_read()
    c._sock = None
    assert fast == []


def test_a_short_read_says_the_socket_was_empty() -> None:
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    c.on_qos0 = lambda topic, payload: None
    c._sock = _Chunks([qos0_publish(_head(b"t"), b"x", False)])  # type: ignore[assignment]
    assert c._packet_read() == paho.MQTTErrorCode.MQTT_ERR_SUCCESS
    assert not c.may_hold_more() and not c.buffered()
    big = qos0_publish(_head(b"t"), b"x" * 70_000, False)
    c._sock = _Chunks([big * 2])  # type: ignore[assignment]
    c._packet_read()
    assert c.may_hold_more()  # a full read: FIONREAD must ask (net/link.py)
    c._sock = None
