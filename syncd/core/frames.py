"""The wire format: topics, items, and signed frames (protocol version 5), without any I/O.

Version 6 (sealed.py) carries the same items, encrypted for each recipient; presence is
always a version-5 frame. Which version each frame goes out in: versions.py.

Topic layout under the configured prefix P; every level after P is `level(name)`, an encoding
of a node id, an instance key or a file name (see below):

    P/n/<node>                  retained presence; "offline" is the connection's will
    P/p/<node>/<key>/<file>     retained position of <node>'s copy of one file (size + digest)
    P/a/<node>                  a batch for everyone: the bytes <node> just got, of any files
    P/t/<to>/<node>             a batch for <to> only: requests, answers, refusals, probes

Frames on P/a/<node> are numbered: `lane` counts them from 1 in each run of the sender, so a
receiver sees every frame the broker dropped on the way to it (queue overflow, a publish the
sender could not make) as a gap, and a quiet sender still sends a heartbeat (a `beat` item)
every few tenths of a second (every second once it has been quiet for a while, saying so in
the beat): what a receiver knows of the sender's copies is provably fresh
(freshness.py, PeerStreams). `ask` (addressed) asks the sender to state every position again;
it does so on P/a/<node>, ended by a beat naming the lane the restatement began with.

A frame is one MQTT message:

    b"sd\\x05" | Ed25519 signature (64) | header length (4, big-endian) | orjson header | bodies

The header names the sender, its run (`epoch`, persisted and increasing across restarts), a
sequence number, the send time (ms, informational only) and a list of items; each item is one
message about one (key, file) - a position, a piece of data, a request ... - and the bytes of
data items follow the header in item order (`n` says how many belong to each). Batching many
items into one frame pays the MQTT, signature and wake-up costs once per batch.

The signature is made with the sender's private key (identity.py) over the topic, a NUL, and
everything after the signature: a frame cannot be forged by another host, altered, or moved to
another topic (another addressee, key or file). Receivers verify it against the key listed for
the sender in `[peers]` before looking at anything else, then validate every field and raise
FrameError with a reason fit for a log line.

Topic levels: MQTT gives `+`, `#` and `/` meanings, NATS refuses `.` and spaces, and brokers
cap topic lengths, while instance keys hold any character a directory name can (and `/` between
nesting levels). So a name made only of ASCII letters, digits, `_` and `-` (host-a, main) is
its own level, readable in broker logs and usable in an ACL's `%u`; any other name is `~` and
the unpadded lower-case base32 of its UTF-8 bytes (safe on every broker), and a name whose
level would exceed LEVEL_MAX characters is `~~` and 32 hex digits of its SHA-256. The three
forms cannot collide, `name_of_level` reverses the first two, and either way the real names
travel in the signed header: the receiver checks that the topic's levels are theirs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from syncd.core.errors import SyncdError
from syncd.core.identity import SIGNATURE_SIZE, Identity, verify
from syncd.core.ledger import DIGEST_SIZE
from syncd.core.names import file_problem, key_problem, part_problem, printable
from syncd.core.versions import SPEAKS

VERSION = 5
PREAMBLE = b"sd\x05"
_HEADER_LEN = struct.Struct(">I")
HEADER_START = len(PREAMBLE) + SIGNATURE_SIZE + _HEADER_LEN.size
MAX_HEADER = 1 << 20
MAX_ITEMS = 4096
MAX_DIVERGED = 1024  # peers one announcement may name as diverged (more hosts than any cluster)
LEVEL_MAX = 100
MAX_SPOKEN = 16  # wire versions one presence may list


class FrameError(SyncdError, ValueError):
    """A topic or payload that is not a valid syncd frame."""


class Kind(Enum):
    """What one item says."""

    NODE = "node"
    POS = "pos"
    LIVE = "live"
    REQ = "req"
    FILL = "fill"
    REFUSE = "refuse"
    PROBE = "probe"
    PROBED = "probed"
    # An instance's resources/ files (resources.py); key = the instance, file = RESOURCES.
    RSUM = "rsum"
    RLIST = "rlist"
    RHAVE = "rhave"
    RREQ = "rreq"
    RDATA = "rdata"
    RREFUSE = "rrefuse"
    # A node's stream (no key or file): a heartbeat or the end of a restatement, on P/a; a
    # request for a restatement, addressed.
    BEAT = "beat"
    ASK = "ask"


class Channel(Enum):
    """Which topic a frame travels on (the first level after the prefix)."""

    PRESENCE = "n"
    POSITION = "p"
    ALL = "a"
    TO = "t"


_ADDRESSED = {Kind.REQ, Kind.FILL, Kind.REFUSE, Kind.PROBE, Kind.PROBED,
              Kind.RLIST, Kind.RHAVE, Kind.RREQ, Kind.RDATA, Kind.RREFUSE, Kind.ASK}
_NODE_KINDS = {Kind.NODE, Kind.BEAT, Kind.ASK}  # about the sender: no key, no file
_WITH_BODY = {Kind.LIVE, Kind.FILL, Kind.PROBED, Kind.RHAVE, Kind.RDATA}
_CHANNEL_KINDS = {
    Channel.PRESENCE: {Kind.NODE},
    Channel.POSITION: {Kind.POS},
    # A manifest's summary, and the entries a host just got, go to everyone; a full
    # manifest (RHAVE) goes to the host that asked for it.
    Channel.ALL: {Kind.LIVE, Kind.POS, Kind.RSUM, Kind.RHAVE, Kind.BEAT},
    Channel.TO: _ADDRESSED,
}
RESOURCES = "resources"  # the `file` of every resource item: the instance's resources/ tree
MAX_RESOURCE_NAME = 1024
# Levels of a resource name at most: the largest [resources] max_depth (config.py), which is
# what a host walks and accepts from peers (resources.py): a level is a directory to create.
MAX_RESOURCE_DEPTH = 256
# One manifest item: at most MAX_ENTRIES_PER_ITEM entries (2000 are sent) in MAX_ENTRIES_BODY
# bytes. Decoding costs ~1.8 KB of memory per entry for a moment: the JSON values are counted
# (by their commas) before it is parsed, so that no body of tiny values costs more.
MAX_ENTRIES_PER_ITEM = 4096
MAX_ENTRIES_BODY = 2 << 20


def channel_of(kind: Kind, to: str = "") -> Channel:
    if kind is Kind.NODE:
        return Channel.PRESENCE
    if kind is Kind.POS:
        return Channel.POSITION
    if kind in (Kind.RSUM, Kind.RHAVE, Kind.BEAT) and not to:
        return Channel.ALL
    if kind in _ADDRESSED:
        if not to:
            raise ValueError(f"a {kind.value} item needs an addressee")
        return Channel.TO
    return Channel.ALL


# --- topic levels --------------------------------------------------------------------------


_PLAIN = re.compile(rf"[A-Za-z0-9_-]{{1,{LEVEL_MAX}}}")


def level(name: str) -> str:
    """The topic level that stands for `name` (see the module docstring)."""
    if _PLAIN.fullmatch(name):
        return name
    raw = name.encode("utf-8", "surrogateescape")
    text = "~" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()
    if len(text) <= LEVEL_MAX:
        return text
    return "~~" + hashlib.sha256(raw).hexdigest()[:32]


def name_of_level(text: str) -> str | None:
    """The name a level stands for; None for a hashed level (or one that is not a level)."""
    if _PLAIN.fullmatch(text):
        return text
    if not text.startswith("~") or text.startswith("~~"):
        return None
    body = text[1:].upper()
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8))
    except (binascii.Error, ValueError):
        return None
    return raw.decode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class Route:
    """What a topic says: the channel and the (encoded) levels after it."""

    channel: Channel
    sender: str  # a level
    to: str = ""  # a level, for Channel.TO
    key: str = ""  # a level, for Channel.POSITION
    file: str = ""  # a level, for Channel.POSITION


def presence_topic(prefix: str, node: str) -> str:
    return f"{prefix}/n/{level(node)}"


def position_topic(prefix: str, node: str, key: str, file: str) -> str:
    return f"{prefix}/p/{level(node)}/{level(key)}/{level(file)}"


def all_topic(prefix: str, node: str) -> str:
    return f"{prefix}/a/{level(node)}"


def to_topic(prefix: str, to: str, node: str) -> str:
    return f"{prefix}/t/{level(to)}/{level(node)}"


def subscriptions(prefix: str, node: str, peers: Iterable[str]) -> list[str]:
    """What `node` listens to: everyone's presence (a host missing from [peers] shows up as
    refused, once per connection), what is addressed to it, and the batches and positions of
    each listed peer. Not `a/+` or `p/+/+/+`: the broker would send every batch of ours
    back to us, a read and a parse per frame for nothing (a writer's largest MQTT cost)."""
    topics = [f"{prefix}/n/+", f"{prefix}/t/{level(node)}/+"]
    for peer in sorted(set(peers) - {node}):
        topics += [f"{prefix}/a/{level(peer)}", f"{prefix}/p/{level(peer)}/+/+"]
    return topics


_LEVELS = {Channel.PRESENCE: 1, Channel.POSITION: 3, Channel.ALL: 1, Channel.TO: 2}


def parse_topic(prefix: str, topic: str) -> Route:
    if not topic.startswith(prefix + "/"):
        raise FrameError(f"topic outside prefix: {topic[:200]!r}")
    parts = topic[len(prefix) + 1 :].split("/")
    try:
        channel = Channel(parts[0])
    except ValueError:
        raise FrameError(f"unknown topic kind {parts[0][:50]!r} (another protocol version?)"
                         ) from None
    levels = parts[1:]
    if len(levels) != _LEVELS[channel]:
        raise FrameError(f"{channel.name.lower()} topic needs {_LEVELS[channel]} levels, "
                         f"got {len(levels)}")
    if not all(0 < len(x) <= LEVEL_MAX for x in levels):
        raise FrameError("empty or overlong topic level")
    if channel is Channel.TO:
        return Route(channel, levels[1], to=levels[0])
    if channel is Channel.POSITION:
        return Route(channel, levels[0], key=levels[1], file=levels[2])
    return Route(channel, levels[0])


# --- payloads ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Presence:
    """A node's presence; `retired` is the notice `syncd forget` leaves in its place."""

    online: bool
    retired: bool = False
    # Version 6 on: the wire versions the host speaks (absent: 5 only, versions.py) and its
    # run's X25519 key (pairkeys.py), in the signed presence that a version-5 host reads too.
    speaks: tuple[int, ...] = ()
    run_key: bytes = b""


@dataclass(frozen=True, slots=True)
class Announce:
    """A host's position for one file; `frozen` names why it stopped replicating, if it did
    (a local reason: reset, a write on a replica, or "adopting"); `diverged` names the peers
    whose copies differ from this one inside the common prefix. A divergence isolates that
    peer only, so it is said here, per peer, not as a freeze: the peer learns that we know."""

    size: int
    digest: bytes
    frozen: str | None = None
    answers: int = 0  # the `ask` of an adopting peer's request this announcement answers
    diverged: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Data:
    """Bytes [offset, offset + len(data)) of a copy whose prefix up to offset has digest `base`."""

    offset: int
    base: bytes
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True)
class Request:
    """'I hold `have` bytes with digest `digest`; send me [start, start + length).'

    `force` asks a frozen copy to answer anyway: an operator adopting that copy (serving bytes
    never changes the server's copy, so this is safe).
    """

    have: int
    digest: bytes
    start: int
    length: int
    force: bool = False
    ask: int = 0  # with force: echoed in the position announced in reply (Announce.answers)


@dataclass(frozen=True, slots=True)
class Refuse:
    """'My prefix of length `offset` has digest `digest`, not the one you claimed.'"""

    offset: int
    digest: bytes


class ProbeWhat(Enum):
    SUMS = "sums"  # chain values of blocks [start, start + count)
    BYTES = "bytes"  # bytes [start, start + count)


@dataclass(frozen=True, slots=True)
class Probe:
    what: ProbeWhat
    start: int
    count: int


@dataclass(frozen=True, slots=True)
class Probed:
    """Answer to a Probe: chain values (32 bytes each) or bytes, and the answerer's size."""

    what: ProbeWhat
    start: int
    size: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ResEntry:
    """One complete file of a manifest: its name under resources/, size, SHA-256, and for a
    replaced file (a sidecar) its version (stamp, origin): a Lamport count and the host
    whose local write made it (0 and "" for a write-once file)."""

    name: str
    size: int
    digest: bytes
    stamp: int = 0
    origin: str = ""


@dataclass(frozen=True, slots=True)
class ResSum:
    """'My manifest of this instance's resources has `count` entries and digest `digest`.'"""

    digest: bytes
    count: int


@dataclass(frozen=True, slots=True)
class ResList:
    """'Send me your whole manifest (I heard digest `digest`).'"""

    digest: bytes


@dataclass(frozen=True, slots=True)
class ResHave:
    """Manifest entries: what changed, or (`full`, addressed) part `part` of the `parts` that
    make up the whole manifest, which replaces what the receiver knew of the sender's."""

    full: bool
    entries: tuple[ResEntry, ...]
    data: bytes = b""  # the encoded entries (the item's body), made by res_have()
    part: int = 0
    parts: int = 1


def res_have(full: bool, entries: tuple[ResEntry, ...], part: int = 0,
             parts: int = 1) -> ResHave:
    body = orjson.dumps([[e.name, e.size, e.digest.hex(), e.stamp, e.origin] for e in entries])
    return ResHave(full, entries, body, part, parts)


@dataclass(frozen=True, slots=True)
class ResAsk:
    """'Send me bytes [offset, offset + length) of `name`, the version with digest `digest`.'"""

    name: str
    digest: bytes
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ResChunk:
    """Bytes of `name` (the version with digest `digest`, `size` bytes in all) at `offset`."""

    name: str
    digest: bytes
    size: int
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ResRefuse:
    """'I do not serve `name` with digest `digest`': `held` is the digest of what I hold
    under that name (absent: nothing), `reason` says why in words."""

    name: str
    digest: bytes
    held: bytes | None
    reason: str


@dataclass(frozen=True, slots=True)
class Beat:
    """'My stream goes on, my next frame on P/a comes within `every_ms`' (0: the default,
    freshness.BEAT_INTERVAL); and, with `restated_from`, 'every position of mine was stated
    again in my frames on P/a from that lane up to this one' (an answer to an Ask)."""

    restated_from: int = 0
    every_ms: int = 0


@dataclass(frozen=True, slots=True)
class Ask:
    """'What I know of your positions may be stale: state them all again.'"""


Payload = (Presence | Announce | Data | Request | Refuse | Probe | Probed | ResSum | ResList
           | ResHave | ResAsk | ResChunk | ResRefuse | Beat | Ask)


@dataclass(frozen=True, slots=True)
class Item:
    """One message about one file (key and file are empty for presence)."""

    kind: Kind
    payload: Payload
    key: str = ""
    file: str = ""

    @property
    def size(self) -> int:
        """Roughly what it adds to a frame (for batch limits)."""
        body = getattr(self.payload, "data", b"")
        return 160 + len(self.key) + len(self.file) + len(body)


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


def _item_header(item: Item) -> tuple[dict[str, Any], bytes]:
    body = b""
    header: dict[str, Any]
    match item.payload:
        case Presence(online, retired, speaks, run_key):
            header = {"online": online}
            if retired:
                header["retired"] = True
            if speaks:
                header["speaks"] = list(speaks)
            if run_key:
                header["x"] = run_key.hex()
        case Announce(size, digest, frozen, answers, diverged):
            header = {"size": size, "digest": digest.hex(), "frozen": frozen}
            if answers:
                header["answers"] = answers
            if diverged:
                header["diverged"] = list(diverged)
        case Data(offset, base, data):
            header = {"offset": offset, "base": base.hex()}
            body = data
        case Request(have, digest, start, length, force, ask):
            header = {"have": have, "digest": digest.hex(), "start": start, "length": length,
                      "force": force}
            if ask:
                header["ask"] = ask
        case Refuse(offset, digest):
            header = {"offset": offset, "digest": digest.hex()}
        case Probe(what, start, count):
            header = {"what": what.value, "start": start, "count": count}
        case Probed(what, start, size, data):
            header = {"what": what.value, "start": start, "size": size}
            body = data
        case ResSum(digest, count):
            header = {"digest": digest.hex(), "count": count}
        case ResList(digest):
            header = {"digest": digest.hex()}
        case ResHave(full, entries, data, part, parts):
            header = {"full": full}
            if full:
                header.update(part=part, parts=parts)
            body = data or res_have(full, entries).data
        case ResAsk(name, digest, offset, length):
            header = {"name": name, "digest": digest.hex(), "offset": offset, "length": length}
        case ResChunk(name, digest, size, offset, data):
            header = {"name": name, "digest": digest.hex(), "size": size, "offset": offset}
            body = data
        case ResRefuse(name, digest, held, reason):
            header = {"name": name, "digest": digest.hex(),
                      "held": held.hex() if held is not None else None, "reason": reason}
        case Beat(restated_from, every_ms):
            header = {}
            if restated_from:
                header["from"] = restated_from
            if every_ms:
                header["every"] = every_ms
        case Ask():
            header = {}
    header["k"] = item.kind.value
    if item.kind not in _NODE_KINDS:
        header["key"] = item.key
        header["file"] = item.file
    if item.kind in _WITH_BODY:
        header["n"] = len(body)
    return header, body


def signed_part(topic: str, rest: bytes | memoryview) -> bytes:
    """What the signature covers: the topic and the SHA-256 of the rest of the frame.

    Ed25519 hashes its message twice (SHA-512) to sign and once to verify; over a 256 KiB
    chunk that cost 0.75 ms to sign and 0.47 ms to verify on the reference machine, against
    0.2 and 0.3 ms over its SHA-256 (hardware-accelerated where the CPU has SHA extensions).
    Protocol version 4 differs from 3 by this only; 5 adds the numbered stream (`lane`, beat,
    ask)."""
    return topic.encode("utf-8", "surrogateescape") + b"\x00" + hashlib.sha256(rest).digest()


def item_parts(frame: Frame) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The items' headers and their bodies, in item order (every wire version)."""
    items = []
    bodies = []
    for item in frame.items:
        header, body = _item_header(item)
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
        head = orjson.loads(payload[start : start + hlen])
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
    allowed = _CHANNEL_KINDS[route.channel]
    for raw in raw_items:
        if not isinstance(raw, dict):
            raise FrameError("an item is not an object")
        item, used = _item(raw, body, at, max_data, allowed)
        at += used
        if route.channel is Channel.POSITION and (level(item.key) != route.key
                                                  or level(item.file) != route.file):
            raise FrameError("position names another key or file than its topic")
        items.append(item)
    if at != len(body):
        raise FrameError(f"{len(body) - at} bytes after the last item")
    lane = _count(head, "lane", 0)
    if lane and route.channel is not Channel.ALL:
        raise FrameError("field 'lane' numbers frames on P/a only")
    return Frame(sender, _count(head, "epoch"), _count(head, "seq"), _count(head, "ts"),
                 tuple(items), to if isinstance(to, str) else "", _count(head, "conn", 0), lane)


def _item(raw: dict[str, Any], body: memoryview, at: int, max_data: int,
          allowed: set[Kind]) -> tuple[Item, int]:
    try:
        kind = Kind(raw.get("k"))
    except ValueError:
        raise FrameError(f"unknown item kind {str(raw.get('k'))[:30]!r}") from None
    if kind not in allowed:
        raise FrameError(f"a {kind.value} item on the wrong topic")
    key = file = ""
    if kind not in _NODE_KINDS:
        key_, file_ = raw.get("key"), raw.get("file")
        if not isinstance(key_, str) or not isinstance(file_, str):
            raise FrameError("an item needs 'key' and 'file' strings")
        key, file = key_, file_
        problem = key_problem(key) or file_problem(file)
        if problem:
            raise FrameError(f"unusable name in item: {problem}")
    data = b""
    if kind in _WITH_BODY:
        n = _count(raw, "n")
        limit = MAX_ENTRIES_BODY if kind is Kind.RHAVE else max_data
        if n > limit:
            raise FrameError(f"data item of {n} bytes exceeds {limit}")
        if at + n > len(body):
            raise FrameError("item bytes past the end of the frame")
        data = bytes(body[at : at + n])
    return Item(kind, _payload(kind, raw, data), key, file), len(data)


def _payload(kind: Kind, header: dict[str, Any], body: bytes) -> Payload:
    match kind:
        case Kind.BEAT:
            return Beat(_count(header, "from", 0), _count(header, "every", 0))
        case Kind.ASK:
            return Ask()
        case Kind.NODE:
            retired = header.get("retired", False)
            if not isinstance(retired, bool):
                raise FrameError("field 'retired' must be true or false")
            speaks = header.get("speaks", [])
            if (not isinstance(speaks, list) or len(speaks) > MAX_SPOKEN
                    or not all(type(v) is int and 0 < v < 256 for v in speaks)):
                raise FrameError(f"field 'speaks' must list at most {MAX_SPOKEN} versions")
            run_key = header.get("x", "")
            if not isinstance(run_key, str) or len(run_key) not in (0, 64):
                raise FrameError("field 'x' must be a 32-byte hex key")
            try:
                raw_key = bytes.fromhex(run_key)
            except ValueError:
                raise FrameError("field 'x' is not hex") from None
            return Presence(_bool(header, "online"), retired, tuple(speaks), raw_key)
        case Kind.POS:
            frozen = header.get("frozen")
            if frozen is not None and (not isinstance(frozen, str) or len(frozen) > 200):
                raise FrameError("field 'frozen' must be a short string or null")
            diverged = header.get("diverged", [])
            if (not isinstance(diverged, list) or len(diverged) > MAX_DIVERGED
                    or not all(isinstance(n, str) and 0 < len(n) <= 200 for n in diverged)):
                raise FrameError("field 'diverged' must be a short list of node names")
            return Announce(_count(header, "size"), _digest(header, "digest"), frozen,
                            _count(header, "answers", 0), tuple(diverged))
        case Kind.LIVE | Kind.FILL:
            if not body:
                raise FrameError("data frame without data")
            return Data(_count(header, "offset"), _digest(header, "base"), body)
        case Kind.REQ:
            force = header.get("force", False)
            if not isinstance(force, bool):
                raise FrameError("field 'force' must be true or false")
            return Request(
                _count(header, "have"),
                _digest(header, "digest"),
                _count(header, "start"),
                _count(header, "length"),
                force,
                _count(header, "ask", 0),
            )
        case Kind.PROBE:
            return Probe(_what(header), _count(header, "start"), _count(header, "count"))
        case Kind.PROBED:
            return Probed(_what(header), _count(header, "start"), _count(header, "size"), body)
        case Kind.REFUSE:
            return Refuse(_count(header, "offset"), _digest(header, "digest"))
        case Kind.RSUM:
            return ResSum(_digest(header, "digest"), _count(header, "count"))
        case Kind.RLIST:
            return ResList(_digest(header, "digest"))
        case Kind.RHAVE:
            full = _bool(header, "full")
            part, parts = (_count(header, "part"), _count(header, "parts")) if full else (0, 1)
            if not part < parts:
                raise FrameError("field 'part' must be below 'parts'")
            return ResHave(full, _entries(body), body, part, parts)
        case Kind.RREQ:
            return ResAsk(_res_name(header), _digest(header, "digest"), _count(header, "offset"),
                          _count(header, "length"))
        case Kind.RDATA:
            if not body:
                raise FrameError("data frame without data")
            return ResChunk(_res_name(header), _digest(header, "digest"), _count(header, "size"),
                            _count(header, "offset"), body)
        case Kind.RREFUSE:
            held = header.get("held")
            reason = header.get("reason")
            if not isinstance(reason, str) or len(reason) > 500:
                raise FrameError("field 'reason' must be a short string")
            return ResRefuse(_res_name(header), _digest(header, "digest"),
                             None if held is None else _digest(header, "held"), reason)
    raise FrameError(f"unhandled kind {kind}")  # pragma: no cover


def _count(header: dict[str, Any], name: str, default: int | None = None) -> int:
    value = header.get(name, default)
    # bool is an int in Python; reject it explicitly.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise FrameError(f"field {name!r} must be a non-negative integer")
    return value


def _what(header: dict[str, Any]) -> ProbeWhat:
    try:
        return ProbeWhat(header.get("what"))
    except ValueError:
        raise FrameError("field 'what' must be 'sums' or 'bytes'") from None


def _bool(header: dict[str, Any], name: str) -> bool:
    value = header.get(name)
    if not isinstance(value, bool):
        raise FrameError(f"field {name!r} must be true or false")
    return value


def _digest(header: dict[str, Any], name: str) -> bytes:
    value = header.get(name)
    if not isinstance(value, str) or len(value) != 2 * DIGEST_SIZE:
        raise FrameError(f"field {name!r} must be a {DIGEST_SIZE}-byte hex digest")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise FrameError(f"field {name!r} is not hex") from None


def resource_name_problem(name: str) -> str | None:
    """Why `name` cannot be a file's path under resources/ (None: it can): a relative path
    of plain names, so that no peer can make this host write outside the tree."""
    if not name or len(name) > MAX_RESOURCE_NAME:
        return f"empty or longer than {MAX_RESOURCE_NAME} characters"
    if name.startswith("/"):
        return "absolute"
    if name.count("/") >= MAX_RESOURCE_DEPTH:
        return f"more than {MAX_RESOURCE_DEPTH} levels deep"
    for part in name.split("/"):
        if (problem := part_problem(part)) is not None:
            return f"component {printable(part)!r}: {problem}"
    return None


def _res_name(header: dict[str, Any]) -> str:
    name = header.get("name")
    if not isinstance(name, str):
        raise FrameError("field 'name' must be a string")
    if (problem := resource_name_problem(name)) is not None:
        raise FrameError(f"unusable resource name: {problem}")
    return name


def _entries(body: bytes) -> tuple[ResEntry, ...]:
    if body.count(b",") > 16 * MAX_ENTRIES_PER_ITEM:
        raise FrameError(f"manifest entries exceed {MAX_ENTRIES_PER_ITEM} (too many values)")
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise FrameError("manifest entries are not JSON") from None
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES_PER_ITEM:
        raise FrameError(f"manifest entries must be a list of at most {MAX_ENTRIES_PER_ITEM} "
                         "(exceeds)")
    out = []
    for e in raw:
        if not (isinstance(e, list) and len(e) == 5 and isinstance(e[0], str)
                and isinstance(e[2], str) and isinstance(e[4], str) and len(e[4]) <= 128):
            raise FrameError("a manifest entry must be [name, size, sha256, stamp, origin]")
        fields = {"size": e[1], "stamp": e[3], "digest": e[2], "name": e[0]}
        out.append(ResEntry(_res_name(fields), _count(fields, "size"), _digest(fields, "digest"),
                            _count(fields, "stamp"), e[4]))
    return tuple(out)
