"""What the resources machine is told (events) and what it asks its shell to do (effects).

The shell (daemon/resourcefiles.py) and the simulator (tests/sim/resworld.py) turn files,
frames and timers into events, and carry out the effects: the machine itself does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncd.core import frames
from syncd.core.frames import Kind, ResEntry

# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalFile:
    """The shell found a complete file here (new, or its stat changed) with these bytes."""

    name: str
    size: int
    digest: bytes
    mtime_ns: int = 0  # when it was written (a floor for a sidecar's version number)


@dataclass(frozen=True, slots=True)
class LocalGone:
    name: str


@dataclass(frozen=True, slots=True)
class PeerItem:
    """A resource item from a peer (frames.ResSum, ResList, ResHave, ResAsk, ResChunk,
    ResRefuse)."""

    peer: str
    payload: frames.Payload


@dataclass(frozen=True, slots=True)
class PeerPresence:
    peer: str
    online: bool


@dataclass(frozen=True, slots=True)
class Connected:
    pass


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class Installed:
    """A fetched file is in place under its name (`entry`: what was fetched)."""

    entry: ResEntry


@dataclass(frozen=True, slots=True)
class InstallFailed:
    """Not installed: the temp file's digest was wrong, or a local file took the name first."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ServeFailed:
    """A Serve was not carried out: the file is not what was announced any more (it changed,
    or its path now goes through a link). The shell looks at it again; the asker is told."""

    peer: str
    name: str
    digest: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Compared:
    """Our bytes at the offset of a peer's chunk (Compare effect): the first difference, if any."""

    name: str
    theirs: bytes
    end: int  # end of the range compared
    differ_at: int | None


Event = (LocalFile | LocalGone | PeerItem | PeerPresence | Connected | Tick | Installed
         | InstallFailed | Compared | ServeFailed)


# --- effects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    kind: Kind
    payload: frames.Payload
    to: str = ""  # "" for everyone


@dataclass(frozen=True, slots=True)
class Serve:
    """Send `peer` chunks of our `name` (digest `digest`) covering [offset, offset + length)."""

    peer: str
    name: str
    digest: bytes
    size: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Write:
    """Write bytes at `offset` of the temp file for `name` (`fresh`: start it anew)."""

    name: str
    offset: int
    data: bytes
    fresh: bool


@dataclass(frozen=True, slots=True)
class Install:
    """Check the temp file's digest, make it durable and put it in place: without overwriting
    (`expect` None), or only over the file this machine knows as `expect`."""

    entry: ResEntry
    expect: ResEntry | None


@dataclass(frozen=True, slots=True)
class Discard:
    name: str


@dataclass(frozen=True, slots=True)
class Compare:
    """Compare a peer's chunk with our bytes at its offset; answer with Compared."""

    name: str
    theirs: bytes
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Conflict:
    """A write-once name differs from `peer`'s copy: log it (once per pair of digests)."""

    name: str
    peer: str
    offset: int
    ours: ResEntry
    theirs: ResEntry


@dataclass(frozen=True, slots=True)
class Refused:
    """A file that will not travel (too big): log it once."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Save:
    pass


Effect = Send | Serve | Write | Install | Discard | Compare | Conflict | Refused | Save
