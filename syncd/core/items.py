"""The items of the wire format: what one item says (its Kind and payload), and how it is
written in a frame: one object of the header's `items` list, and for the kinds that carry bytes,
a body that follows the header in item order (`n` says how long). Decoding validates every
field a peer sent and raises FrameError with a reason fit for a log line. The frame that
carries the items (header, signature, preamble) is frames.py; the topics they go on, topics.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from syncd.core import peerjson
from syncd.core.errors import FrameError
from syncd.core.ledger import DIGEST_SIZE
from syncd.core.names import file_problem, key_problem, part_problem, printable

MAX_DIVERGED = 1024  # peers one announcement may name as diverged (more hosts than any cluster)
MAX_SPOKEN = 16  # wire versions one presence may list


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
    # An instance's resources/ files (core/resources/); key = the instance, file = RESOURCES.
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


_NODE_KINDS = {Kind.NODE, Kind.BEAT, Kind.ASK}  # about the sender: no key, no file
_WITH_BODY = {Kind.LIVE, Kind.FILL, Kind.PROBED, Kind.RHAVE, Kind.RDATA}
RESOURCES = "resources"  # the `file` of every resource item: the instance's resources/ tree
MAX_RESOURCE_NAME = 1024
# Levels of a resource name at most: the largest [resources] max_depth (config.py), which is
# what a host walks and accepts from peers (core/resources/): a level is a directory to create.
MAX_RESOURCE_DEPTH = 256
# One manifest item: at most MAX_ENTRIES_PER_ITEM entries (2000 are sent) in MAX_ENTRIES_BODY
# bytes. Decoding costs ~1.8 KB of memory per entry for a moment: the JSON values are counted
# (by their commas) before it is parsed, so that no body of tiny values costs more.
MAX_ENTRIES_PER_ITEM = 4096
MAX_ENTRIES_BODY = 2 << 20


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


def item_header(item: Item) -> tuple[dict[str, Any], bytes]:
    """One item's header (an object of the frame's `items`) and its body."""
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


def decode_item(raw: dict[str, Any], body: memoryview, at: int, max_data: int,
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
        n = uint(raw, "n")
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
            return Beat(uint(header, "from", 0), uint(header, "every", 0))
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
            return Announce(uint(header, "size"), _digest(header, "digest"), frozen,
                            uint(header, "answers", 0), tuple(diverged))
        case Kind.LIVE | Kind.FILL:
            if not body:
                raise FrameError("data frame without data")
            return Data(uint(header, "offset"), _digest(header, "base"), body)
        case Kind.REQ:
            force = header.get("force", False)
            if not isinstance(force, bool):
                raise FrameError("field 'force' must be true or false")
            return Request(
                uint(header, "have"),
                _digest(header, "digest"),
                uint(header, "start"),
                uint(header, "length"),
                force,
                uint(header, "ask", 0),
            )
        case Kind.PROBE:
            return Probe(_what(header), uint(header, "start"), uint(header, "count"))
        case Kind.PROBED:
            return Probed(_what(header), uint(header, "start"), uint(header, "size"), body)
        case Kind.REFUSE:
            return Refuse(uint(header, "offset"), _digest(header, "digest"))
        case Kind.RSUM:
            return ResSum(_digest(header, "digest"), uint(header, "count"))
        case Kind.RLIST:
            return ResList(_digest(header, "digest"))
        case Kind.RHAVE:
            full = _bool(header, "full")
            part, parts = (uint(header, "part"), uint(header, "parts")) if full else (0, 1)
            if not part < parts:
                raise FrameError("field 'part' must be below 'parts'")
            return ResHave(full, _entries(body), body, part, parts)
        case Kind.RREQ:
            return ResAsk(_res_name(header), _digest(header, "digest"), uint(header, "offset"),
                          uint(header, "length"))
        case Kind.RDATA:
            if not body:
                raise FrameError("data frame without data")
            return ResChunk(_res_name(header), _digest(header, "digest"), uint(header, "size"),
                            uint(header, "offset"), body)
        case Kind.RREFUSE:
            held = header.get("held")
            reason = header.get("reason")
            if not isinstance(reason, str) or len(reason) > 500:
                raise FrameError("field 'reason' must be a short string")
            return ResRefuse(_res_name(header), _digest(header, "digest"),
                             None if held is None else _digest(header, "held"), reason)
    raise FrameError(f"unhandled kind {kind}")  # pragma: no cover


def uint(header: dict[str, Any], name: str, default: int | None = None) -> int:
    """Field `name` of a header: a non-negative integer below 2**63, or FrameError."""
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
        raw = peerjson.loads(body)
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
        out.append(ResEntry(_res_name(fields), uint(fields, "size"), _digest(fields, "digest"),
                            uint(fields, "stamp"), e[4]))
    return tuple(out)
