"""What syncd does below paho's public API, in one place: its socket read through a buffer,
no per-topic callback matching, and a QoS 0 PUBLISH built by hand (net/link.py writes live
frames with it). All lean on paho 2.x's internals (`_sock_recv`, `_on_message_filtered`),
pinned in requirements.lock; tests/unit/test_link_publish.py checks the packet against paho's
own, and that a message handled leaves no garbage for the cyclic collector."""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as paho

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
            return super()._sock_recv(bufsize)
        data = super()._sock_recv(READ_CHUNK)
        if len(data) <= bufsize:
            return data
        self._rbuf, self._rat = data, bufsize
        return data[:bufsize]

    def buffered(self) -> int:
        """Bytes read from the socket that paho has not taken yet."""
        return len(self._rbuf) - self._rat


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
