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
