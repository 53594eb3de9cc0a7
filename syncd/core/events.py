"""The vocabulary of the per-file machine (`filemachine/`): what the shell reads for an event
(ReadPlan, Snapshot), the events it hands over, and the effects the machine returns.

Small frozen dataclasses, no behaviour beyond a property or two: the decisions are all in
`filemachine/`, the I/O in `daemon/filetask.py` (and in the simulator's shell,
`tests/sim/world.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from syncd.core import frames
from syncd.core.frames import Announce, Data, Kind, Probe, Probed, Refuse, Request
from syncd.core.ledger import Ledger
from syncd.core.records import Appending, FileRecord, Stat

# --- what the shell reads for an event --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadPlan:
    ranges: tuple[tuple[int, int], ...] = ()
    line_end_from: int | None = None  # also find the end of the last whole line past here
    # Frames: where the unfinished record at line_end_from began, if it did before it (a
    # frame longer than a read, shipped in pieces): its end is found from its start.
    record_start: int | None = None
    stat: bool = False  # the file's stat, even without reading bytes

    @property
    def empty(self) -> bool:
        return not self.ranges and self.line_end_from is None and not self.stat


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The file as the shell found it for one event: its stat and the planned bytes (shorter
    where the file is shorter), all read through one descriptor."""

    stat: Stat | None = None
    reads: dict[tuple[int, int], bytes] = field(default_factory=dict)
    line_end: int | None = None

    def get(self, start: int, end: int) -> bytes:
        return self.reads.get((start, end), b"")


NO_READS = ReadPlan()
EMPTY = Snapshot()


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Loaded:
    """Start-up: the persisted record (None if there is none) and its chain."""

    record: FileRecord | None
    chain: list[bytes]
    problem: str | None = None  # the record was unreadable (it is then ignored)
    # Without a record: the `.appending` note (FileRecord.appending), e.g. of a first catch-up
    # killed before its first record.
    appending: Appending | None = None


@dataclass(frozen=True, slots=True)
class LoadFailed:
    detail: str


@dataclass(frozen=True, slots=True)
class Look:
    """Look at the local file again; `replaced`: the watcher saw it deleted or moved over.

    A sweep's look starts with a stat (`full` False): most of what it finds changed is our
    own appends, which change nothing we have not recorded. Only when the stat says the file
    changed does the machine ask for the full look, with the bytes below our end and the new
    ones. The commit gate's look is full from the start: the watcher's hint was no append of
    ours (the shell recognises those), so on a writer it is new bytes nearly always."""

    replaced: bool = False
    full: bool = False
    size: int = -1  # the size the stat found: the full look reads no further


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class Drained:
    """The shell has no more events queued for this file: make durable what waits."""


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A new broker connection: everyone must hear our position again."""


@dataclass(frozen=True, slots=True)
class PeerForgotten:
    """`syncd forget`: the node was retired for good; its copy no longer counts."""

    peer: str


@dataclass(frozen=True, slots=True)
class PeerOnline:
    peer: str
    online: bool


@dataclass(frozen=True, slots=True)
class PeerPos:
    peer: str
    announce: Announce


@dataclass(frozen=True, slots=True)
class PeerData:
    peer: str
    data: Data
    retried: bool = False  # re-delivered after our own local bytes were dealt with
    # Read the bytes below our end too: the file changed since we last wrote or judged it
    # (the first delivery only takes a stat, which is all the common case needs).
    look: bool = False


@dataclass(frozen=True, slots=True)
class PeerRequest:
    peer: str
    request: Request


@dataclass(frozen=True, slots=True)
class PeerRefuse:
    peer: str
    refuse: Refuse


@dataclass(frozen=True, slots=True)
class PeerProbe:
    peer: str
    probe: Probe


@dataclass(frozen=True, slots=True)
class PeerProbed:
    peer: str
    probed: Probed


@dataclass(frozen=True, slots=True)
class Reassess:
    """Compare a peer's announced position with ours again (needs a read of the file)."""

    peer: str


@dataclass(frozen=True, slots=True)
class Appended:
    peer: str
    data: bytes
    stat: Stat


@dataclass(frozen=True, slots=True)
class AppendFailed:
    kind: str  # "full" (ENOSPC, quota), "error", "concurrent", "replaced"
    detail: str


@dataclass(frozen=True, slots=True)
class Synced:
    pass


@dataclass(frozen=True, slots=True)
class SyncFailed:
    detail: str


@dataclass(frozen=True, slots=True)
class Rehashed:
    purpose: str  # "load", "check", "shrunk", "rewritten", "keep"
    ledger: Ledger | None  # None: the file is gone
    why: str = ""


@dataclass(frozen=True, slots=True)
class Archived:
    path: str


@dataclass(frozen=True, slots=True)
class ArchiveFailed:
    detail: str


@dataclass(frozen=True, slots=True)
class LineFound:
    peer: str
    offset: int
    line: int


@dataclass(frozen=True, slots=True)
class AdoptRequested:
    source: str
    ticket: object  # handed back in AdoptDone


@dataclass(frozen=True, slots=True)
class ScrubMismatch:
    pass


@dataclass(frozen=True, slots=True)
class IoFailed:
    """The reads planned for `event` failed (EMFILE, EIO, EACCES, ...)."""

    event: object
    detail: str


@dataclass(frozen=True, slots=True)
class RoleChanged:
    role: str


Event = (Loaded | LoadFailed | Look | Tick | Drained | Reconnected | PeerForgotten | PeerOnline
         | PeerPos | PeerData | PeerRequest | PeerRefuse | PeerProbe | PeerProbed | Reassess
         | Appended | AppendFailed | Synced | SyncFailed | Rehashed | Archived | ArchiveFailed
         | LineFound | AdoptRequested | ScrubMismatch | IoFailed | RoleChanged)


# --- effects --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    kind: Kind
    payload: frames.Payload
    to: str = ""
    retain: bool = False


@dataclass(frozen=True, slots=True)
class Append:
    """Append `data` at `offset` through a descriptor whose (dev, ino) is `inode` (None: create
    the file, which must not exist). Answered by Appended or AppendFailed."""

    offset: int
    data: bytes
    inode: tuple[int, int] | None
    peer: str


@dataclass(frozen=True, slots=True)
class Sync:
    """fdatasync the file. Answered by Synced or SyncFailed."""

    local: bool  # the writer's own bytes (shipped) rather than bytes we appended


@dataclass(frozen=True, slots=True)
class Persist:
    record: FileRecord
    chain: list[bytes] | None  # None: keep the chain file as it is
    durable: bool
    rebuilt: bool = False  # the chain was rebuilt: rewrite the chain file whole


@dataclass(frozen=True, slots=True)
class NoteAppending:
    """Write down, before the append that follows, which peer's piece is being appended
    (records.Appending); None: nothing. In place and not synced: it costs a pwrite, where a
    record costs a rename that the filesystem may flush, and a sync per frame doubled the lag
    (a power loss may then drop it: the piece's bytes it kept are refused as a divergence).
    `durable`: synced too, before the next effect (at a start with bytes past our end)."""

    appending: Appending | None
    durable: bool = False


@dataclass(frozen=True, slots=True)
class Rehash:
    """Hash the file; answered by Rehashed. `whole_lines`: stop at the last line end, but
    never below `hold` bytes (bytes we recorded as held are ours even mid-line)."""

    purpose: str
    whole_lines: bool = True
    hold: int = 0
    why: str = ""


@dataclass(frozen=True, slots=True)
class Archive:
    """Move the local copy into the archive with this manifest; answered by Archived."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FindLine:
    """Count the lines before `offset`; answered by LineFound."""

    peer: str
    offset: int


@dataclass(frozen=True, slots=True)
class LookAgain:
    pass


@dataclass(frozen=True, slots=True)
class Redeliver:
    event: Event


@dataclass(frozen=True, slots=True)
class Reload:
    pass


@dataclass(frozen=True, slots=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True, slots=True)
class Durable:
    size: int


@dataclass(frozen=True, slots=True)
class LogCheck:
    restart: bool = False


@dataclass(frozen=True, slots=True)
class AdoptDone:
    ticket: object
    result: dict[str, object]


Effect = (Send | Append | Sync | Persist | NoteAppending | Rehash | Archive | FindLine
          | LookAgain | Redeliver | Reload | Log | Durable | LogCheck | AdoptDone | Reassess)


def peer_event(kind: Kind, sender: str, body: frames.Payload) -> Event | None:
    """The machine event a peer's frame item is (None for a body that does not fit its kind).

    The one mapping from the wire to the machine: the daemon's frame gate and the simulator's
    broker both use it.
    """
    match kind, body:
        case Kind.POS, Announce():
            return PeerPos(sender, body)
        case (Kind.LIVE | Kind.FILL), Data():
            return PeerData(sender, body)
        case Kind.REQ, Request():
            return PeerRequest(sender, body)
        case Kind.REFUSE, Refuse():
            return PeerRefuse(sender, body)
        case Kind.PROBE, Probe():
            return PeerProbe(sender, body)
        case Kind.PROBED, Probed():
            return PeerProbed(sender, body)
    return None
