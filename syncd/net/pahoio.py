"""What syncd does below paho's public API, in one place: its socket read through a buffer,
a QoS 0 PUBLISH read whole from that buffer without paho's packet machinery, no per-topic
callback matching, and a QoS 0 PUBLISH built by hand (net/link.py writes live frames with
it). All lean on paho 2.x's internals (`_sock_recv`, `_packet_read`, `_in_packet`,
`_on_message_filtered`), pinned in requirements.lock; tests/unit/test_link_publish.py checks
the packets against paho's own (written and read), and that a message handled leaves no
garbage for the cyclic collector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

# Bytes one recv(2) takes at most (below glibc's mmap threshold: no mmap per read).
READ_CHUNK = 64 << 10
MAX_PACKET = 268_435_455  # MQTT's largest remaining length


class BufferedClient(paho.Client):
    """paho's client, reading its socket through a buffer of READ_CHUNK bytes.

    paho reads a packet in three or more recv(2) calls (its first byte, the length a byte at
    a time, the rest): at 500 frames a second that was most of a standby's system calls.
    Here one recv takes what the socket holds, up to READ_CHUNK, and paho's reads are served
    from it; a read of READ_CHUNK or more with nothing buffered goes to the socket as before
    (a catch-up's large pieces are not copied twice). Errors (BlockingIOError, SSL's
    want-read) come from the socket's recv as before."""

    _rbuf = b""
    _rat = 0
    _full = True  # the last recv(2) filled what it asked for: the socket may hold more
    # (topic, payload) of a QoS 0 PUBLISH read whole from the buffer (None: paho reads all).
    on_qos0: Callable[[str, bytes], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_message_filtered = _NoTopicCallbacks()  # type: ignore[assignment]

    def _sock_recv(self, bufsize: int) -> bytes:
        at, buf = self._rat, self._rbuf
        if at < len(buf):
            out = buf[at : at + bufsize]
            self._rat = at + len(out)
            return out
        if bufsize >= READ_CHUNK:
            data = super()._sock_recv(bufsize)
            self._full = len(data) >= bufsize
            return data
        data = super()._sock_recv(READ_CHUNK)
        self._full = len(data) >= READ_CHUNK
        if len(data) <= bufsize:
            return data
        self._rbuf, self._rat = data, bufsize
        return data[:bufsize]

    def buffered(self) -> int:
        """Bytes read from the socket that paho has not taken yet."""
        return len(self._rbuf) - self._rat

    def may_hold_more(self) -> bool:
        """Whether the socket may hold bytes not read yet: the last recv(2) took all it asked
        for. A short one met the socket empty (what came since wakes the selector again), so
        FIONREAD need not ask (net/link.py)."""
        return self._full

    def _packet_read(self) -> MQTTErrorCode:
        """A QoS 0 PUBLISH (every live frame) whole in the buffer goes to `on_qos0` at once:
        paho reads a packet through a state machine of dicts and lists, a recv per field, and
        builds a message object, its topic decoded twice, for each. Anything else (QoS 1 and
        2, other packets, a packet not whole in the buffer, a topic that is no UTF-8) is
        paho's, as before."""
        deliver = self.on_qos0
        if deliver is None or self._in_packet["command"] != 0 or self._protocol == paho.MQTTv5:
            return super()._packet_read()  # (MQTT 5 puts properties between topic and payload)
        at, buf = self._rat, self._rbuf
        if at >= len(buf):
            try:
                data = paho.Client._sock_recv(self, READ_CHUNK)
            except BlockingIOError:
                return MQTTErrorCode.MQTT_ERR_AGAIN
            except OSError:
                return super()._packet_read()  # paho meets the error again, and says so
            self._full = len(data) >= READ_CHUNK
            if not data:
                return super()._packet_read()  # the end of the stream: paho's to report
            with self._msgtime_mutex:
                self._last_bytes_received = paho.time_func()
            self._rbuf, self._rat, at, buf = data, 0, 0, data
        whole = qos0_at(buf, at)
        if whole is None:
            return super()._packet_read()
        topic_at, payload_at, end = whole
        try:
            topic = buf[topic_at:payload_at].decode("utf-8")
        except UnicodeDecodeError:
            return super()._packet_read()
        self._rat = end
        deliver(topic, buf[payload_at:end])
        return MQTTErrorCode.MQTT_ERR_SUCCESS


class _NoTopicCallbacks:
    """paho's table of per-topic message callbacks, for a client that adds none (syncd routes
    every message itself, net/link.py). paho looks every message's topic up in its table, and
    its matcher's lookup is a recursive closure (a reference cycle): each message left ~10
    objects that only the cyclic collector frees, 2-3 young collections a second on a standby
    at 500 writes/s, each ~1 ms on the loop. Here the lookup finds nothing, at once."""

    def iter_match(self, topic: str) -> tuple[()]:
        return ()

    def __setitem__(self, topic: str, callback: object) -> None:
        raise TypeError("syncd's MQTT client takes no per-topic callbacks (net/pahoio.py)")

    def __delitem__(self, topic: str) -> None:
        raise KeyError(topic)


def qos0_at(buf: bytes, at: int) -> tuple[int, int, int] | None:
    """Where the topic and the payload of the QoS 0 PUBLISH at `buf[at]` start, and where it
    ends, when it is whole in `buf`; None for any other packet, or one not whole."""
    n = len(buf)
    if at >= n or buf[at] & 0xF6 != 0x30:  # PUBLISH, QoS 0 (DUP and RETAIN either way)
        return None
    size, shift, p = 0, 0, at + 1
    while True:  # the remaining length, 7 bits a byte, lowest first, 4 bytes at most
        if p >= n or shift > 21:
            return None
        byte = buf[p]
        p += 1
        size |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    end = p + size
    if size < 2 or end > n:
        return None
    topic_end = p + 2 + ((buf[p] << 8) | buf[p + 1])
    if topic_end > end:
        return None
    return p + 2, topic_end, end


def qos0_publish(head: bytes, payload: bytes, retain: bool) -> bytes:
    """An MQTT 3.1.1 PUBLISH at QoS 0: `head` is the topic's length (2 bytes) and bytes."""
    size = len(head) + len(payload)
    fixed = bytearray((0x31 if retain else 0x30,))
    while True:  # the remaining length, 7 bits a byte, lowest first
        byte, size = size & 0x7F, size >> 7
        fixed.append(byte | 0x80 if size else byte)
        if not size:
            break
    return b"".join((fixed, head, payload))
