"""Frames: the envelope of a batch of items, in its signed form (wire version 5); no I/O.

A frame is one MQTT message, in one of the two wire versions a host speaks (versions.py picks
the highest its recipients all speak):

- version 6 (sealed.py): sealed to its recipients; every frame but presence, unless a
  recipient still runs the release before, which speaks version 5 only;
- version 5 (here): signed, in clear; presence always (every release reads it), and every
  frame for a peer on the release before. A version-6 frame's plaintext is laid out like a
  version-5 frame after its signature.

A version-5 frame:

    b"sd\\x05" | Ed25519 signature (64) | header length (4, big-endian) | orjson header | bodies

The header names the sender, its run (`epoch`, persisted and increasing across restarts), a
sequence number, the send time (ms, informational only) and a list of items; each item is one
message about one (key, file) - a position, a piece of data, a request ... - and the bytes of
data items follow the header in item order (`n` says how many belong to each). Batching many
items into one frame pays the MQTT, signature and wake-up costs once per batch.

The signature is made with the sender's private key (identity.py) over the topic, a NUL, and
the SHA-256 of everything after the signature (signed_part): a frame cannot be forged by
another host, altered, or moved to another topic (another addressee, key or file). Receivers
verify it against the key listed for the sender in `[peers]` before looking at anything else,
then validate every field and raise FrameError with a reason fit for a log line.

Frames on P/a/<node> are numbered: `lane` counts them from 1 in each run of the sender, so a
receiver sees every frame the broker dropped on the way to it (queue overflow, a publish the
sender could not make) as a gap, and a quiet sender still sends a heartbeat (a `beat` item)
every few tenths of a second (every second once it has been quiet for a while, saying so in
the beat): what a receiver knows of the sender's copies is provably fresh
(freshness.py, PeerStreams). `ask` (addressed) asks the sender to state every position again;
it does so on P/a/<node>, ended by a beat naming the lane the restatement began with.

What a frame carries is items.py (the items, their encoding and validation); where it goes,
topics.py (topics and their levels). Their public names are importable from here too.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from syncd.core import peerjson
from syncd.core.errors import FrameError
from syncd.core.identity import SIGNATURE_SIZE, Identity, verify
from syncd.core.items import (
    MAX_DIVERGED,
    MAX_ENTRIES_BODY,
    MAX_ENTRIES_PER_ITEM,
    MAX_RESOURCE_DEPTH,
    MAX_RESOURCE_NAME,
    MAX_SPOKEN,
    RESOURCES,
    Announce,
    Ask,
    Beat,
    Data,
    Item,
    Kind,
    Payload,
    Presence,
    Probe,
    Probed,
    ProbeWhat,
    Refuse,
    Request,
    ResAsk,
    ResChunk,
    ResEntry,
    ResHave,
    ResList,
    ResRefuse,
    ResSum,
    decode_item,
    item_header,
    res_have,
    resource_name_problem,
    uint,
)
from syncd.core.topics import (
    CHANNEL_KINDS,
    LEVEL_MAX,
    Channel,
    Route,
    all_topic,
    channel_of,
    keyed_level,
    keyed_position_topic,
    level,
    name_of_level,
    own_stale_position,
    parse_topic,
    position_topic,
    presence_topic,
    subscriptions,
    to_topic,
)
from syncd.core.versions import SPEAKS

__all__ = [
    "CHANNEL_KINDS", "HEADER_START", "LEVEL_MAX", "MAX_DIVERGED", "MAX_ENTRIES_BODY",
    "MAX_ENTRIES_PER_ITEM", "MAX_HEADER", "MAX_ITEMS", "MAX_RESOURCE_DEPTH",
    "MAX_RESOURCE_NAME", "MAX_SPOKEN", "PREAMBLE", "RESOURCES", "VERSION", "Announce", "Ask",
    "Beat", "Channel", "Data", "Frame", "FrameError", "Item", "Kind", "Payload", "Presence",
    "Probe", "ProbeWhat", "Probed", "Refuse", "Request", "ResAsk", "ResChunk", "ResEntry",
    "ResHave", "ResList", "ResRefuse", "ResSum", "Route", "all_topic", "channel_of",
    "check_signature", "decode", "encode", "finish", "item_parts", "keyed_level",
    "keyed_position_topic", "level", "name_of_level", "own_stale_position",
    "parse_topic", "position_topic", "presence_topic", "res_have", "resource_name_problem",
    "routing", "signed_part", "subscriptions", "to_topic",
]

VERSION = 5
PREAMBLE = b"sd\x05"
_HEADER_LEN = struct.Struct(">I")
HEADER_START = len(PREAMBLE) + SIGNATURE_SIZE + _HEADER_LEN.size
MAX_HEADER = 1 << 20
MAX_ITEMS = 4096


@dataclass(frozen=True, slots=True)
class Frame:
    """A signed batch: who sent it, in which run, in what order and when, and its items."""

    sender: str
    epoch: int
    seq: int
    ts: int  # ms since the epoch, the sender's clock: for lag figures, never for ordering
    items: tuple[Item, ...]
    to: str = ""
    conn: int = 0  # presence only: which connection of the run it describes
    lane: int = 0  # on P/a/<node> only: its number among the run's frames there, from 1


def signed_part(topic: str, rest: bytes | memoryview) -> bytes:
    """What the signature covers: the topic and the SHA-256 of the rest of the frame.

    Ed25519 hashes its message twice (SHA-512) to sign and once to verify; over a 256 KiB
    chunk that cost 0.75 ms to sign and 0.47 ms to verify on the reference machine, against
    0.2 and 0.3 ms over its SHA-256 (hardware-accelerated where the CPU has SHA extensions)."""
    return topic.encode("utf-8", "surrogateescape") + b"\x00" + hashlib.sha256(rest).digest()


def item_parts(frame: Frame) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The items' headers and their bodies, in item order (every wire version)."""
    items = []
    bodies = []
    for item in frame.items:
        header, body = item_header(item)
        items.append(header)
        bodies.append(body)
    return items, bodies


def routing(frame: Frame) -> dict[str, Any]:
    """The header fields a frame carries only when set: addressee, connection, lane."""
    return {name: value for name, value in (("to", frame.to), ("conn", frame.conn),
                                            ("lane", frame.lane)) if value}


def encode(frame: Frame, identity: Identity, topic: str) -> bytes:
    """A version-5 frame: signed, in clear (sealed.py makes version 6)."""
    items, bodies = item_parts(frame)
    head: dict[str, Any] = {"v": VERSION, "from": frame.sender, "epoch": frame.epoch,
                            "seq": frame.seq, "ts": frame.ts, "items": items,
                            **routing(frame)}
    raw = orjson.dumps(head)
    rest = _HEADER_LEN.pack(len(raw)) + raw + b"".join(bodies)
    return b"".join((PREAMBLE, identity.sign(signed_part(topic, rest)), rest))


def check_signature(payload: bytes, topic: str, key: Ed25519PublicKey) -> None:
    """Raise FrameError unless `payload` is a version-5 frame signed by `key` for `topic`."""
    if not payload.startswith(PREAMBLE):
        if payload[:2] == PREAMBLE[:2] and len(payload) > 2:
            raise FrameError(f"protocol version {payload[2]} frame; this host speaks versions "
                             f"{' and '.join(map(str, SPEAKS))} (docs/protocol.md, "
                             "Compatibility)")
        raise FrameError("bad preamble (not a syncd frame)")
    if len(payload) < HEADER_START:
        raise FrameError("truncated frame")
    signature = payload[len(PREAMBLE) : len(PREAMBLE) + SIGNATURE_SIZE]
    rest = memoryview(payload)[len(PREAMBLE) + SIGNATURE_SIZE :]
    if not verify(key, signature, signed_part(topic, rest)):
        raise FrameError("bad signature (not signed by the key [peers] lists for the sender, "
                         "or an altered frame)")


def decode(route: Route, payload: bytes, sender: str, max_data: int,
           key: Ed25519PublicKey, topic: str) -> Frame:
    """Check the signature, then decode and validate a frame that arrived on `topic`.

    `sender` is the listed node whose level `route.sender` is; `key` its public key.
    """
    check_signature(payload, topic, key)
    start = len(PREAMBLE) + SIGNATURE_SIZE
    (hlen,) = _HEADER_LEN.unpack_from(payload, start)
    start += _HEADER_LEN.size
    if hlen > MAX_HEADER or start + hlen > len(payload):
        raise FrameError(f"bad header length {hlen}")
    try:
        head = peerjson.loads(payload[start : start + hlen])
    except orjson.JSONDecodeError:
        raise FrameError("header is not JSON") from None
    if not isinstance(head, dict):
        raise FrameError("header is not an object")
    if head.get("v") != VERSION:
        raise FrameError(f"header version {str(head.get('v'))[:20]!r}, expected {VERSION}")
    return finish(route, head, memoryview(payload)[start + hlen :], sender, max_data)


def finish(route: Route, head: dict[str, Any], body: memoryview, sender: str,
           max_data: int) -> Frame:
    """Validate an authenticated header (fields from, epoch, seq, ts, items, and to, conn,
    lane if any) and the items' bytes that follow it: the Frame they make (every version)."""
    if head.get("from") != sender:
        raise FrameError("header names another sender than the topic")
    to = head.get("to", "")
    if route.channel is Channel.TO and (not isinstance(to, str) or level(to) != route.to):
        raise FrameError("header names another addressee than the topic")
    raw_items = head.get("items")
    if not isinstance(raw_items, list) or not 0 < len(raw_items) <= MAX_ITEMS:
        raise FrameError(f"field 'items' must be a list of 1 to {MAX_ITEMS} items")
    if route.channel is not Channel.ALL and route.channel is not Channel.TO \
            and len(raw_items) != 1:
        raise FrameError("a presence or position frame holds exactly one item")
    items = []
    at = 0
    allowed = CHANNEL_KINDS[route.channel]
    for raw in raw_items:
        if not isinstance(raw, dict):
            raise FrameError("an item is not an object")
        item, used = decode_item(raw, body, at, max_data, allowed)
        at += used
        # Under a keyed level (hide_names) the names are the authenticated body's: the
        # level cannot be recomputed here, and the signature or seal binds the topic.
        if route.channel is Channel.POSITION and not route.keyed and (
                level(item.key) != route.key or level(item.file) != route.file):
            raise FrameError("position names another key or file than its topic")
        items.append(item)
    if at != len(body):
        raise FrameError(f"{len(body) - at} bytes after the last item")
    lane = uint(head, "lane", 0)
    if lane and route.channel is not Channel.ALL:
        raise FrameError("field 'lane' numbers frames on P/a only")
    return Frame(sender, uint(head, "epoch"), uint(head, "seq"), uint(head, "ts"),
                 tuple(items), to if isinstance(to, str) else "", uint(head, "conn", 0), lane)
