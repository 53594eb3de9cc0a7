"""The wire format: topics and frames, encoded and decoded without any I/O.

Topic layout under the configured prefix (P):

    P/node/<node>                          retained presence, "offline" is the connection's will
    P/pos/<node>/<key>/<file>              retained position of <node>'s copy (size + digest)
    P/live/<node>/<key>/<file>             bytes <node> just got, for everyone
    P/req/<to>/<from>/<key>/<file>         <from> asks <to> for bytes it is missing
    P/fill/<to>/<from>/<key>/<file>        <from>'s answer to a request, for <to> only
    P/refuse/<to>/<from>/<key>/<file>      <from> holds a different prefix than <to> claims
    P/probe/<to>/<from>/<key>/<file>       <from> asks for block digests or bytes, to locate a
                                           divergence (answered even by a frozen copy)
    P/probed/<to>/<from>/<key>/<file>      the answer

Payloads are a 3-byte preamble (magic "sd" + version), a 32-byte HMAC-SHA256 tag, a 4-byte
big-endian header length, an orjson header, then (data frames only) the bytes themselves.

The tag is keyed with the cluster secret and covers the topic and everything after the tag, so
a frame cannot be forged, altered, or replayed on another topic (another key, file, sender or
addressee). Every header carries a Stamp (session id, sequence number, wall-clock time) that
`freshness.ReplayGuard` uses against replays on the same topic. Decoding checks the tag first,
then validates every field, and raises FrameError with a reason fit for a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from syncd.errors import SyncdError
from syncd.ledger import DIGEST_SIZE
from syncd.names import is_valid_name

PREAMBLE = b"sd\x02"
TAG_SIZE = 32
_HEADER_LEN = struct.Struct(">I")
MAX_HEADER = 4096


class FrameError(SyncdError, ValueError):
    """A topic or payload that is not a valid syncd frame."""


class Kind(Enum):
    NODE = "node"
    POS = "pos"
    LIVE = "live"
    REQ = "req"
    FILL = "fill"
    REFUSE = "refuse"
    PROBE = "probe"
    PROBED = "probed"


_ADDRESSED = {Kind.REQ, Kind.FILL, Kind.REFUSE, Kind.PROBE, Kind.PROBED}
_WITH_BODY = {Kind.LIVE, Kind.FILL, Kind.PROBED}


@dataclass(frozen=True, slots=True)
class Topic:
    kind: Kind
    sender: str
    key: str = ""
    file: str = ""
    to: str = ""  # only for addressed kinds


def topic_for(prefix: str, t: Topic) -> str:
    if t.kind is Kind.NODE:
        return f"{prefix}/node/{t.sender}"
    if t.kind in _ADDRESSED:
        return f"{prefix}/{t.kind.value}/{t.to}/{t.sender}/{t.key}/{t.file}"
    return f"{prefix}/{t.kind.value}/{t.sender}/{t.key}/{t.file}"


def subscriptions(prefix: str, node: str) -> list[str]:
    return [
        f"{prefix}/node/+",
        f"{prefix}/pos/+/+/+",
        f"{prefix}/live/+/+/+",
        f"{prefix}/req/{node}/+/+/+",
        f"{prefix}/fill/{node}/+/+/+",
        f"{prefix}/refuse/{node}/+/+/+",
        f"{prefix}/probe/{node}/+/+/+",
        f"{prefix}/probed/{node}/+/+/+",
    ]


def parse_topic(prefix: str, topic: str) -> Topic:
    if not topic.startswith(prefix + "/"):
        raise FrameError(f"topic outside prefix: {topic[:200]!r}")
    parts = topic[len(prefix) + 1 :].split("/")
    try:
        kind = Kind(parts[0])
    except ValueError:
        raise FrameError(f"unknown topic kind {parts[0][:50]!r}") from None
    names = parts[1:]
    expected = 1 if kind is Kind.NODE else 4 if kind in _ADDRESSED else 3
    if len(names) != expected:
        raise FrameError(f"{kind.value} topic needs {expected} levels, got {len(names)}")
    for name in names:
        if not is_valid_name(name):
            raise FrameError(f"invalid name in topic: {name[:50]!r}")
    if kind is Kind.NODE:
        return Topic(kind, names[0])
    if kind in _ADDRESSED:
        to, sender, key, file = names
        return Topic(kind, sender, key, file, to)
    sender, key, file = names
    return Topic(kind, sender, key, file)


def piece_end(buf: bytes, start: int, end: int, max_len: int) -> int:
    """Where the data frame that starts at buf[start] should stop (exclusive, <= end).

    Frames end at a line end whenever one fits, so a receiver's copy only ever holds whole
    lines; a single line longer than max_len has to travel in pieces.
    """
    stop = min(end, start + max_len)
    if stop == end:
        return end
    cut = buf.rfind(b"\n", start, stop)
    return cut + 1 if cut >= 0 else stop


# --- payloads ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Presence:
    """A node's presence; `retired` is the notice `syncd forget` leaves in its place."""

    online: bool
    retired: bool = False


@dataclass(frozen=True, slots=True)
class Announce:
    """A host's position for one file; `frozen` names why it stopped replicating, if it did."""

    size: int
    digest: bytes
    frozen: str | None = None
    answers: int = 0  # the `ask` of an adopting peer's request this announcement answers


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


Payload = Presence | Announce | Data | Request | Refuse | Probe | Probed


@dataclass(frozen=True, slots=True)
class Stamp:
    """Who sent a frame, in which run, in what order and when (ms since the epoch)."""

    sid: str
    seq: int
    ts: int


def _tag(secret: bytes, topic: str, rest: bytes | memoryview) -> bytes:
    mac = hmac.new(secret, topic.encode("utf-8", "surrogateescape") + b"\x00", hashlib.sha256)
    mac.update(rest)
    return mac.digest()


def encode(payload: Payload, stamp: Stamp, secret: bytes, topic: str) -> bytes:
    body = b""
    header: dict[str, Any]
    match payload:
        case Presence(online, retired):
            # "retired" only when set: older daemons read a retirement as "offline".
            header = {"online": online, "retired": True} if retired else {"online": online}
        case Announce(size, digest, frozen, answers):
            header = {"size": size, "digest": digest.hex(), "frozen": frozen}
            if answers:
                header["answers"] = answers
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
    header.update(sid=stamp.sid, seq=stamp.seq, ts=stamp.ts)
    raw = orjson.dumps(header)
    rest = _HEADER_LEN.pack(len(raw)) + raw + body
    return PREAMBLE + _tag(secret, topic, rest) + rest


def decode(kind: Kind, payload: bytes, max_data: int, secret: bytes,
           topic: str) -> tuple[Stamp, Payload]:
    """Check the tag, then decode and validate a payload received on `topic` (of `kind`)."""
    if not payload.startswith(PREAMBLE):
        raise FrameError("bad preamble (not a syncd frame, or another protocol version)")
    base = len(PREAMBLE) + TAG_SIZE
    if len(payload) < base + _HEADER_LEN.size:
        raise FrameError("truncated frame")
    rest = memoryview(payload)[base:]
    if not hmac.compare_digest(payload[len(PREAMBLE) : base], _tag(secret, topic, rest)):
        raise FrameError("bad authentication tag (wrong cluster secret, or a forged or "
                         "altered frame)")
    payload = payload[base:]
    start = _HEADER_LEN.size
    (hlen,) = _HEADER_LEN.unpack_from(payload, 0)
    if hlen > MAX_HEADER or start + hlen > len(payload):
        raise FrameError(f"bad header length {hlen}")
    try:
        header = orjson.loads(payload[start : start + hlen])
    except orjson.JSONDecodeError:
        raise FrameError("header is not JSON") from None
    if not isinstance(header, dict):
        raise FrameError("header is not an object")
    body = payload[start + hlen :]
    if kind not in _WITH_BODY and body:
        raise FrameError(f"{kind.value} frame carries unexpected bytes")
    sid = header.get("sid")
    if not isinstance(sid, str) or not 0 < len(sid) <= 64:
        raise FrameError("field 'sid' must be a short string")
    stamp = Stamp(sid, _count(header, "seq"), _count(header, "ts"))
    return stamp, _payload(kind, header, body, max_data)


def _payload(kind: Kind, header: dict[str, Any], body: bytes, max_data: int) -> Payload:
    match kind:
        case Kind.NODE:
            retired = header.get("retired", False)
            if not isinstance(retired, bool):
                raise FrameError("field 'retired' must be true or false")
            return Presence(_bool(header, "online"), retired)
        case Kind.POS:
            frozen = header.get("frozen")
            if frozen is not None and (not isinstance(frozen, str) or len(frozen) > 200):
                raise FrameError("field 'frozen' must be a short string or null")
            return Announce(_count(header, "size"), _digest(header, "digest"), frozen,
                            _count(header, "answers", 0))
        case Kind.LIVE | Kind.FILL:
            if not body:
                raise FrameError("data frame without data")
            if len(body) > max_data:
                raise FrameError(f"data frame of {len(body)} bytes exceeds {max_data}")
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
            if len(body) > max_data:
                raise FrameError(f"probe answer of {len(body)} bytes exceeds {max_data}")
            return Probed(_what(header), _count(header, "start"), _count(header, "size"), body)
        case Kind.REFUSE:
            return Refuse(_count(header, "offset"), _digest(header, "digest"))
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
