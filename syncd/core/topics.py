"""The topics of the wire format, and the encoding of names as topic levels, without any I/O.

Topic layout under the configured prefix P; every level after P is `level(name)`, an encoding
of a node id, an instance key or a file name (see below):

    P/n/<node>                  retained presence; "offline" is the connection's will
    P/p/<node>/<key>/<file>     retained position of <node>'s copy of one file (size + digest)
    P/p/<node>/~k<32 hex>       the same, under `[mqtt] hide_names`: one keyed level (below)
    P/a/<node>                  a batch for everyone: the bytes <node> just got, of any files
    P/t/<to>/<node>             a batch for <to> only: requests, answers, refusals, probes

Which kinds of item may travel on which: CHANNEL_KINDS.

Topic levels: MQTT gives `+`, `#` and `/` meanings, NATS refuses `.` and spaces, and brokers
cap topic lengths, while instance keys hold any character a directory name can (and `/` between
nesting levels). So a name made only of ASCII letters, digits, `_` and `-` (host-a, main) is
its own level, readable in broker logs and usable in an ACL's `%u`; any other name is `~` and
the unpadded lower-case base32 of its UTF-8 bytes (safe on every broker), and a name whose
level would exceed LEVEL_MAX characters is `~~` and 32 hex digits of its SHA-256. The three
forms cannot collide, `name_of_level` reverses the first two, and either way the real names
travel in the frame's authenticated header: the receiver checks that the topic's levels are
theirs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from syncd.core.errors import FrameError
from syncd.core.items import Kind

LEVEL_MAX = 100


class Channel(Enum):
    """Which topic a frame travels on (the first level after the prefix)."""

    PRESENCE = "n"
    POSITION = "p"
    ALL = "a"
    TO = "t"


_ADDRESSED = {Kind.REQ, Kind.FILL, Kind.REFUSE, Kind.PROBE, Kind.PROBED,
              Kind.RLIST, Kind.RHAVE, Kind.RREQ, Kind.RDATA, Kind.RREFUSE, Kind.ASK}
# The kinds of item each channel carries (a frame holding another is refused).
CHANNEL_KINDS = {
    Channel.PRESENCE: {Kind.NODE},
    Channel.POSITION: {Kind.POS},
    # A manifest's summary, and the entries a host just got, go to everyone; a full
    # manifest (RHAVE) goes to the host that asked for it.
    Channel.ALL: {Kind.LIVE, Kind.POS, Kind.RSUM, Kind.RHAVE, Kind.BEAT},
    Channel.TO: _ADDRESSED,
}


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


_PLAIN = re.compile(rf"[A-Za-z0-9_-]{{1,{LEVEL_MAX}}}")
KEYED_MARK = "~k"
_KEYED = re.compile(r"~k[0-9a-f]{32}")


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


def keyed_level(secret: bytes, key: str, file: str) -> str:
    """The one level that stands for (key, file) under hide_names: opaque without `secret`.
    The key's length goes first, so that no two pairs of names give the same message."""
    k = key.encode("utf-8", "surrogateescape")
    message = len(k).to_bytes(4, "big") + k + file.encode("utf-8", "surrogateescape")
    return KEYED_MARK + hmac.digest(secret, message, "sha256")[:16].hex()


def is_keyed_level(text: str) -> bool:
    return _KEYED.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class Route:
    """What a topic says: the channel and the (encoded) levels after it."""

    channel: Channel
    sender: str  # a level
    to: str = ""  # a level, for Channel.TO
    key: str = ""  # a level, for Channel.POSITION (or its keyed level: `keyed`)
    file: str = ""  # a level, for Channel.POSITION ("" under a keyed level)

    @property
    def keyed(self) -> bool:
        """A position under a keyed level (hide_names): its names are its body's."""
        return self.channel is Channel.POSITION and not self.file


def presence_topic(prefix: str, node: str) -> str:
    return f"{prefix}/n/{level(node)}"


def position_topic(prefix: str, node: str, key: str, file: str) -> str:
    return f"{prefix}/p/{level(node)}/{level(key)}/{level(file)}"


def keyed_position_topic(prefix: str, node: str, secret: bytes, key: str, file: str) -> str:
    return f"{prefix}/p/{level(node)}/{keyed_level(secret, key, file)}"


def all_topic(prefix: str, node: str) -> str:
    return f"{prefix}/a/{level(node)}"


def to_topic(prefix: str, to: str, node: str) -> str:
    return f"{prefix}/t/{level(to)}/{level(node)}"


def subscriptions(prefix: str, node: str, peers: Iterable[str],
                  hide_names: bool = False) -> list[str]:
    """What `node` listens to: everyone's presence (a host missing from [peers] shows up as
    refused, once per connection), what is addressed to it, and the batches and positions of
    each listed peer, in both forms (plain levels, or one keyed level). Not `a/+` or
    `p/+/+/+`: the broker would send every batch of ours back to us, a read and a parse per
    frame for nothing (a writer's largest MQTT cost). Of our own positions, only the form we
    do not publish (`hide_names` says which): none ever comes back but the retained ones we
    left under it in a run with the other setting, for us to clear (own_stale_position)."""
    mine = level(node)
    topics = [f"{prefix}/n/+", f"{prefix}/t/{mine}/+"]
    for peer in sorted(set(peers) - {node}):
        topics += [f"{prefix}/a/{level(peer)}", f"{prefix}/p/{level(peer)}/+/+",
                   f"{prefix}/p/{level(peer)}/+"]
    topics.append(f"{prefix}/p/{mine}/+/+" if hide_names else f"{prefix}/p/{mine}/+")
    return topics


def own_stale_position(route: Route, node_level: str, hide_names: bool) -> bool:
    """Whether a message is a retained position of ours in the form we no longer use."""
    return (route.channel is Channel.POSITION and route.sender == node_level
            and route.keyed != hide_names)


_LEVELS = {Channel.PRESENCE: (1,), Channel.POSITION: (3, 2), Channel.ALL: (1,),
           Channel.TO: (2,)}


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
    if len(levels) not in _LEVELS[channel]:
        raise FrameError(f"{channel.name.lower()} topic needs "
                         f"{' or '.join(map(str, _LEVELS[channel]))} levels, got {len(levels)}")
    if not all(0 < len(x) <= LEVEL_MAX for x in levels):
        raise FrameError("empty or overlong topic level")
    if channel is Channel.TO:
        return Route(channel, levels[1], to=levels[0])
    if channel is Channel.POSITION:
        if len(levels) == 2:
            if not is_keyed_level(levels[1]):
                raise FrameError(f"position level {levels[1][:50]!r} is neither a key and a "
                                 "file nor a keyed level")
            return Route(channel, levels[0], key=levels[1])
        return Route(channel, levels[0], key=levels[1], file=levels[2])
    return Route(channel, levels[0])
