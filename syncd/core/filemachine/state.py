"""The per-file machine's record types and constants: its modes and their transitions, the
tuning it runs with, what it knows of one peer, and the small records of the sub-jobs under way
(a fetch, a trouble, an adoption, a settling or unsettled file). No decisions here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from syncd.core.events import Appended, Drained, Effect, ReadPlan, Snapshot, Synced, Tick
from syncd.core.ledger import Position
from syncd.core.reconcile import PeerState

ANNOUNCE_GAP = 0.5  # seconds between two position announcements of one file
PAUSE_RETRY = 2.0  # seconds before a paused file tries to write again
RELOAD_RETRY = 5.0  # seconds before an unreadable file is tried again
SETTLE = 0.2  # a file that shrank must hold still this long before it is judged
# Records held back (FileMachine.hold_back) are shipped after this many times the hold at most,
# however busy the writer: a writer that never pauses is replicated late, not never.
HOLD_BACK_MAX = 20
LOOK_RETRY_MIN, LOOK_RETRY_MAX = 0.1, 5.0  # backoff of a failing look
LOCATE_RETRY = 5.0  # seconds before asking a diverged peer again where we part
OWN_REMOVAL_WINDOW = 5.0  # a deletion hint this soon after we archived is our own


STAT_ONLY = ReadPlan(stat=True)
# Events no case of `reads_for` matches (every replicated write has some): answered at once.
NO_READS_EVENTS: frozenset[type] = frozenset({Appended, Drained, Synced, Tick})


class Mode(Enum):
    LOADING = "loading"
    UNREADABLE = "unreadable"
    LIVE = "live"
    FROZEN = "frozen"
    ADOPTING = "adopting"


TRANSITIONS: dict[Mode, frozenset[Mode]] = {
    Mode.LOADING: frozenset({Mode.LIVE, Mode.FROZEN, Mode.UNREADABLE}),
    Mode.UNREADABLE: frozenset({Mode.LOADING}),
    Mode.LIVE: frozenset({Mode.FROZEN, Mode.ADOPTING}),
    Mode.FROZEN: frozenset({Mode.LIVE, Mode.ADOPTING}),
    Mode.ADOPTING: frozenset({Mode.LIVE, Mode.FROZEN}),
}





@dataclass
class Tuning:
    chunk_bytes: int = 256 * 1024
    # Largest frame of bytes answering a fetch (0: chunk_bytes). A catch-up pays per frame
    # (docs/design.md, Catching up), and an answer has one recipient; the config's default
    # fits the brokers' 1 MiB packet limits (config.FILL_BYTES).
    fill_bytes: int = 0
    fetch_window: int = 4 * 1024 * 1024
    # Chunks of a request's window read, cut and sealed per turn of serving it (0: the whole
    # window at once); the rest follows once they are handed on (serving.serve).
    serve_chunks: int = 1
    request_timeout: float = 3.0
    persist_interval: float = 5.0
    # Positions are retained, but a subscriber whose queue overflowed misses one for good
    # while it stays connected: say it again now and then, even unchanged.
    reannounce: float = 300.0

    @property
    def fill(self) -> int:
        """Bytes of one FILL frame at most (never fewer than a live frame's)."""
        return max(self.fill_bytes, self.chunk_bytes)

    @property
    def serve_step(self) -> int | None:
        # In answers' frames (fill), so that a step holds whole frames of fill_bytes.
        return self.serve_chunks * self.fill if self.serve_chunks > 0 else None


@dataclass
class LogPeer:
    position: Position
    frozen: str | None
    state: PeerState = PeerState.AHEAD
    verified: bool = False  # consistency checked for this position
    # This position was judged to differ from ours. Kept for the position: a prefix of ours
    # never changes while we only grow (an edit or an adoption here judges everything again).
    forked: bool = False
    probed: bool = False  # a zero-length request was sent to check consistency
    diverged: tuple[str, ...] = ()  # the peers it announces diverged from (us among them?)
    # For readiness (wall-clock times): when we last heard of this copy, last learned it
    # grew (its host was writing), first saw it ahead of ours, first heard it frozen.
    heard_at: float | None = None
    grew_at: float | None = None
    ahead_since: float | None = None
    frozen_since: float | None = None
    disputes_since: float | None = None  # first heard it announce a divergence


@dataclass
class Fetch:
    peer: str
    upto: int
    deadline: float


@dataclass
class Trouble:
    kind: str  # "paused" or "error"
    detail: str
    since: float  # wall clock
    retry_at: float
    attempts: int = 1
    retrying: bool = False  # paused: the retry time came, the next append tries again

    def blocks_appends(self) -> bool:
        return self.kind == "paused" and not self.retrying


@dataclass
class Adoption:
    """An adoption under way: our copy is archived; take `peer`'s whole copy. Done only when
    our durable copy equals a position `peer` announced after we asked (`fresh`)."""

    peer: str
    ticket: object
    archive: str = ""
    ask: int = 0  # sent with every request of this adoption, echoed in the reply's position
    fresh: Position | None = None


@dataclass
class Settle:
    seen: tuple[int, int, int] | None
    since: float


@dataclass
class Unsettled:
    """The writer's new records held back (FileMachine.hold_back): the file as last seen, since
    when it looks so, and since when records wait."""

    seen: tuple[int, int]
    since: float
    first: float
    looked: bool = False  # the look asked for when due is under way: no timer until judged



# A write() that a fatal signal interrupts, or that a power loss tears, stops on a page
# boundary (the kernel copies page by page): 4096 on Linux, and larger pages are multiples.
PAGE = 4096


def first_read(snap: Snapshot) -> bytes:
    """The one range a look (or a peer's data) reads: from Ledger.recheck_start() on."""
    return next(iter(snap.reads.values()), b"")


def effects_of_kind(effects: Iterable[Effect], kind: type) -> list[Any]:
    """The effects of one type, in order (for tests and the simulator)."""
    return [e for e in effects if isinstance(e, kind)]
