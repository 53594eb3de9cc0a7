"""Wire version 6: frames sealed to their recipients, without any I/O.

    b"sd\\x06" | header length (4, big-endian) | orjson header | wraps (48 each) | ciphertext

The header, in clear, holds only what a recipient needs to find its key: the sender, its run
(`epoch`), the sequence number, and `rcpt`, the recipients as [node, that node's run]. The
rest of the frame (the send time, addressee, connection, lane, and every item with its key
and file names, offsets, digests and bytes) is the plaintext of the ciphertext, laid out like
a version-5 frame after its signature (frames.py).

The plaintext is encrypted once with AES-256-GCM under a body key, and that key is wrapped
for each recipient with AES-256-GCM under the pair key sender -> recipient of their two runs
(pairkeys.py), associated data = the topic, the whole clear header, and the SHA-256 of the
ciphertext. Both nonces are the sequence number, never repeated within a run (and each run
has its own keys). The body key is random, made afresh for each run of the sender and each
set of recipients (with their runs), not for each frame: only those recipients ever hold it,
which is all a per-frame key would give, and it spares both ends a key schedule per frame
(AESGCM(key) costs more than encrypting 700 bytes). So:

- a recipient learns the frame key but cannot alter the body for the others: their wraps bind
  the ciphertext's digest, and it cannot make new wraps (it lacks their pair keys with the
  sender), nor speak for another host, nor move a frame to another topic or recipient list;
- whoever is not listed (the broker, another login) learns nothing but the header's names and
  numbers and the sizes; a listed host left out of `rcpt` learns nothing either.

Presence stays a signed version-5 frame (it carries the run keys, and every release reads it).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from syncd.core import frames, peerjson
from syncd.core.frames import Frame, FrameError, Route
from syncd.core.versions import SEALED

PREAMBLE = b"sd\x06"
WRAP_SIZE = 48  # a 32-byte key and its 16-byte tag
TAG_SIZE = 16  # AES-GCM's tag after the ciphertext


def overhead(recipients: int) -> int:
    """Bytes a sealed frame adds to its plaintext beyond the clear header: one wrap per
    recipient and the body's tag (the broker's packet limit must leave room for them)."""
    return WRAP_SIZE * recipients + TAG_SIZE
MAX_RECIPIENTS = 1024  # more hosts than any cluster
MAX_NAME = 200
_LEN = struct.Struct(">I")
_NONCE = struct.Struct(">4xQ")


class NotForUs(FrameError):
    """A sealed frame this host cannot open and need not: not among its recipients, sealed
    for an earlier run of ours, or from a run of the sender whose presence is not heard yet.
    Expected around restarts and joins (the peer restates what matters): not a rejection."""


Recipient = tuple[str, int, AESGCM]  # node, its run, the pair key we wrap with
MAX_KEYS = 256  # body keys kept per end (recipient sets here; senders' keys there)


class BodyKeys:
    """The sender's body key per recipient set, or the recipient's cache of keys unwrapped
    (bounded: a peer's choice of keys cannot grow it)."""

    def __init__(self) -> None:
        self._keys: dict[Any, tuple[bytes, AESGCM]] = {}

    def for_set(self, recipients: Sequence[Recipient]) -> tuple[bytes, AESGCM]:
        which = tuple((n, e) for n, e, _ in recipients)
        held = self._keys.get(which)
        if held is None:
            if len(self._keys) >= MAX_KEYS:
                self._keys.clear()
            key = os.urandom(32)
            held = self._keys[which] = (key, AESGCM(key))
        return held

    def opener(self, key: bytes) -> AESGCM:
        held = self._keys.get(key)
        if held is None:
            if len(self._keys) >= MAX_KEYS:
                self._keys.clear()
            held = self._keys[key] = (key, AESGCM(key))
        return held[1]

    def clear(self) -> None:
        self._keys.clear()


def encode(frame: Frame, topic: str, recipients: Sequence[Recipient],
           keys: BodyKeys | None = None) -> bytes:
    """Seal `frame` for `recipients` (none: a frame nobody can open, for a lane's count);
    `keys`: the sender's body keys (None: one made for this frame)."""
    items, bodies = frames.item_parts(frame)
    inner: dict[str, Any] = {"ts": frame.ts, "items": items, **frames.routing(frame)}
    raw_inner = orjson.dumps(inner)
    plain = b"".join((_LEN.pack(len(raw_inner)), raw_inner, *bodies))
    return seal_bytes(topic, frame.sender, frame.epoch, frame.seq, plain, recipients, keys)


def seal_bytes(topic: str, sender: str, epoch: int, seq: int, plain: bytes,
               recipients: Sequence[Recipient], keys: BodyKeys | None = None) -> bytes:
    """The cryptographic layer of encode(): `plain` sealed (bench_frames times it alone)."""
    head = orjson.dumps({"v": SEALED, "from": sender, "epoch": epoch, "seq": seq,
                         "rcpt": [[n, e] for n, e, _ in recipients]})
    key, body = (keys or BodyKeys()).for_set(recipients)
    nonce = _NONCE.pack(seq)
    ciphertext = body.encrypt(nonce, plain, None)
    aad = _bound(topic, head, ciphertext)
    return b"".join((PREAMBLE, _LEN.pack(len(head)), head,
                     *(pair.encrypt(nonce, key, aad) for _, _, pair in recipients), ciphertext))


def _bound(topic: str, head: bytes, ciphertext: bytes | memoryview) -> bytes:
    return b"".join((PREAMBLE, topic.encode("utf-8", "surrogateescape"), b"\x00", head,
                     hashlib.sha256(ciphertext).digest()))


def decode(route: Route, payload: bytes, sender: str, max_data: int, topic: str, me: str,
           my_epoch: int, pair_key: Callable[[int], AESGCM | None],
           keys: BodyKeys | None = None) -> Frame:
    """Open and validate a version-6 frame that arrived on `topic` from the listed `sender`.

    `pair_key(epoch)`: the key of `sender`'s run `epoch` to us, if that run is known.
    Raises NotForUs when the frame is not for this run of ours to open, FrameError when it is
    malformed or fails authentication."""
    epoch, seq, plain = open_bytes(payload, topic, sender, me, my_epoch, pair_key, keys)
    if len(plain) < _LEN.size:
        raise FrameError("truncated plaintext")
    (ilen,) = _LEN.unpack_from(plain)
    if ilen > frames.MAX_HEADER or _LEN.size + ilen > len(plain):
        raise FrameError(f"bad inner header length {ilen}")
    try:
        inner = peerjson.loads(memoryview(plain)[_LEN.size : _LEN.size + ilen])
    except orjson.JSONDecodeError:
        raise FrameError("inner header is not JSON") from None
    if not isinstance(inner, dict):
        raise FrameError("inner header is not an object")
    inner.update({"from": sender, "epoch": epoch, "seq": seq})
    return frames.finish(route, inner, memoryview(plain)[_LEN.size + ilen :], sender, max_data)


def open_bytes(payload: bytes, topic: str, sender: str, me: str, my_epoch: int,
               pair_key: Callable[[int], AESGCM | None], keys: BodyKeys | None = None
               ) -> tuple[int, int, bytes]:
    """The cryptographic layer of decode(): (the sender's run, seq, the plaintext)."""
    if not payload.startswith(PREAMBLE):
        raise FrameError("bad preamble (not a version-6 frame)")
    start = len(PREAMBLE) + _LEN.size
    if len(payload) < start:
        raise FrameError("truncated frame")
    (hlen,) = _LEN.unpack_from(payload, len(PREAMBLE))
    if hlen > frames.MAX_HEADER or start + hlen > len(payload):
        raise FrameError(f"bad header length {hlen}")
    raw_head = payload[start : start + hlen]
    try:
        head = peerjson.loads(raw_head)
    except orjson.JSONDecodeError:
        raise FrameError("header is not JSON") from None
    if not isinstance(head, dict):
        raise FrameError("header is not an object")
    if head.get("v") != SEALED:
        raise FrameError(f"header version {str(head.get('v'))[:20]!r}, expected {SEALED}")
    if head.get("from") != sender:
        raise FrameError("header names another sender than the topic")
    epoch, seq = _count(head, "epoch"), _count(head, "seq")
    rcpt = head.get("rcpt")
    if not isinstance(rcpt, list) or len(rcpt) > MAX_RECIPIENTS:
        raise FrameError(f"field 'rcpt' must be a list of at most {MAX_RECIPIENTS} recipients")
    mine = None
    for i, r in enumerate(rcpt):
        if not (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)
                and 0 < len(r[0]) <= MAX_NAME and type(r[1]) is int and 0 <= r[1] < 2**63):
            raise FrameError("a recipient must be [node, epoch]")
        if r[0] == me:
            mine = (i, r[1])
    wraps_at = start + hlen
    cipher_at = wraps_at + WRAP_SIZE * len(rcpt)
    if cipher_at > len(payload):
        raise FrameError("truncated frame (wraps)")
    if mine is None:
        raise NotForUs("not sealed for this host")
    if mine[1] != my_epoch:
        raise NotForUs(f"sealed for run {mine[1]} of this host, this is run {my_epoch}")
    pair = pair_key(epoch)
    if pair is None:
        raise NotForUs(f"from run {epoch} of {sender}, whose presence is not heard yet")
    ciphertext = memoryview(payload)[cipher_at:]
    wrap = payload[wraps_at + WRAP_SIZE * mine[0] : wraps_at + WRAP_SIZE * (mine[0] + 1)]
    nonce = _NONCE.pack(seq)
    try:
        key = pair.decrypt(nonce, wrap, _bound(topic, raw_head, ciphertext))
        plain = (keys or BodyKeys()).opener(key).decrypt(nonce, ciphertext, None)
    except InvalidTag:
        raise FrameError("bad seal (not sealed by the sender for this host and this topic, "
                         "or altered)") from None
    return epoch, seq, plain


def decode_any(route: Route, payload: bytes, sender: str, max_data: int, topic: str,
               key: Ed25519PublicKey, me: str, my_epoch: int,
               pair_key: Callable[[int], AESGCM | None], keys: BodyKeys | None = None) -> Frame:
    """A frame of either version this release speaks, by its preamble."""
    if payload.startswith(PREAMBLE):
        return decode(route, payload, sender, max_data, topic, me, my_epoch, pair_key, keys)
    return frames.decode(route, payload, sender, max_data, key, topic)


def version_of(payload: bytes) -> int:
    """The wire version a payload claims (0: not a syncd frame)."""
    return payload[2] if len(payload) > 2 and payload[:2] == b"sd" else 0


def _count(head: dict[str, Any], name: str) -> int:
    value = head.get(name)
    if type(value) is not int or not 0 <= value < 2**63:
        raise FrameError(f"field {name!r} must be a non-negative integer")
    return value
