"""One replicated file as a pure state machine: events in, effects out.

Everything that decides anything about one copy of one file lives here: whether bytes are
appended, shipped, served, refused; when a file freezes and why; when it is done adopting.
This module does not know whether bytes come from the local writer or a peer beyond what the
rule needs, and it touches no file, socket, thread or clock.

Theory of operation
-------------------
The caller (the shell, `daemon/filetask.py`, or the simulator in `tests/sim/`) runs this loop, one
event at a time, never two at once for the same file:

    plan = machine.reads_for(event)         # which bytes of the file the decision needs
    snap = <stat + those bytes, read through one descriptor>
    effects = machine.handle(event, snap, now, wall)
    <carry out each effect in order; an effect with a result (Append, Sync, Rehash, Archive,
     FindLine) is answered at once with its completion event, handled the same way>

so the machine always decides on bytes read for that very decision, and nothing else happens
to its state between an effect and its completion. `deadline()` says when it wants a Tick.

State: a ledger (size and prefix digests of the history we hold), the (dev, inode) it
describes, what every peer announced, and a mode:

    LOADING     start-up: the record is checked against the file (rehashed if it changed)
    UNREADABLE  the file cannot be read at all; a reload is tried every few seconds
    LIVE        replicating: local growth is shipped, a peer's bytes that extend ours appended
                (from every peer but those whose copies diverged from ours: see below)
    FROZEN      a local reason: a reset (our file was deleted, replaced or truncated), a write
                on a `replica`, another process writing while we append: nothing is written or
                sent for it; it still answers requests with refusals and probes
    ADOPTING    an operator chose another host's copy: ours is archived, theirs is fetched

    LOADING -> LIVE | FROZEN | UNREADABLE      UNREADABLE -> LOADING
    LIVE -> FROZEN | ADOPTING                  FROZEN -> LIVE | ADOPTING
    ADOPTING -> LIVE | FROZEN

A LIVE file may also have troubles, each kept until it clears: `paused` (the disk refuses our
appends; retried every PAUSE_RETRY) and `failing` (a look at the file or a sync failed,
EMFILE, EIO; retried with backoff). Either shows in status instead of in_sync.

The rule, for local and remote bytes alike, lives in `reconcile`: bytes are appended only at
our end and only after a prefix whose digest equals ours; `judge_local` says whether our
recorded history is still a prefix of the file. Three predicates gate the rest:
`may_accept(peer)`, `may_ship()`, `may_serve(force)`.

A divergence is per peer (`diverged`): a copy that differs from ours inside the common prefix
isolates that peer only. Nothing is taken from it or fetched from it, its requests are refused
(an adopting peer's forced requests excepted), and we say in our announcement that we know;
with every other peer the file stays LIVE. One listed host with another history (a compromised
one, a stale one, the other side of a split brain) therefore stops nothing between the rest.
It clears when the peer announces a copy consistent with ours past the point where they
parted (it adopted ours, or we adopted its), by `forget`, or by an adoption here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from syncd.core import recordkinds, shellwords
from syncd.core.events import (
    EMPTY,
    NO_READS,
    AdoptDone,
    AdoptRequested,
    Append,
    Appended,
    AppendFailed,
    Archive,
    Archived,
    ArchiveFailed,
    Drained,
    Durable,
    Effect,
    Event,
    FindLine,
    IoFailed,
    LineFound,
    Loaded,
    LoadFailed,
    Log,
    LogCheck,
    Look,
    LookAgain,
    NoteAppending,
    PeerData,
    PeerForgotten,
    PeerOnline,
    PeerPos,
    PeerProbe,
    PeerProbed,
    PeerRefuse,
    PeerRequest,
    Persist,
    ReadPlan,
    Reassess,
    Reconnected,
    Redeliver,
    Rehash,
    Rehashed,
    Reload,
    RoleChanged,
    ScrubMismatch,
    Send,
    Snapshot,
    Sync,
    Synced,
    SyncFailed,
    Tick,
)
from syncd.core.frames import Announce, Data, Kind, Probe, Probed, ProbeWhat, Refuse, Request
from syncd.core.ledger import BLOCK, DIGEST_SIZE, Ledger, Position, block_start
from syncd.core.reconcile import (
    LocalChange,
    PeerState,
    Verdict,
    choose_source,
    file_state,
    first_change,
    first_differing_block,
    first_differing_byte,
    judge_data,
    judge_local,
    judge_peer,
    judge_request,
)
from syncd.core.recordkinds import LINES
from syncd.core.records import Appending, FileRecord, Freeze, Stat, line_around

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
_NO_READS: frozenset[type] = frozenset({Appended, Drained, Synced, Tick})


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


# --- state ----------------------------------------------------------------------------------


@dataclass
class Tuning:
    chunk_bytes: int = 256 * 1024
    fetch_window: int = 4 * 1024 * 1024
    request_timeout: float = 3.0
    persist_interval: float = 5.0
    # Positions are retained, but a subscriber whose queue overflowed misses one for good
    # while it stays connected: say it again now and then, even unchanged.
    reannounce: float = 300.0


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


class FileMachine:
    def __init__(self, node: str, key: str, file: str, role: str, tuning: Tuning,
                 online: dict[str, bool] | None = None, records: str = LINES,
                 settle: float = 0.0) -> None:
        self.node, self.key, self.file, self.role = node, key, file, role
        self.records = records  # what one record of the file is (recordkinds.py)
        # Seconds the writer's file must hold still before its new records are recorded and
        # shipped (its batch settled: written, synced, or rolled back): `_held_back`.
        self.hold_back = settle
        self.unsettled: Unsettled | None = None
        self.tuning = tuning
        self.mode = Mode.LOADING
        self.ledger: Ledger | None = None
        self.position = Position.empty()  # what we announce: durable bytes only
        self.inode: tuple[int, int] | None = None
        self.seen: tuple[int, int] | None = None  # (size, mtime) at the last look
        self.file_stat: Stat | None = None  # the file as last seen (status shows it)
        self.freeze: Freeze | None = None
        self.diverged: dict[str, Freeze] = {}
        self.note: str | None = None
        self.intent: tuple[str, int, int, str] | None = None
        self.appending: Appending | None = None  # see records.Appending
        self._intent_check: tuple[int, bytes] | None = None  # (end, digest) during LOADING
        self.paused: Trouble | None = None
        self.failing: Trouble | None = None
        self.load_error: str | None = None
        self.reload_at: float | None = None
        self.peers: dict[str, LogPeer] = {}
        self.online: dict[str, bool] = dict(online or {})
        self.fetch: Fetch | None = None
        self.adoption: Adoption | None = None
        self.unsynced = 0  # bytes appended here but not yet fdatasync'ed
        self.record_dirty = False
        self.last_persist = float("-inf")
        self.last_announce = float("-inf")
        self.announce_due: float | None = None
        self.settle: Settle | None = None
        self.own_removal_until = float("-inf")
        self.locating: dict[str, float] = {}  # peer -> when we last asked it where we part
        # peer -> (what, start) of the probe we sent it last: only its answer is read (an
        # answer nobody asked for would make us read, and count lines, where a peer likes)
        self.probing: dict[str, tuple[ProbeWhat, int]] = {}
        # peer -> what tells it our copies differ (our digest at an offset both hold): sent
        # again with each locate retry until the peer shows it knows (its announcement names
        # us among its divergences), so that a lost frame never leaves a fork shown on one
        # side only.
        self.refusals: dict[str, Refuse] = {}
        self._record: FileRecord | None = None  # during LOADING
        self._record_chain: list[bytes] = []
        self._rebuilt = False  # the chain file must be rewritten whole at the next persist
        self.counters = {"shipped_bytes": 0, "applied_bytes": 0, "served_bytes": 0,
                         "shipped_frames": 0, "applied_frames": 0, "served_frames": 0}

    # --- predicates ---------------------------------------------------------------------------

    def has_peer(self, peer: str) -> bool:
        """Whether PEER has announced a copy of this file."""
        return peer in self.peers

    @property
    def name(self) -> str:
        return f"{self.key}/{self.file}"

    @property
    def frozen(self) -> str | None:
        """Why the whole file stopped replicating: local reasons only. A divergence from a
        peer isolates that peer (`diverged`), not the file."""
        return self.freeze.reason if self.freeze is not None else None

    @property
    def held(self) -> int:
        """Bytes of the file our ledger describes (durable or not)."""
        return self.ledger.size if self.ledger is not None else 0

    def may_accept(self, peer: str, now: float) -> bool:
        """Whether bytes from `peer` may be appended here (if they extend our copy)."""
        if self.ledger is None:
            return False
        if self.mode is Mode.ADOPTING:
            return self.adoption is not None and self.adoption.peer == peer
        if self.mode is not Mode.LIVE or self.role == "source" or peer in self.diverged:
            return False
        return self.paused is None or not self.paused.blocks_appends()

    def may_ship(self) -> bool:
        """Whether local growth may be published."""
        return self.mode is Mode.LIVE and self.ledger is not None

    def may_serve(self, force: bool) -> bool:
        """Whether we send our bytes to a peer that asks (an adopting peer may ask a frozen
        copy: serving never changes it). An adopting copy serves what it took so far: every
        byte travels with the digest of the prefix before it."""
        return self.ledger is not None and (self.mode in (Mode.LIVE, Mode.ADOPTING) or force)

    def _enter(self, mode: Mode) -> None:
        if mode is self.mode:
            return
        if mode not in TRANSITIONS[self.mode]:
            raise AssertionError(f"{self.name}: no transition {self.mode.value} -> {mode.value}")
        self.mode = mode

    def knows_of_fork(self, peer: str) -> bool:
        """Whether `peer` announced that its copy and ours differ (it names us)."""
        view = self.peers.get(peer)
        return view is not None and self.node in view.diverged

    def _refreeze_or_live(self) -> None:
        """LIVE unless a (local) freeze holds, after one was added or cleared."""
        if self.mode in (Mode.LIVE, Mode.FROZEN):
            self._enter(Mode.FROZEN if self.frozen else Mode.LIVE)

    # --- reads --------------------------------------------------------------------------------

    def reads_for(self, event: Event) -> ReadPlan:
        """The bytes of the file that `handle(event)` needs; the shell reads them first."""
        if type(event) in _NO_READS:
            return NO_READS
        ledger = self.ledger
        match event:
            case Loaded(record=rec) if rec is not None:
                return ReadPlan(((block_start(rec.size), rec.size),), stat=True)
            case Rehashed(purpose="load") if self._record is not None:
                size = self._record.size
                ranges = [(block_start(size), size)]
                if self._intent_check is not None:
                    end = self._intent_check[0]
                    ranges.append((block_start(end), end))
                return ReadPlan(tuple(ranges), stat=True)
            case Rehashed(purpose="check") if ledger is not None:
                return ReadPlan(((block_start(ledger.size), ledger.size),), stat=True)
            case PeerData(look=False) | Look(full=False):
                return STAT_ONLY
            case Look() | PeerData() if ledger is not None:
                end = ledger.size + self.tuning.fetch_window
                if isinstance(event, PeerData):
                    end = ledger.size + len(event.data.data)
                elif event.size >= 0:
                    end = max(ledger.size, min(end, event.size))  # no larger buffer than needed
                return ReadPlan(((ledger.recheck_start(), end),), line_end_from=ledger.size,
                                record_start=ledger.open_line_start, stat=True)
            case Loaded() | Rehashed() | Look() | PeerRequest():
                plan = self._request_plan(event) if isinstance(event, PeerRequest) else NO_READS
                return ReadPlan(plan.ranges, stat=True)
            case PeerPos(announce=a) if ledger is not None:
                return self._partial_plan(a.size)
            case Reassess(peer=p) if ledger is not None and p in self.peers:
                return self._partial_plan(self.peers[p].position.size)
            case PeerRefuse(refuse=rf) if ledger is not None:
                return self._partial_plan(rf.offset)
            case PeerProbe(probe=p) if (ledger is not None and p.what is ProbeWhat.BYTES
                                        and self.may_serve(False)):
                start = min(p.start, ledger.size)
                return ReadPlan(((start, min(ledger.size, start + min(p.count, BLOCK))),))
            case PeerProbed(peer=peer, probed=p) if (
                    p.what is ProbeWhat.BYTES and self._asked(peer, p)):
                return ReadPlan(((p.start, p.start + len(p.data)),))
        return NO_READS

    def _request_plan(self, event: PeerRequest) -> ReadPlan:
        if self.ledger is None:
            return NO_READS
        r = event.request
        plan = self._partial_plan(r.have)
        start, end = self._serve_range(r)
        if start < end:
            plan = ReadPlan((*plan.ranges, self._serve_read(start, end)))
        return plan

    def _partial_plan(self, offset: int) -> ReadPlan:
        ledger = self.ledger
        if ledger is None or offset > ledger.size or ledger.digest_known(offset) is not None:
            return NO_READS
        return ReadPlan(((block_start(offset), offset),))

    def _digest_at(self, offset: int, snap: Snapshot) -> bytes | None:
        ledger = self.ledger
        if ledger is None or offset > ledger.size:
            return None
        known = ledger.digest_known(offset)
        if known is not None:
            return known
        partial = snap.get(block_start(offset), offset)
        if len(partial) != offset - block_start(offset):
            return None  # the file shrank under us; the next look says how
        return ledger.digest_at(offset, partial)

    def _serve_range(self, r: Request) -> tuple[int, int]:
        start = max(r.start, r.have)
        end = min(self.held, start + min(r.length, self.tuning.fetch_window))
        return start, end

    def _serve_read(self, start: int, end: int) -> tuple[int, int]:
        """The bytes read to serve [start, end): whole blocks (or up to our end), so that
        every byte sent is checked against the ledger first."""
        last = min(self.held, -(-end // BLOCK) * BLOCK)
        return block_start(start), last

    # --- dispatch -----------------------------------------------------------------------------

    def handle(self, event: Event, snap: Snapshot, now: float, wall: float) -> list[Effect]:
        """Decide what `event` means for this file; return what the shell must do, in order."""
        out: list[Effect] = []
        # The events of every replicated write come first: each case is another class, so
        # their order decides nothing, and a match tries them one after the other.
        match event:
            case Look(replaced=replaced, full=full):
                self._on_look(replaced, full, snap, now, wall, out)
            case PeerData():
                self._on_data(event, snap, now, wall, out)
            case Appended():
                self._on_appended(event, now, wall, out)
            case Synced():
                self._on_synced(now, wall, out)
            case Drained():
                if self.unsynced:
                    out.append(Sync(local=False))
                else:
                    self._persist(now, out)
            case Tick():
                self._on_tick(now, wall, out)
            case Loaded():
                self._on_loaded(event, snap, now, wall, out)
            case LoadFailed(detail=detail):
                self._on_load_failed(detail, now, out)
            case Rehashed():
                self._on_rehashed(event, snap, now, wall, out)
            case Reconnected():
                if self.mode not in (Mode.LOADING, Mode.UNREADABLE):
                    self._announce(now, out, at_once=True)
                    self._maybe_fetch(now, out)
            case PeerForgotten(peer=peer):
                self._forget(peer, now, out)
            case PeerOnline(peer=peer, online=online):
                self.online[peer] = online
                self._maybe_fetch(now, out)
            case PeerPos():
                self._on_announce(event.peer, event.announce, snap, now, wall, out)
            case Reassess(peer=peer):
                view = self.peers.get(peer)
                if view is not None:
                    self._assess(peer, view, snap, now, wall, out, reread=False)
            case PeerRequest(peer=peer, request=r):
                self._on_request(peer, r, snap, now, wall, out)
            case PeerRefuse(peer=peer, refuse=rf):
                ours = self._digest_at(rf.offset, snap)
                if ours is not None and ours != rf.digest:
                    self.refusals[peer] = Refuse(rf.offset, ours)  # so that it learns ours
                    self._diverge(peer, rf.offset, f"{peer} holds a different prefix of "
                                  f"{rf.offset} bytes", now, wall, out)
            case PeerProbe(peer=peer, probe=p):
                self._answer_probe(peer, p, snap, out)
            case PeerProbed(peer=peer, probed=p):
                self._narrow(peer, p, snap, out)
            case LineFound():
                self._on_line_found(event, now, out)
            case AppendFailed(kind=kind, detail=detail):
                self._on_append_failed(kind, detail, now, wall, out)
            case SyncFailed(detail=detail):
                self._set_trouble("error", f"cannot make {self.file} durable: {detail}", now,
                                  wall, out)
            case AdoptRequested(source=source, ticket=ticket):
                self._on_adopt(source, ticket, now, wall, out)
            case Archived(path=path):
                self._on_archived(path, now, wall, out)
            case ArchiveFailed(detail=detail):
                out.append(Log(logging.ERROR, f"{self.name}: cannot archive the local copy: "
                                              f"{detail}; nothing was changed"))
                if self.adoption is not None:
                    out.append(AdoptDone(self.adoption.ticket, {"error": detail}))
                    self.adoption = None
            case ScrubMismatch():
                if self.mode is Mode.ADOPTING and self.ledger is not None:
                    # Bytes we took (and may have served) are not in the file any more.
                    self._adoption_spoiled("the background scrub found other bytes in the "
                                           "local file", out)
                elif self.mode in (Mode.LIVE, Mode.FROZEN) and self.ledger is not None:
                    out.append(Rehash("check", hold=self.held,
                                      why="the background scrub found other bytes"))
            case IoFailed(event=failed, detail=detail):
                self._on_io_failed(failed, detail, now, wall, out)
            case RoleChanged(role=role):
                self.role = role
                self._maybe_fetch(now, out)
        self._flush_announce(now, out)
        return out

    def deadline(self) -> float | None:
        """When this machine wants a Tick (monotonic), if at all."""
        times = [t for t in (
            self.fetch.deadline if self.fetch else None,
            self.paused.retry_at if self.paused and not self.paused.retrying else None,
            self.failing.retry_at if self.failing else None,
            self.reload_at,
            self.announce_due,
            self.settle.since + SETTLE if self.settle else None,
            self._unsettled_due(),
            (self.last_announce + self.tuning.reannounce
             if self.mode in (Mode.LIVE, Mode.FROZEN, Mode.ADOPTING) else None),
            (self.last_persist + self.tuning.persist_interval) if self._persist_ready()
            else None,
        ) if t is not None]
        for peer, f in self.diverged.items():
            unaware = peer in self.refusals and not self.knows_of_fork(peer)
            if (f.line is None or unaware) and self.online.get(peer) and self.ledger is not None:
                times.append(self.locating.get(peer, float("-inf")) + LOCATE_RETRY)
        return min(times) if times else None

    # --- start-up -----------------------------------------------------------------------------

    def _on_loaded(self, ev: Loaded, snap: Snapshot, now: float, wall: float,
                   out: list[Effect]) -> None:
        if self.mode is not Mode.LOADING:
            return
        self.load_error = None
        if ev.problem:
            out.append(Log(logging.WARNING, f"{self.name}: {ev.problem}; rehashing the file"))
        rec = ev.record
        st = snap.stat
        self.file_stat = st
        if rec is None:
            if st is None:
                self._start(Ledger(self.records), None, now, wall, out)
            else:
                self.appending = ev.appending
                if self.appending is not None:  # as below: bytes past our (empty) record
                    out.append(NoteAppending(self.appending, durable=True))
                out.append(Rehash("load"))
            return
        self._record, self._record_chain = rec, ev.chain
        self.freeze, self.diverged, self.note = rec.freeze, dict(rec.diverged_peers), rec.note
        self.intent, self.appending = rec.intent, rec.appending
        self.position = Position(rec.size, rec.digest)
        if self.freeze is not None and self.freeze.reason == "reset":
            # Still reset: keep announcing what we last held, as before the restart. The file
            # is another history now; rehashing it (its inode may even be the old one, reused)
            # would announce that history while frozen, and the peers would diverge from it.
            self._finish_load_frozen(out)
            return
        if st is None:
            if rec.size > 0:
                if self.freeze is None:
                    self._freeze("reset", f"file deleted while syncd was stopped (held "
                                 f"{rec.size} bytes)", now, wall, out, keep=True)
                self._finish_load_frozen(out)
            else:
                self._start(Ledger(self.records), None, now, wall, out)
            return
        if rec.size > 0 and st.inode != (rec.dev, rec.ino):
            if self.freeze is None:
                self._freeze("reset", "file replaced (new inode) while syncd was stopped",
                             now, wall, out, keep=True)
            self._finish_load_frozen(out)
            return
        if st.size < rec.size:
            if self.freeze is None:
                self._freeze("reset", f"file shrank from {rec.size} to {st.size} bytes while "
                             "syncd was stopped", now, wall, out, keep=True)
            self._finish_load_frozen(out)
            return
        unchanged = (st.size, st.mtime_ns, st.ctime_ns) == (rec.file_size, rec.mtime_ns,
                                                            rec.ctime_ns)
        partial = snap.get(block_start(rec.size), rec.size)
        if (unchanged and len(ev.chain) > rec.size // BLOCK
                and len(partial) == rec.size - block_start(rec.size)
                and hashlib.sha256(partial).digest() == rec.partial):
            ledger = Ledger.restore(ev.chain, rec.size, partial, self.records)
            self._start(ledger, st, now, wall, out)
            return
        # Changed while we were away (appended, or edited): rehash before trusting anything.
        # Bytes we recorded as held count as ours even mid-line, and so do a peer's pieces
        # we were appending when we stopped (the intent), never a local writer's torn line.
        hold = rec.size
        intent = rec.intent
        if intent is not None and intent[1] <= rec.size < intent[2] <= st.size:
            # Only if the whole piece is still there, and only once the file's prefix is checked
            # to have the digest we recorded: a writer's torn line may sit there instead.
            hold = intent[2]
            self._intent_check = (intent[2], bytes.fromhex(intent[3]))
        if self.appending is not None and st.size > rec.size:
            # What a kill cut short may sit past our end until a peer's bytes explain it:
            # the note must now outlive a power loss too (the file's bytes will be synced).
            out.append(NoteAppending(self.appending, durable=True))
        out.append(Rehash("load", hold=hold))

    def _finish_load_frozen(self, out: list[Effect]) -> None:
        self._record = None
        self._enter(Mode.FROZEN)
        out.append(Send(Kind.POS, self._announcement(), retain=True))

    def _start(self, ledger: Ledger, st: Stat | None, now: float, wall: float,
               out: list[Effect]) -> None:
        """Loading is over: `ledger` describes the file."""
        self._record = None
        self.ledger = ledger
        self._adopt_stat(st)
        self.position = Position(ledger.size, ledger.digest())
        self.record_dirty = True
        self._enter(Mode.FROZEN if self.frozen else Mode.LIVE)
        out.append(LogCheck(restart=False))
        if self._rebuilt and ledger.size:
            # Hashed from the file as it is: the writer's last bytes may not be durable yet.
            out.append(Sync(local=True))
        out.append(Send(Kind.POS, self._announcement(), retain=True))
        self.last_announce = now
        out.append(LookAgain())

    def _on_load_failed(self, detail: str, now: float, out: list[Effect]) -> None:
        if self.load_error is None:
            out.append(Log(logging.ERROR, f"{self.name}: {detail}; this file is not "
                           f"replicated until it can be read (retrying every "
                           f"{RELOAD_RETRY:g}s)"))
        self.load_error = detail
        if self.mode is Mode.LOADING:
            self._enter(Mode.UNREADABLE)
        self.reload_at = now + RELOAD_RETRY

    def _on_rehashed(self, ev: Rehashed, snap: Snapshot, now: float, wall: float,
                     out: list[Effect]) -> None:
        fresh = ev.ledger
        if ev.purpose == "load":
            if self.mode is not Mode.LOADING:
                return
            rec = self._record
            if fresh is None:  # vanished while we hashed
                if rec is None or rec.size == 0:
                    self._start(Ledger(self.records), None, now, wall, out)
                else:
                    if self.freeze is None:
                        self._freeze("reset", "file deleted while syncd was starting", now,
                                     wall, out, keep=True)
                    self._finish_load_frozen(out)
                return
            check = self._intent_check
            self._intent_check = None
            if check is not None and rec is not None:
                end, digest = check
                partial = snap.get(block_start(end), end)
                if not (fresh.size >= end and len(partial) == end - block_start(end)
                        and fresh.digest_at(end, partial) == digest):
                    # Not the peer's bytes we wrote: hash again without them (they are local).
                    self.intent = None
                    out.append(Rehash("load", hold=rec.size))
                    return
            ok = True
            where = 0
            if rec is not None:
                partial = snap.get(block_start(rec.size), rec.size)
                ok = (fresh.size >= rec.size
                      and len(partial) == rec.size - block_start(rec.size)
                      and fresh.digest_at(rec.size, partial) == rec.digest)
                if not ok:
                    where = first_change(self._record_chain, None, rec.size, fresh.chain,
                                         fresh.tail, fresh.size)
            self._rebuilt = True
            self._start(fresh, snap.stat, now, wall, out)
            if self.intent is not None and fresh.size >= self.intent[2]:
                self.intent = None
            if not ok:
                self._noticed_edit(where, "while syncd was stopped", now, out)
            return
        if ev.purpose == "keep":
            self._keep_local(fresh, snap.stat, now, wall, out)
            return
        ledger = self.ledger
        if ledger is None or self.mode not in (Mode.LIVE, Mode.FROZEN):
            return
        if fresh is None:
            self._local_reset(f"file deleted (held {ledger.size} bytes)", now, wall, out)
            return
        if ev.purpose == "check":
            if fresh.size >= ledger.size:
                partial = snap.get(block_start(ledger.size), ledger.size)
                if (len(partial) == ledger.size - block_start(ledger.size)
                        and fresh.digest_at(ledger.size, partial) == ledger.digest()):
                    return  # every byte we vouched for is still there
            where = first_change(ledger.chain, ledger.tail, ledger.size, fresh.chain,
                                 fresh.tail, fresh.size)
            self._replace_history(fresh, snap.stat, where, ev.why, now, out)
        elif ev.purpose == "shrunk":
            if fresh.size < ledger.size and ledger.is_prefix_of_ours(fresh) is False:
                # Bytes inside changed: an edit that shortened the file (the runbook's
                # "delete the bad line"), not a truncation. Describe it as it is (whole lines).
                out.append(Rehash("rewritten", why=f"file rewritten shorter, {ledger.size} -> "
                                  f"{fresh.size} bytes"))
                return
            self._local_reset(f"file truncated from {ledger.size} to {fresh.size} bytes", now,
                              wall, out)
        elif ev.purpose == "rewritten":
            where = first_change(ledger.chain, ledger.tail, ledger.size, fresh.chain,
                                 fresh.tail, fresh.size)
            self._replace_history(fresh, snap.stat, where, ev.why, now, out)

    # --- the local file -----------------------------------------------------------------------

    def _adopt_stat(self, st: Stat | None) -> None:
        self.file_stat = st
        self.inode = st.inode if st else None
        # `seen` means "judged at this size and time": only when the ledger covers the file.
        # A stat taken after a rehash may show bytes appended meanwhile, which a look must
        # still find (else they stay unshipped until the next write).
        self.seen = (st.size, st.mtime_ns) if st and st.size == self.held else None

    def _on_look(self, replaced: bool, full: bool, snap: Snapshot, now: float, wall: float,
                 out: list[Effect]) -> None:
        ledger = self.ledger
        st = snap.stat
        self.file_stat = st  # kept current even while frozen: status shows both sizes
        if ledger is None or self.mode not in (Mode.LIVE, Mode.FROZEN, Mode.ADOPTING):
            return
        if replaced:
            if now < self.own_removal_until:
                self.own_removal_until = float("-inf")  # our archive's own move
            elif ledger.size > 0:
                what = "deleted" if st is None else "deleted or renamed over, then recreated"
                self._local_reset(f"file {what} (held {ledger.size} bytes)", now, wall, out)
                return
        if not full:
            stat_now = (st.dev, st.ino, st.size, st.mtime_ns) if st else None
            if judge_local(ledger.size, self.inode, self.seen, stat_now, None) is not \
                    LocalChange.NONE:
                out.append(Redeliver(Look(full=True, size=st.size if st else -1)))
                return  # judged again with the bytes it needs
            self.settle = None
            self._look_worked(out)
            return  # judged on the stat alone: nothing changed
        self._look_worked(out)
        self._judge_local(snap, now, wall, out)

    def _look_worked(self, out: list[Effect]) -> None:
        if self.failing is not None and not self.failing.detail.startswith("cannot make"):
            out.append(Log(logging.WARNING, f"{self.name}: the file can be read again "
                                            f"({self.failing.attempts} failed looks)"))
            self.failing = None

    def _judge_local(self, snap: Snapshot, now: float, wall: float, out: list[Effect]) -> None:
        ledger = self.ledger
        assert ledger is not None
        st = snap.stat
        tail: bool | None = None
        if st is not None and st.size >= ledger.size:
            got = _first_read(snap)
            tail = ledger.matches_end(got[: ledger.size - ledger.recheck_start()])
        stat_now = (st.dev, st.ino, st.size, st.mtime_ns) if st else None
        change = judge_local(ledger.size, self.inode, self.seen, stat_now, tail)
        if ledger.size == 0 and st is not None:
            self.inode = st.inode  # an empty history holds nothing to lose: any file is ours
        if change is not LocalChange.SHRUNK:
            self.settle = None
        if change is not LocalChange.GROWTH:
            self.unsettled = None  # what was held back is gone (rolled back) or never was
        if change is LocalChange.NONE:
            return
        if self.mode is Mode.ADOPTING:
            if change in (LocalChange.REPLACED, LocalChange.SHRUNK) and self.adoption:
                # Someone removed or cut the copy we are building: the adoption cannot end
                # well. Say so to the operator, and freeze what is there as a reset.
                ad = self.adoption
                self.adoption = None
                out.append(AdoptDone(ad.ticket, {"error": "the local file was removed or cut "
                                                          "while it was being adopted"}))
                self._enter(Mode.LIVE)
                self._local_reset(f"file changed ({change.value}) while adopting "
                                  f"{ad.peer}'s copy", now, wall, out)
            elif change in (LocalChange.EDITED, LocalChange.TOUCHED):
                # Bytes we took (and may have served: an adopting copy serves what it took)
                # changed here: judge the copy again as a live one does, never vouch on.
                self._adoption_spoiled(f"the local file was edited ({change.value}) while it "
                                       "was being adopted", out)
            return  # else the operator stopped the bot here; the adopted copy is what counts
        if change is LocalChange.REPLACED:
            what = "deleted" if st is None else "replaced (new inode)"
            self._local_reset(f"file {what}; held {ledger.size} bytes", now, wall, out)
            return
        if change is LocalChange.SHRUNK:
            # A rewrite (truncate, then write) passes through "shorter": judge the file only
            # once it has held still for a moment.
            assert st is not None
            seen = (st.ino, st.size, st.mtime_ns)
            if self.settle is None or self.settle.seen != seen:
                self.settle = Settle(seen, now)
            elif now >= self.settle.since + SETTLE:
                self.settle = None
                out.append(Rehash("shrunk", whole_lines=False))
            return
        assert st is not None
        if self.inode is None:
            self.inode = st.inode
        if change in (LocalChange.EDITED, LocalChange.TOUCHED):
            why = ("bytes below the end changed" if change is LocalChange.EDITED
                   else "changed without growing")
            out.append(Rehash("check", hold=ledger.size, why=why))
            return
        self.file_stat = st
        if self.mode is not Mode.LIVE and self.mode is not Mode.FROZEN:
            self.seen = (st.size, st.mtime_ns)
            return
        line_end = snap.line_end if snap.line_end is not None else ledger.size
        if self.role == "replica" and line_end > ledger.size:
            self._freeze("diverged", "local write on a host whose role for this key is "
                         f"'replica' (bytes past offset {ledger.size})", now, wall, out,
                         offset=ledger.size)
            return
        if self._held_back(line_end > ledger.size, st, now):
            return
        self._ship(snap, line_end, st, now, out, send=self.may_ship())

    def _held_back(self, growth: bool, st: Stat, now: float) -> bool:
        """Whether the writer's new whole records wait, unrecorded and unshipped, because the
        file changed less than `hold_back` seconds ago (docs/design.md, "A writer's rollback").

        A writer that rolls a failed batch back (dsh-session truncates the file to its
        previous length after a failed write or sync) does so right after the write or the
        sync returns. Records shipped meanwhile would be bytes the standbys keep and the writer
        withdrew; records still held are only unshipped bytes, whose truncation is no event.
        A file that never holds still ships after HOLD_BACK_MAX holds anyway."""
        if not growth or self.hold_back <= 0:
            self.unsettled = None
            return False
        seen = (st.size, st.mtime_ns)
        u = self.unsettled
        if u is None or u.seen != seen:
            u = self.unsettled = Unsettled(seen, now, u.first if u is not None else now)
        if now >= u.since + self.hold_back or now >= u.first + HOLD_BACK_MAX * self.hold_back:
            self.unsettled = None
            return False
        u.looked = False
        return True

    def _unsettled_due(self) -> float | None:
        u = self.unsettled
        if u is None or u.looked:
            return None
        return min(u.since + self.hold_back, u.first + HOLD_BACK_MAX * self.hold_back)

    def _ship(self, snap: Snapshot, line_end: int, st: Stat, now: float,
              out: list[Effect], send: bool = True) -> None:
        """Send local growth: whole records only, of bytes just re-read (the tail included).

        A frozen copy that still knows its file (not reset) records its local lines without
        sending them: its position then describes its file, so that an operator who adopts it
        gets the copy as it is now. A copy diverged from some peers is not frozen: it ships to
        all (a diverged peer takes nothing from us), and its position describes its file too.
        """
        ledger = self.ledger
        assert ledger is not None
        start = ledger.size
        first = ledger.recheck_start()
        new = _first_read(snap)[start - first:]
        read_end = start + len(new)
        if line_end <= read_end:
            end = line_end
        else:
            cut = recordkinds.last_end(self.records, new)
            # A backlog larger than one read: ship its whole records now, the rest next look.
            # A single record longer than the read (and complete: line_end is past it) goes
            # in pieces of the read's size.
            end = start + cut if cut > 0 else read_end
        pos = start
        chunk = self.tuning.chunk_bytes
        while pos < end:
            n = recordkinds.piece_end(self.records, new, pos - start, end - start, chunk) \
                - (pos - start)
            data = new[pos - start: pos - start + n]
            if send:
                out.append(Send(Kind.LIVE, Data(pos, ledger.digest(), data)))
                self.counters["shipped_bytes"] += n
                self.counters["shipped_frames"] += 1
            ledger.extend(data)
            pos += n
        if line_end > pos:
            out.append(LookAgain())  # more whole lines than one read: `seen` stays behind
        else:
            self.seen = (st.size, st.mtime_ns)  # nothing more to ship at this size and time
        if pos > start:
            out.append(Sync(local=True))

    def _local_reset(self, detail: str, now: float, wall: float, out: list[Effect]) -> None:
        """Our file is not the history we hold any more (deleted, replaced, truncated): freeze
        here and nowhere else. We neither pour the old history back into the new file nor push
        the reset to the peers; they see it in our announcement."""
        if self.freeze is None:
            self._freeze("reset", detail, now, wall, out)
        elif self.freeze.reason != "reset":
            # Frozen already, and now the file itself is gone or another: say so, and stop
            # describing a file that is not there.
            self._freeze("reset", f"{detail}; it was frozen before: {self.freeze.detail}", now,
                         wall, out)

    def _replace_history(self, fresh: Ledger, st: Stat | None, where: int, why: str,
                         now: float, out: list[Effect]) -> None:
        """Bytes we had already vouched for changed here: describe the file as it is now.

        We do not freeze on our own: announcing the new digest makes every peer that holds the
        old bytes see a divergence (and us see theirs), while a peer that never had them may
        still fast-forward. That is the reconcile rule, applied to the copy we hold.
        """
        self.ledger = fresh
        self._rebuilt = True
        self._adopt_stat(st)
        self.position = Position(fresh.size, fresh.digest())
        self._noticed_edit(where, why, now, out)

    def _noticed_edit(self, where: int, why: str, now: float, out: list[Effect]) -> None:
        self.note = (f"bytes already replicated were changed locally ({why}); first "
                     f"difference in the 64 KiB block at offset {block_start(where)}")
        out.append(Log(logging.WARNING, f"{self.name}: {self.note}"))
        for view in self.peers.values():
            view.verified = view.forked = False
        self.record_dirty = True
        out.append(LogCheck(restart=True))
        out.append(Sync(local=True))  # durable before announced, edited bytes included
        self._announce(now, out, at_once=True)

    # --- peers --------------------------------------------------------------------------------

    def _on_announce(self, peer: str, a: Announce, snap: Snapshot, now: float, wall: float,
                     out: list[Effect]) -> None:
        old = view = self.peers.get(peer)
        pos = Position(a.size, a.digest)
        if view is None or view.position != pos:
            view = LogPeer(pos, a.frozen)
            self.peers[peer] = view
        view.heard_at = wall
        if old is not None and view is not old:  # readiness bookkeeping survives a new position
            view.grew_at, view.ahead_since = old.grew_at, old.ahead_since
            view.frozen_since = old.frozen_since
        if old is not None and pos.size > old.position.size:
            view.grew_at = wall
        if old is not None and view is not old:
            view.disputes_since = old.disputes_since
        if a.frozen is None:
            view.frozen_since = None
        elif old is None or old.frozen != a.frozen or view.frozen_since is None:
            view.frozen_since = wall
        view.frozen = a.frozen
        if not a.diverged:
            view.disputes_since = None
        elif view.disputes_since is None:
            view.disputes_since = wall
        view.diverged = a.diverged
        ad = self.adoption
        if ad is not None and ad.peer == peer and ad.ask and a.answers == ad.ask:
            ad.fresh = pos  # announced in reply to our request, so after it
        self._assess(peer, view, snap, now, wall, out)
        self._check_adopted(now, out)
        self._maybe_fetch(now, out)

    def _assess(self, peer: str, view: LogPeer, snap: Snapshot, now: float, wall: float,
                out: list[Effect], reread: bool = True) -> None:
        if view.position.size <= self.position.size:
            view.ahead_since = None
        elif view.ahead_since is None:
            view.ahead_since = wall
        ledger = self.ledger
        if ledger is None:
            return
        theirs = view.position
        if view.verified:
            view.state = PeerState.IN_SYNC if theirs.size == ledger.size else PeerState.BEHIND
        elif view.forked:
            view.state = PeerState.DIVERGED
        elif theirs.size > ledger.size:
            view.state = PeerState.AHEAD
            if ((view.frozen is not None or self.node in view.diverged) and not view.probed
                    and peer not in self.diverged and self.mode is not Mode.ADOPTING):
                # We will not fetch from a frozen peer, nor from one that says our copies
                # differ, so ask it once whether our prefix is its prefix: a zero-length
                # request is answered only by a refusal. (Known diverged: nothing to ask.)
                view.probed = True
                out.append(Send(Kind.REQ, Request(ledger.size, ledger.digest(), ledger.size, 0),
                                to=peer))
        else:
            ours = self._digest_at(theirs.size, snap)
            if ours is None:
                # Needs bytes of an older block: read them, then judge. If they were read and
                # are not there, the file shrank under us: the look says how.
                out.append(Reassess(peer) if reread else LookAgain())
                return
            view.state = judge_peer(Position(ledger.size, ledger.digest()), theirs, ours)
            view.verified = view.state is not PeerState.DIVERGED
            view.forked = not view.verified
            if view.forked:
                self.refusals[peer] = Refuse(theirs.size, ours)
                self._diverge(peer, theirs.size, f"{peer} announced a copy of {theirs.size} "
                              "bytes whose prefix differs from ours", now, wall, out)
        found = self.diverged.get(peer)
        if found is None:
            return
        if view.verified and self._fork_gone(found, view):
            # Its copy now holds our bytes where the copies parted: it adopted ours (or we
            # adopted its). Content decides, not what the peer says of itself.
            del self.diverged[peer]
            self.refusals.pop(peer, None)
            self.locating.pop(peer, None)
            self.probing.pop(peer, None)
            self.record_dirty = True
            out.append(Log(logging.WARNING, f"{self.name}: {peer}'s copy is consistent with "
                                            "ours again; divergence with it cleared"))
            self._persist(now, out, force=True)
            self._announce(now, out, at_once=True)  # it learns that we no longer refuse it
        else:
            view.state = PeerState.DIVERGED

    @staticmethod
    def _fork_gone(found: Freeze, view: LogPeer) -> bool:
        """Whether a peer's position, consistent with our copy, covers the point where the
        copies parted. A consistent position short of it says nothing (an old announcement,
        from before its other bytes); one past it holds our bytes there. An adopting peer is
        judged on the copy it ends with."""
        at = found.offset or 0
        # Located: `offset` is the first differing byte. Not yet: the prefixes of length
        # `offset` differ, so some byte below it does.
        need = at + 1 if found.ours is not None else at
        return view.position.size >= need and view.frozen != "adopting"

    def _on_data(self, ev: PeerData, snap: Snapshot, now: float, wall: float,
                 out: list[Effect]) -> None:
        """Append a peer's bytes if they extend ours; never onto anything we did not record."""
        peer, d = ev.peer, ev.data
        ledger = self.ledger
        if ledger is None or not self.may_accept(peer, now):
            return
        verdict = judge_data(Position(ledger.size, ledger.digest()), d.offset, d.base)
        if verdict is Verdict.GAP:
            self._maybe_fetch(now, out)
            return
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.DIVERGED:
            self.refusals[peer] = Refuse(ledger.size, ledger.digest())
            self._diverge(peer, d.offset, f"{peer} sent bytes at {d.offset} after a prefix "
                          "that differs from ours", now, wall, out)
            return
        st = snap.stat
        if not ev.look and self.mode is not Mode.ADOPTING:
            untouched = (st is not None and st.inode == self.inode
                         and (st.size, st.mtime_ns) == self.seen and st.size == ledger.size)
            if not untouched:
                # Changed since we last wrote or judged it: read below our end and judge.
                out.append(Redeliver(PeerData(peer, d, ev.retried, look=True)))
                return
        elif self.mode is not Mode.ADOPTING:
            # The same question as for the writer's own bytes: is our history still a prefix
            # of the file, at the inode we describe, with nothing unrecorded past our end?
            stat_now = (st.dev, st.ino, st.size, st.mtime_ns) if st else None
            got = _first_read(snap)
            tail = (ledger.matches_end(got[: ledger.size - ledger.recheck_start()])
                    if st is not None and st.size >= ledger.size else None)
            change = judge_local(ledger.size, self.inode, None, stat_now, tail)
            past_end = st is not None and st.size > ledger.size
            if change is not LocalChange.NONE:
                if not ev.retried:
                    # Local bytes first (ship whole lines, or notice a reset or an edit), then
                    # judge this frame again on what the file holds then.
                    self._judge_local(snap, now, wall, out)
                    out.append(Redeliver(PeerData(peer, d, retried=True, look=True)))
                elif past_end and change is LocalChange.GROWTH:
                    local = got[ledger.size - ledger.recheck_start():]
                    assert st is not None
                    ours = _maybe_cut_short(self.appending, ledger.size, st.size)
                    if (ours and local and d.data.startswith(local)
                            and _cut_short_is_ours(self.appending, ledger.size, local, d)):
                        self._take_cut_short(ev, local, st, now, wall, out)
                    else:
                        self._torn_local_line(peer, local, ours, now, wall, out)
                return  # otherwise dropped: anti-entropy asks for it again
        if st is not None and (self.inode is None or ledger.size == 0):
            self.inode = st.inode
        if ledger.ends_record_with(d.data) is not True:
            # A piece of a long record (line or frame): record durably that the bytes past
            # our end will be this peer's, so that a restart does not take them for a local
            # torn record.
            if self.unsynced or self.position.size != ledger.size:
                # The intent covers exactly this piece, on top of the size recorded with it:
                # bytes appended before it (a burst of frames: the previous piece, whole
                # lines) must be durable and recorded first. Else a kill between this intent
                # and its append (the intent then names an end the file never reached), or
                # before the record catches up with the sync (the intent then starts past
                # the recorded size), leaves them past the recorded end, unrecognised: taken
                # for a local torn line, they freeze the file as diverged.
                out.append(Sync(local=False))
                if self.failing is None or not self.failing.detail.startswith("cannot make"):
                    out.append(Redeliver(ev))
                return  # while syncs fail: dropped, anti-entropy asks for it again
            self.intent = (peer, d.offset, d.end, ledger.digest_with(d.data).hex())
            out.append(self._persist_record(durable=True))
        if d.offset // PAGE != (d.end - 1) // PAGE:
            # A write() that a kill or a power loss may cut short mid-line (an intent vouches
            # only for the whole piece): say so first, with the piece's digest. Not synced:
            # an fsync per frame doubled the replication lag (docs/design.md). A power loss
            # may keep some of the piece's pages and drop the note; bytes past our end without
            # one are then taken for a local writer's torn line: a false divergence, frozen
            # until `adopt` (issue #23 case 9, accepted), never a splice. Up to this piece's
            # end only: a wider range (a fetch's window) would vouch for a local writer's torn
            # line after it (the simulator found one). From the start of the line it
            # continues, if that line is unfinished here (a restart counts whole lines only,
            # so bytes of ours before this piece would sit past our end too), and from the
            # first byte not yet synced: a power loss may cut any unsynced append, not only
            # this one (seed 3164 of the simulator with power cuts that keep a page-cut tail).
            start = ledger.open_line_start
            first = min(d.offset if start is None else min(start, d.offset),
                        max(0, ledger.size - self.unsynced))
            self.appending = (peer, first, d.offset, d.end, hashlib.sha256(d.data).hexdigest())
            out.append(NoteAppending(self.appending))
        out.append(Append(d.offset, d.data, self.inode if st is not None else None, peer))

    def _torn_local_line(self, peer: str, local: bytes, ours: bool, now: float, wall: float,
                         out: list[Effect]) -> None:
        """An unfinished line sits past our end while `peer` sends other bytes for the same
        offset: a local writer's, or (`ours`) what an append of ours cut short left of the
        history a peer held then. Two histories: never splice them: freeze, and tell the peer
        what our file holds there so that it sees the fork too."""
        ledger = self.ledger
        assert ledger is not None
        at = ledger.size
        if local:
            self.refusals[peer] = Refuse(at + len(local), ledger.digest_with(local))
            out.append(Send(Kind.REFUSE, self.refusals[peer], to=peer))
        # `ours`: inside the range of an append of ours that a kill or a power loss may have
        # cut short, but too few of the piece's bytes to tell from a local writer's line.
        what = ("the start of a line an append of ours cut short may have left (or a local "
                "writer's: too short to tell)" if ours else "unfinished local line")
        self._diverge(peer, at, f"{what} past offset {at} ({len(local)} bytes), while {peer} "
                      "sent other bytes for that offset", now, wall, out)

    def _take_cut_short(self, ev: PeerData, local: bytes, st: Stat, now: float, wall: float,
                        out: list[Effect]) -> None:
        """The bytes past our end are the start of this peer's piece, and end on a page
        boundary inside the range we were appending: an append of ours cut short (killed
        mid-write, or a power loss). An intent vouches only for a whole piece, and a piece of
        whole lines has none. Count them as appended (they are the peer's bytes, exactly), and
        append the rest of the piece."""
        d = ev.data
        out.append(Log(logging.INFO, f"{self.name}: the {len(local)} bytes past offset "
                                     f"{d.offset} are {ev.peer}'s, from an append of ours cut "
                                     "short (killed, or a power loss): kept"))
        self._on_appended(Appended(ev.peer, local, st), now, wall, out)
        ledger = self.ledger
        if ledger is not None and len(local) < len(d.data):
            rest = Data(d.offset + len(local), ledger.digest(), d.data[len(local):])
            out.append(Redeliver(PeerData(ev.peer, rest, look=True)))

    def _on_appended(self, ev: Appended, now: float, wall: float, out: list[Effect]) -> None:
        ledger = self.ledger
        assert ledger is not None
        ledger.extend(ev.data)
        self.unsynced += len(ev.data)
        self.counters["applied_bytes"] += len(ev.data)
        self.counters["applied_frames"] += 1
        self._adopt_stat(ev.stat)
        if self.paused is not None:
            out.append(Log(logging.WARNING, f"{self.name}: writing works again; replication "
                                            "resumed"))
            self.paused = None
        # The sender held exactly these bytes: its position is known without an announcement.
        view = self.peers.get(ev.peer)
        if view is not None:
            view.heard_at = wall
        if view is not None and view.position.size < ledger.size:
            view.position, view.verified = Position(ledger.size, ledger.digest()), True
            view.state = PeerState.IN_SYNC
            view.grew_at = wall
        if self.fetch is not None and self.fetch.peer == ev.peer:
            self.fetch.deadline = now + self.tuning.request_timeout
        if self.unsynced >= self.tuning.fetch_window:
            out.append(Sync(local=False))

    def _on_append_failed(self, kind: str, detail: str, now: float, wall: float,
                          out: list[Effect]) -> None:
        self.intent = self.appending = None  # for this append, which did not happen
        if kind == "concurrent":
            ad = self.adoption
            aborted = ad is not None and self.mode is Mode.ADOPTING
            if ad is not None and aborted:
                # The bot writes here while we adopt: the adoption cannot end well (asking on
                # would only fail the same way, at network speed). Say so, and freeze.
                self.adoption = None
                out.append(AdoptDone(ad.ticket, {"error": "another process wrote to the local "
                                                          "file while it was being adopted"}))
                self._enter(Mode.LIVE)
            self._freeze("diverged", f"another process wrote while applying a peer's bytes: "
                         f"{detail}", now, wall, out, offset=self.held)
            if aborted:
                # Local changes were not judged while adopting: check the whole copy once, as
                # a finished adoption does, so that the record describes the file.
                out.append(Rehash("check", hold=self.held,
                                  why="the file changed while it was being adopted"))
        elif kind == "replaced":
            out.append(LookAgain())  # the look freezes it as a reset, with the details
        else:
            # Disk full, quota, permissions: nothing partial stays behind (the shell takes its
            # own bytes back); stop asking for more until the retry time.
            self.fetch = None
            self._set_trouble("paused", detail, now, wall, out, retry=PAUSE_RETRY)

    def _on_synced(self, now: float, wall: float, out: list[Effect]) -> None:
        ledger = self.ledger
        self.unsynced = 0  # even when reset meanwhile (ledger gone): else an adopt waits forever
        if ledger is None:
            return
        if self.failing is not None and self.failing.detail.startswith("cannot make"):
            self.failing = None
        if self.position.size == ledger.size and self.position.digest == ledger.digest():
            return
        self.position = Position(ledger.size, ledger.digest())
        if self.intent is not None and ledger.size >= self.intent[2]:
            self.intent = None
        out.append(Durable(ledger.size))
        self.record_dirty = True
        for peer, view in self.peers.items():
            self._assess(peer, view, EMPTY, now, wall, out)
        self._announce(now, out)
        out.append(LogCheck())
        self._check_adopted(now, out)
        self._maybe_fetch(now, out)
        self._persist(now, out)

    def _on_request(self, peer: str, r: Request, snap: Snapshot, now: float, wall: float,
                    out: list[Effect]) -> None:
        # Even a frozen file answers "your prefix differs": that is how the others learn.
        ledger = self.ledger
        if ledger is None:
            return
        ours = self._digest_at(r.have, snap) if r.have <= ledger.size else None
        if r.have < ledger.size and ours is None:
            out.append(LookAgain())  # the file shrank under us; the look will say how
            return
        verdict = judge_request(ledger.size, r.have, r.digest, ours)
        if verdict is Verdict.DIVERGED:
            assert ours is not None
            self.refusals[peer] = Refuse(r.have, ours)
            out.append(Send(Kind.REFUSE, self.refusals[peer], to=peer))
            self._diverge(peer, r.have, f"{peer} asked for bytes after a prefix of {r.have} "
                          "bytes that differs from ours", now, wall, out)
            return
        # A peer whose copy differs from ours gets nothing, unless an operator there adopts
        # ours (forced): its copy is then empty or a prefix of ours, and takes only our bytes.
        if verdict is Verdict.APPEND and self.may_serve(r.force) and (
                r.force or peer not in self.diverged):
            self._serve(peer, r, snap, out)
        if r.force:
            # An adopting peer is done only on a position we announce after its request
            # (after the bytes just served): it recognises this one by its `ask`.
            self._announce(now, out, at_once=True, answers=r.ask)

    def _serve(self, peer: str, r: Request, snap: Snapshot, out: list[Effect]) -> None:
        ledger = self.ledger
        assert ledger is not None
        start, end = self._serve_range(r)
        if start >= end:
            return
        first, last = self._serve_read(start, end)
        buf = snap.get(first, last)
        st = snap.stat
        # Unchanged since we last wrote or judged it (size, mtime and inode, as git's index
        # trusts a file): the bytes are the ones we recorded. Otherwise check every block.
        untouched = st is not None and (st.size, st.mtime_ns) == self.seen
        if (len(buf) != last - first or st is None or st.inode != self.inode
                or not (untouched or ledger.holds(first, buf))):
            # Shorter, another file, or bytes changed since we recorded them: never vouch
            # for them. The look (or a full check) says what happened.
            out.append(Rehash("check", hold=ledger.size, why="bytes asked for by a peer changed")
                       if len(buf) == last - first and st is not None
                       and st.inode == self.inode else LookAgain())
            return
        pos = start
        chunk = self.tuning.chunk_bytes
        while pos < end:
            stop = first + recordkinds.piece_end(self.records, buf, pos - first, end - first,
                                                 chunk)
            base = ledger.digest_at(pos, buf[block_start(pos) - first: pos - first])
            piece = buf[pos - first: stop - first]
            out.append(Send(Kind.FILL, Data(pos, base, piece), to=peer))
            self.counters["served_bytes"] += len(piece)
            self.counters["served_frames"] += 1
            pos = stop

    def _forget(self, peer: str, now: float, out: list[Effect]) -> None:
        self.peers.pop(peer, None)
        self.online.pop(peer, None)
        self.locating.pop(peer, None)
        self.probing.pop(peer, None)
        if self.fetch is not None and self.fetch.peer == peer:
            self.fetch = None
        self.refusals.pop(peer, None)
        if self.diverged.pop(peer, None) is not None:
            out.append(Log(logging.WARNING, f"{self.name}: divergence with {peer} dropped: that "
                                            "node was retired (syncd forget)"))
            self.record_dirty = True
            self._persist(now, out, force=True)
            self._announce(now, out, at_once=True)
        self._maybe_fetch(now, out)

    # --- fetching -----------------------------------------------------------------------------

    def _maybe_fetch(self, now: float, out: list[Effect]) -> None:
        ledger = self.ledger
        ad = self.adoption
        if ledger is None or (ad is None and not self.may_accept_any(now)):
            self.fetch = None
            return
        if ad is not None:
            view = self.peers.get(ad.peer)
            candidates = {ad.peer: (view.position.size if view else 0,
                                    self.online.get(ad.peer, False))}
        else:
            # Never a frozen or adopting copy, nor one whose history differs from ours (either
            # side may know it first: a peer that names us would only refuse).
            candidates = {
                node: (v.position.size, v.frozen is None and node not in self.diverged
                       and self.node not in v.diverged and self.online.get(node, False))
                for node, v in self.peers.items()
            }
        source = choose_source(ledger.size, candidates)
        if source is None:
            if (ad is not None and self.mode is Mode.ADOPTING and ad.ask
                    and ad.fresh != self.position and self.online.get(ad.peer, False)):
                # We hold as much as the winner announced, but no answer to our asking
                # describes our copy (its history moved under us, an answer was lost): ask
                # again, on the request timer, until a fresh answer says where it stands.
                if self.fetch is None:
                    out.append(Send(Kind.REQ, Request(ledger.size, ledger.digest(), ledger.size,
                                                      self.tuning.fetch_window, force=True,
                                                      ask=ad.ask), to=ad.peer))
                    self.fetch = Fetch(ad.peer, ledger.size,
                                       now + self.tuning.request_timeout)
                return
            self.fetch = None
            return
        window = self.tuning.fetch_window
        peer_size = self.peers[source].position.size
        f = self.fetch
        if f is not None and f.peer == source:
            if f.upto >= peer_size or f.upto - ledger.size >= window // 2:
                return  # enough already on its way
            start = max(ledger.size, f.upto)
        else:
            start = ledger.size
        out.append(Send(Kind.REQ, Request(ledger.size, ledger.digest(), start, window,
                                          force=ad is not None, ask=ad.ask if ad else 0),
                        to=source))
        self.fetch = Fetch(source, start + window, now + self.tuning.request_timeout)

    def may_accept_any(self, now: float) -> bool:
        return (self.mode is Mode.LIVE and self.role != "source"
                and (self.paused is None or not self.paused.blocks_appends()))

    # --- time ---------------------------------------------------------------------------------

    def _on_tick(self, now: float, wall: float, out: list[Effect]) -> None:
        if self.mode is Mode.UNREADABLE:
            if self.reload_at is not None and now >= self.reload_at:
                self.reload_at = None
                self._enter(Mode.LOADING)
                out.append(Reload())
            return
        if self.fetch is not None and now >= self.fetch.deadline:
            out.append(Log(logging.INFO, f"{self.name}: no answer from {self.fetch.peer} for "
                                         f"bytes up to {self.fetch.upto}; asking again"))
            self.fetch = None
        t = self.failing
        if t is not None and now >= t.retry_at:
            t.retry_at = now + min(LOOK_RETRY_MAX, LOOK_RETRY_MIN * 2 ** t.attempts)
            out.append(LookAgain())
        p = self.paused
        if p is not None and not p.retrying and now >= p.retry_at:
            p.retrying = True  # fetch again; a failing append pauses us again
            self._maybe_fetch(now, out)
            if self.fetch is None:
                self.paused = None  # nothing left to write: not paused any more
        if self.settle is not None and now >= self.settle.since + SETTLE:
            out.append(LookAgain())
        if (due := self._unsettled_due()) is not None and now >= due:
            assert self.unsettled is not None
            self.unsettled.looked = True  # a look judges the file again (or it changed)
            out.append(LookAgain())
        if now >= self.last_announce + self.tuning.reannounce:
            self._announce(now, out, at_once=True)
        for peer, f in list(self.diverged.items()):
            asked = self.locating.get(peer)
            due = asked is None or now >= asked + LOCATE_RETRY
            unaware = not self.knows_of_fork(peer)
            if due and (f.line is None or (unaware and peer in self.refusals)):
                self._locate(peer, now, out)
        self._maybe_fetch(now, out)
        self._persist(now, out)

    def _set_trouble(self, kind: str, detail: str, now: float, wall: float,
                     out: list[Effect], retry: float = LOOK_RETRY_MIN) -> None:
        t = self.paused if kind == "paused" else self.failing
        if t is None:
            what = "PAUSED" if kind == "paused" else "ERROR"
            out.append(Log(logging.ERROR, f"{self.name}: {what}: {detail}; the copy stays a "
                                          "prefix, retrying"))
            t = Trouble(kind, detail, wall, now + retry)
            if kind == "paused":
                self.paused = t
            else:
                self.failing = t
        else:
            t.detail = detail
            t.attempts += 1
            t.retrying = False
            t.retry_at = now + (retry if kind == "paused" else
                                min(LOOK_RETRY_MAX, LOOK_RETRY_MIN * 2 ** t.attempts))

    def _on_io_failed(self, failed: object, detail: str, now: float, wall: float,
                      out: list[Effect]) -> None:
        if self.mode is Mode.LOADING:
            self._on_load_failed(f"cannot read the file: {detail}", now, out)
            return
        if isinstance(failed, Look | PeerData | Rehash):
            # A look that fails is retried until it works: dropping it could leave a line
            # unshipped while everyone says in_sync.
            self._set_trouble("error", f"cannot read the file: {detail}", now, wall, out)
        # Other reads (serving, probing) are retried by whoever asked.

    # --- announcing and persisting ------------------------------------------------------------

    def _announcement(self, answers: int = 0) -> Announce:
        # An adopting copy is not a source for anyone else until it holds the winner's copy.
        frozen = self.frozen or ("adopting" if self.mode is Mode.ADOPTING else None)
        # The peers we hold diverged: each learns that we know (refusals stop being resent),
        # and that we will neither serve it nor take its bytes.
        return Announce(self.position.size, self.position.digest, frozen, answers,
                        tuple(sorted(self.diverged)))

    def stated_position(self) -> Announce | None:
        """Our position as it stands, to state again when a peer asks (None while loading or
        unreadable: nothing known to announce yet). The same announcement `_announce` makes,
        without its timing: a restatement goes out at once, whatever the gap."""
        if self.mode in (Mode.LOADING, Mode.UNREADABLE):
            return None
        return self._announcement()

    def _announce(self, now: float, out: list[Effect], at_once: bool = False,
                  answers: int = 0) -> None:
        """Publish our position (retained), at most every ANNOUNCE_GAP seconds per file.

        Positions are not on the data path (live frames and gaps are), so under a stream of
        appends one trailing announcement per gap carries the latest; a freeze, an edit or an
        adopting peer's request is announced at once.
        """
        if at_once or now >= self.last_announce + ANNOUNCE_GAP:
            self.announce_due = None
            self.last_announce = now
            out.append(Send(Kind.POS, self._announcement(answers), retain=True))
        elif self.announce_due is None:
            self.announce_due = self.last_announce + ANNOUNCE_GAP

    def _flush_announce(self, now: float, out: list[Effect]) -> None:
        if self.announce_due is not None and now >= self.announce_due:
            self._announce(now, out, at_once=True)

    def _record_now(self) -> FileRecord:
        st = self.file_stat if self.ledger is not None else None
        ledger = self.ledger
        return FileRecord(
            size=self.position.size, digest=self.position.digest,
            file_size=st.size if st else 0, dev=st.dev if st else 0, ino=st.ino if st else 0,
            mtime_ns=st.mtime_ns if st else 0, ctime_ns=st.ctime_ns if st else 0,
            partial=ledger.partial_digest() if ledger else b"", freeze=self.freeze,
            diverged_peers=dict(self.diverged), note=self.note, intent=self.intent,
        )

    def _persist_ready(self) -> bool:
        # Never record a size that is not durable yet: after a power loss the file would look
        # shorter than recorded, which reads as a reset.
        return (self.record_dirty and self.mode is not Mode.LOADING and not self.unsynced
                and (self.ledger is None or self.position.size == self.ledger.size))

    def _persist(self, now: float, out: list[Effect], force: bool = False) -> None:
        if not self._persist_ready():
            return
        if not force and now < self.last_persist + self.tuning.persist_interval:
            return
        out.append(self._persist_record(durable=force))
        self.record_dirty = False
        self.last_persist = now

    def record_at_shutdown(self) -> Persist | None:
        """The durable record to write as the daemon stops, or None while it may not be written
        (still loading, or local bytes not yet synced)."""
        if self.mode is Mode.LOADING or self.unsynced:
            return None
        self.record_dirty = True
        return self._persist_record(durable=True)

    def _persist_record(self, durable: bool) -> Persist:
        chain = self.ledger.chain if self.ledger is not None else None
        effect = Persist(self._record_now(), chain, durable=durable, rebuilt=self._rebuilt)
        self._rebuilt = False
        return effect

    # --- freezing and locating ------------------------------------------------------------------

    def _freeze(self, reason: str, detail: str, now: float, wall: float, out: list[Effect],
                offset: int | None = None, keep: bool = False) -> None:
        self.freeze = Freeze(reason, detail, wall, peer=None, offset=offset)
        self.fetch = None
        self.settle = None
        if reason == "reset":
            # We no longer know what the file holds; keep announcing what we last held.
            self.ledger = None
        out.append(Log(logging.ERROR, f"{self.name}: {reason.upper()}: {detail}; this file is "
                                      "frozen until an operator resolves it"))
        self.record_dirty = True
        if keep:
            return  # still loading: the caller finishes
        self._refreeze_or_live()
        self._persist(now, out, force=True)
        self._announce(now, out, at_once=True)

    def _diverge(self, peer: str, offset: int, detail: str, now: float, wall: float,
                 out: list[Effect]) -> None:
        """Our copy and `peer`'s differ inside the common prefix: isolate that peer (nothing is
        taken from it, fetched from it or served to it) and keep replicating with the others.
        Nothing is overwritten on either side; an operator decides which history wins."""
        if peer in self.diverged:
            return
        self.diverged[peer] = Freeze("diverged", detail, wall, peer=peer, offset=offset)
        view = self.peers.get(peer)
        if view is not None:
            view.state, view.verified = PeerState.DIVERGED, False
        out.append(Log(logging.ERROR, f"{self.name}: DIVERGED from {peer}: {detail}; nothing is "
                                      f"taken from or sent to {peer} for this file until an "
                                      "operator resolves it (the other hosts replicate on)"))
        if self.adoption is None and self.fetch is not None and self.fetch.peer == peer:
            self.fetch = None  # another source, if any, is asked below
        self._locate(peer, now, out)
        self.record_dirty = True
        self._persist(now, out, force=True)
        self._announce(now, out, at_once=True)  # the peer learns that we know
        self._maybe_fetch(now, out)

    def _locate(self, peer: str, now: float, out: list[Effect]) -> None:
        """Ask a diverged peer for its block digests; the answers narrow it down to a byte."""
        if self.ledger is None or not self.online.get(peer):
            return
        self.locating[peer] = now
        refusal = self.refusals.get(peer)
        if refusal is not None and not self.knows_of_fork(peer):
            out.append(Send(Kind.REFUSE, refusal, to=peer))
        if self.diverged.get(peer) is None or self.diverged[peer].line is None:
            self._probe(peer, ProbeWhat.SUMS, 0, self._sums_per_frame(), out)

    def _probe(self, peer: str, what: ProbeWhat, start: int, count: int,
               out: list[Effect]) -> None:
        self.probing[peer] = (what, start)
        out.append(Send(Kind.PROBE, Probe(what, start, count), to=peer))

    def _asked(self, peer: str, p: Probed) -> bool:
        """Whether `p` answers the probe we sent `peer` last: same kind, same start, or the
        start cut to the end of its copy (its blocks, or its bytes)."""
        asked = self.probing.get(peer)
        if asked is None or asked[0] is not p.what:
            return False
        end = p.size // BLOCK if p.what is ProbeWhat.SUMS else p.size
        return p.start == asked[1] or (p.start < asked[1] and p.start == end)

    def _sums_per_frame(self) -> int:
        return max(1, self.tuning.chunk_bytes // DIGEST_SIZE)

    def _answer_probe(self, peer: str, p: Probe, snap: Snapshot, out: list[Effect]) -> None:
        # Answered as a request is (may_serve): a frozen copy (a reset, a write on a replica)
        # has nothing to locate a divergence against. A diverged peer is answered: locating
        # the first differing byte is what a probe is for. The node checks `writers` and
        # charges the peer's budget before the probe gets here.
        ledger = self.ledger
        if ledger is None or not self.may_serve(False):
            return
        if p.what is ProbeWhat.SUMS:
            blocks = len(ledger.chain) - 1
            start = min(p.start, blocks)
            count = min(p.count, self._sums_per_frame(), blocks - start)
            body = b"".join(ledger.chain[start + 1: start + 1 + count])
        else:
            start = min(p.start, ledger.size)
            body = _first_read(snap)
        out.append(Send(Kind.PROBED, Probed(p.what, start, ledger.size, body), to=peer))

    def _narrow(self, peer: str, p: Probed, snap: Snapshot, out: list[Effect]) -> None:
        ledger = self.ledger
        found = self.diverged.get(peer)
        if ledger is None or found is None or found.line is not None or not self._asked(peer, p):
            return  # not the answer to the probe we sent last (a late one, or unasked)
        del self.probing[peer]
        if p.what is ProbeWhat.SUMS:
            theirs = [p.data[i: i + DIGEST_SIZE] for i in range(0, len(p.data), DIGEST_SIZE)]
            block = first_differing_block(ledger.chain, theirs, p.start)
            if block is None:
                common = min(len(ledger.chain) - 1, p.size // BLOCK)
                if p.start + len(theirs) < common:
                    self._probe(peer, ProbeWhat.SUMS, p.start + len(theirs),
                                self._sums_per_frame(), out)
                    return
                block = common  # the full blocks agree: it is in the next one
            self._probe(peer, ProbeWhat.BYTES, block * BLOCK, BLOCK, out)
            return
        # What the file holds, shipped or not: that is what the operator compares.
        ours = snap.get(p.start, p.start + len(p.data))
        i = first_differing_byte(ours, p.data)
        if i is None:
            i = min(len(ours), len(p.data))  # one copy ends where the other goes on
        self.diverged[peer] = dataclasses.replace(
            found, offset=p.start + i, ours=line_around(ours, i), theirs=line_around(p.data, i))
        out.append(FindLine(peer, p.start + i))

    def _on_line_found(self, ev: LineFound, now: float, out: list[Effect]) -> None:
        found = self.diverged.get(ev.peer)
        if found is None or found.offset != ev.offset:
            return
        self.diverged[ev.peer] = dataclasses.replace(found, line=ev.line)
        out.append(Log(logging.WARNING, f"{self.name}: copies of {self.node} and {ev.peer} "
                                        f"first differ at byte {ev.offset} (line {ev.line})"))
        self.record_dirty = True
        self._persist(now, out, force=True)

    # --- adoption -------------------------------------------------------------------------------

    def _on_adopt(self, source: str, ticket: object, now: float, wall: float,
                  out: list[Effect]) -> None:
        if self.mode in (Mode.LOADING, Mode.UNREADABLE):
            out.append(AdoptDone(ticket, {"error": f"{self.name} is not loaded yet"}))
            return
        if self.unsynced:
            out.append(Sync(local=False))
            out.append(Redeliver(AdoptRequested(source, ticket)))
            return
        view = self.peers.get(source)
        if source != self.node and view is not None and view.frozen == "reset":
            out.append(AdoptDone(ticket, {"error": (
                f"{source}'s copy of {self.name} is reset (its file was cleared or replaced): "
                f"it holds nothing it can vouch for. On {source}, keep its new copy first "
                f"({shellwords.command('syncd', 'adopt', self.key, '--from', source)}), "
                "then adopt it here")}))
            return
        if self._supersede_adoption(source, ticket, wall, out):
            return
        if source == self.node:
            out.append(Rehash("keep"))
            self.adoption = Adoption(source, ticket)
            return
        reasons = [f.detail for f in ([self.freeze] if self.freeze else [])]
        reasons += [f"diverged from {n}: {f.detail}" for n, f in self.diverged.items()]
        self.adoption = Adoption(source, ticket)
        self.own_removal_until = now + OWN_REMOVAL_WINDOW
        out.append(Archive({"reason": "; ".join(reasons) or "operator adopted another copy",
                            "adopted_from": source}))

    def _supersede_adoption(self, source: str, ticket: object, wall: float,
                            out: list[Effect]) -> bool:
        """A request while an adoption is under way (an operator asking again after a stalled
        `syncd adopt`, or a second one): the earlier request is answered, never left waiting.
        The same source goes on with the copy taken so far, done only on an answer to this
        request; another source starts over (the partial copy is archived). True if handled."""
        ad = self.adoption
        if ad is None:
            return False
        self.adoption = None
        same = ad.peer == source and source != self.node and self.mode is Mode.ADOPTING
        why = ("a later request for the same copy takes it over" if same
               else f"the operator now adopts {source}'s copy instead of {ad.peer}'s")
        out.append(AdoptDone(ad.ticket, {"error": f"superseded: {why}"}))
        out.append(Log(logging.WARNING, f"{self.name}: adoption of {ad.peer}'s copy superseded: "
                                        f"{why}"))
        if not same:
            return False
        # Done only when our copy equals what the source held after this request.
        ad.ticket, ad.fresh = ticket, None
        ad.ask = max(ad.ask + 1, int(wall * 1000))
        self.adoption = ad
        return True

    def _on_archived(self, path: str, now: float, wall: float, out: list[Effect]) -> None:
        ad = self.adoption
        if ad is None:
            return
        ad.archive = path
        out.append(Log(logging.WARNING, f"{self.name}: operator adopts {ad.peer}'s copy; ours "
                                        f"is archived at {path}"))
        self._new_history(Ledger(self.records), None, out)
        self.settle = None
        self.fetch = None
        for view in self.peers.values():
            view.state = PeerState.AHEAD
        self._enter(Mode.ADOPTING)
        self._persist(now, out, force=True)
        out.append(LogCheck(restart=True))
        self._announce(now, out, at_once=True)
        ad.ask = max(1, int(wall * 1000))
        self._maybe_fetch(now, out)

    def _adoption_spoiled(self, detail: str, out: list[Effect]) -> None:
        """The bytes taken so far changed in the file while adopting: the adoption cannot end
        well. Say so to the operator, and check the whole copy once as a live one, so that the
        new bytes are announced (every peer holding the old ones sees the fork) and no peer
        stays in_sync over bytes we no longer hold."""
        ad = self.adoption
        self.adoption = None
        if ad is not None:
            out.append(AdoptDone(ad.ticket, {"error": detail}))
        self._enter(Mode.LIVE)
        out.append(Rehash("check", hold=self.held, why=detail))

    def _check_adopted(self, now: float, out: list[Effect]) -> None:
        """Done when our durable copy equals a position the source announced after we asked."""
        ad = self.adoption
        if ad is None or self.mode is not Mode.ADOPTING or self.unsynced:
            return
        if ad.fresh is None or ad.fresh != self.position:
            return
        self.adoption = None
        self._enter(Mode.LIVE)  # a peer with yet another history stays diverged: that one only
        self._announce(now, out, at_once=True)  # no longer "adopting": a source again
        out.append(Log(logging.INFO, f"{self.name}: now identical to {ad.peer}'s copy "
                                     f"({self.position.size} bytes)"))
        out.append(AdoptDone(ad.ticket, {"file": self.file, "archive": ad.archive,
                                         "size": self.position.size}))
        # Local changes were not judged while adopting (the bot should have been stopped):
        # check the whole copy once against what we took, so that none goes unnoticed.
        out.append(Rehash("check", hold=self.held,
                          why="the file changed while it was being adopted"))
        for peer, view in self.peers.items():
            self._assess(peer, view, EMPTY, now, now, out)

    def _keep_local(self, fresh: Ledger | None, st: Stat | None, now: float, wall: float,
                    out: list[Effect]) -> None:
        """The operator keeps this host's copy as it is now (after a deliberate clear())."""
        ad = self.adoption
        self.adoption = None
        self._new_history(fresh if fresh is not None else Ledger(self.records), st, out)
        if self.mode is not Mode.LIVE:
            self._enter(Mode.LIVE)
        self._persist(now, out, force=True)
        out.append(Log(logging.WARNING, f"{self.name}: operator keeps the local copy "
                                        f"({self.position.size} bytes); replication resumes "
                                        "from it"))
        out.append(LogCheck(restart=True))
        self._announce(now, out, at_once=True)
        for peer, view in self.peers.items():
            self._assess(peer, view, EMPTY, now, wall, out)
        if ad is not None:
            out.append(AdoptDone(ad.ticket, {"file": self.file, "archive": None,
                                             "size": self.position.size}))

    def _new_history(self, ledger: Ledger, st: Stat | None, out: list[Effect]) -> None:
        """The operator replaced this copy's history (adopt, or keep the local copy): forget
        all that was learned about the old one, from freezes to what each peer was shown."""
        self.ledger = ledger
        self._rebuilt = True
        self.freeze, self.diverged, self.note, self.intent = None, {}, None, None
        self.appending = None
        out.append(NoteAppending(None))  # about the history just replaced
        self.refusals.clear()
        self.locating.clear()
        self.probing.clear()
        self._adopt_stat(st)
        self.position = Position(ledger.size, ledger.digest())
        for view in self.peers.values():
            view.verified, view.forked, view.probed = False, False, False
        self.record_dirty = True

    def adoption_progress(self) -> tuple[int, int]:
        ad = self.adoption
        view = self.peers.get(ad.peer) if ad else None
        return self.position.size, view.position.size if view else 0

    # --- status ---------------------------------------------------------------------------------

    def state_word(self) -> str:
        if self.mode is Mode.UNREADABLE:
            return "error"
        trouble = ("error" if self.failing is not None else
                   "paused" if self.paused is not None else None)
        return file_state(self.frozen, self.mode is Mode.LOADING,
                          [self.peer_state(n) for n in self.peers], trouble,
                          diverged=bool(self.diverged))

    def peer_state(self, node: str) -> PeerState:
        """A peer's copy as seen from here; a divergence with it shows whatever it announces
        (until the copies agree again, it is one)."""
        if node in self.diverged:
            return PeerState.DIVERGED
        return self.peers[node].state

    def status(self) -> dict[str, Any]:
        peers = {}
        for node, v in sorted(self.peers.items()):
            peers[node] = {
                "size": v.position.size,
                "state": self.peer_state(node).value,
                "frozen": v.frozen,
                "diverged": list(v.diverged),
                "online": self.online.get(node, False),
                "lag_bytes": max(0, self.position.size - v.position.size),
            }
        return {
            "key": self.key,
            "file": self.file,
            "size": self.position.size,
            "file_size": self.file_stat.size if self.file_stat else 0,
            "state": self.state_word(),
            "mode": self.mode.value,
            "role": self.role,
            "paused": self.paused.detail if self.paused is not None else None,
            "error": (self.load_error if self.mode is Mode.UNREADABLE else
                      self.failing.detail if self.failing is not None else None),
            "note": self.note,
            "adopting": self.adoption.peer if self.adoption else None,
            "freeze": self.freeze.to_json() if self.freeze else None,
            "diverged": {n: f.to_json() for n, f in sorted(self.diverged.items())},
            "peers": peers,
            **self.counters,
        }

    def peer_sizes_ahead(self) -> dict[str, int]:
        return {n: v.position.size - self.position.size for n, v in self.peers.items()
                if v.position.size > self.position.size and n not in self.diverged}


# A write() that a fatal signal interrupts, or that a power loss tears, stops on a page
# boundary (the kernel copies page by page): 4096 on Linux, and larger pages are multiples.
PAGE = 4096


def _maybe_cut_short(appending: Appending | None, end: int, file_size: int) -> bool:
    """Whether the bytes past our `end` may be what an append of ours cut short left: inside
    the range we were appending (`appending`), and ending on a page boundary. They are ours
    only if they are also byte for byte what a peer sends there, and _cut_short_is_ours."""
    return (appending is not None and appending[1] <= end < file_size <= appending[3]
            and file_size % PAGE == 0)


def _cut_short_is_ours(appending: Appending | None, end: int, local: bytes, d: Data) -> bool:
    """Bytes `local` past our `end`, equal to the start of the peer's `d` and inside the noted
    range (_maybe_cut_short): ours, or a local writer's that happen to be equal? A process
    killed before its append leaves the note and no byte; the local writer may then start a
    line there, and every line of a log starts alike (simulator seed 7027257: 3 bytes,
    `{"i`, spliced a writer's line into a peer's history). So: the whole piece, with the
    digest noted, or at least a page of the piece's own bytes (no writer's line equals a
    peer's for that long); and where the peer's bytes cover the noted piece, they must be
    the noted ones (the history we were appending). Anything else is refused as a
    divergence, never spliced."""
    if appending is None:
        return False
    _, _, offset, stop, digest = appending
    if d.offset <= offset and d.end >= stop and hashlib.sha256(
            d.data[offset - d.offset: stop - d.offset]).hexdigest() != digest:
        return False
    size = end + len(local)
    if size == stop and offset >= end and hashlib.sha256(
            local[offset - end:]).hexdigest() == digest:
        return True
    # The piece's bytes in the file: [offset, size), all equal to the peer's (those below
    # `end` by the digest the peer's base matched, the others byte for byte).
    return size - (offset if size > offset else end) >= PAGE


def _first_read(snap: Snapshot) -> bytes:
    """The one range a look (or a peer's data) reads: from Ledger.recheck_start() on."""
    return next(iter(snap.reads.values()), b"")


def effects_of_kind(effects: Iterable[Effect], kind: type) -> list[Any]:
    """The effects of one type, in order (for tests and the simulator)."""
    return [e for e in effects if isinstance(e, kind)]
