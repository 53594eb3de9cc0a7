"""The per-file machine: dispatch of every event, and the decisions its pieces share (the
predicates, freezing and diverging, announcing and persisting). The theory of operation is in
the package's opening comment (`__init__.py`); the sub-jobs are the modules beside this one:
`loading` (start-up verdicts), `localfile` (the writer's file), `serving` (answering peers),
`locating` (where two copies part), `peers` (peer bookkeeping), `adoption`, and `state` (the
record types). Over 800 lines: the handlers below all change the one state of one file, and
splitting them further would only spread its fields over modules (each decision stays next
to the others that read the same fields)."""

from __future__ import annotations

import logging
from typing import Any

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
from syncd.core.filemachine import adoption, loading, localfile, peers, serving
from syncd.core.filemachine.localfile import HoldBack
from syncd.core.filemachine.locating import Locator, with_line
from syncd.core.filemachine.state import (
    ANNOUNCE_GAP,
    LOOK_RETRY_MAX,
    LOOK_RETRY_MIN,
    NO_READS_EVENTS,
    OWN_REMOVAL_WINDOW,
    PAUSE_RETRY,
    RELOAD_RETRY,
    SETTLE,
    STAT_ONLY,
    TRANSITIONS,
    Adoption,
    Fetch,
    LogPeer,
    Mode,
    Settle,
    Trouble,
    Tuning,
    Unsettled,
    first_read,
)
from syncd.core.frames import Announce, Data, Kind, Probe, Probed, ProbeWhat, Refuse, Request
from syncd.core.ledger import Ledger, Position, block_start
from syncd.core.reconcile import (
    LocalChange,
    PeerState,
    Verdict,
    choose_source,
    file_state,
    first_change,
    judge_data,
    judge_local,
    judge_peer,
    judge_request,
)
from syncd.core.recordkinds import LINES
from syncd.core.records import Appending, FileRecord, Freeze, Stat


class FileMachine:
    def __init__(self, node: str, key: str, file: str, role: str, tuning: Tuning,
                 online: dict[str, bool] | None = None, records: str = LINES,
                 settle: float = 0.0) -> None:
        self.node, self.key, self.file, self.role = node, key, file, role
        self.records = records  # what one record of the file is (recordkinds.py)
        # The writer's file must hold still `settle` seconds before its new records are
        # recorded and shipped (its batch settled: written, synced, or rolled back).
        self.holdback = HoldBack(settle)
        self.tuning = tuning
        self.mode = Mode.LOADING
        self.ledger: Ledger | None = None
        # False: the partial block's bytes are not kept (Ledger.forget_tail), for a key made
        # on a peer's word (daemon/instances.py).
        self.keep_tails = True
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
        # The record this run knows to be on disk, durable: loaded at start and still true,
        # or the last durable save. A stop then has nothing to write (1000 idle keys: 1000
        # fsynced records, 1.7 s on a quiet disk and tens of seconds on a busy one).
        self._kept: FileRecord | None = None
        self.last_persist = float("-inf")
        self.last_announce = float("-inf")
        self.announce_due: float | None = None
        self.settle: Settle | None = None
        self.own_removal_until = float("-inf")
        self.locator = Locator()  # where we part from diverged peers
        self._record: FileRecord | None = None  # during LOADING
        self._record_chain: list[bytes] = []
        self._rebuilt = False  # the chain file must be rewritten whole at the next persist
        self.counters = {"shipped_bytes": 0, "applied_bytes": 0, "served_bytes": 0,
                         "shipped_frames": 0, "applied_frames": 0, "served_frames": 0}

    # The sub-jobs' own state, under the names the shells and the simulator read.
    @property
    def hold_back(self) -> float:
        return self.holdback.seconds

    @property
    def unsettled(self) -> Unsettled | None:
        return self.holdback.unsettled

    @property
    def locating(self) -> dict[str, float]:
        return self.locator.locating

    @property
    def probing(self) -> dict[str, tuple[ProbeWhat, int]]:
        return self.locator.probing

    @property
    def refusals(self) -> dict[str, Refuse]:
        return self.locator.refusals

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
        return peers.knows_of_fork(self.peers, peer, self.node)

    def _refreeze_or_live(self) -> None:
        """LIVE unless a (local) freeze holds, after one was added or cleared."""
        if self.mode in (Mode.LIVE, Mode.FROZEN):
            self._enter(Mode.FROZEN if self.frozen else Mode.LIVE)

    # --- reads --------------------------------------------------------------------------------

    def reads_for(self, event: Event) -> ReadPlan:
        """The bytes of the file that `handle(event)` needs; the shell reads them first."""
        if type(event) in NO_READS_EVENTS:
            return NO_READS
        ledger = self.ledger
        match event:
            case Loaded(record=rec) if rec is not None:
                return loading.record_plan(rec)
            case Rehashed(purpose="load") if self._record is not None:
                return loading.rehash_plan(self._record, self._intent_check)
            case Rehashed(purpose="check") if ledger is not None:
                return loading.check_plan(ledger)
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
                plan = (serving.request_plan(ledger, event.request, self.tuning.fetch_window,
                                             self.tuning.serve_step)
                        if isinstance(event, PeerRequest) else NO_READS)
                return ReadPlan(plan.ranges, stat=True)
            case PeerPos(announce=a) if ledger is not None:
                return serving.partial_plan(ledger, a.size)
            case Reassess(peer=p) if ledger is not None and p in self.peers:
                return serving.partial_plan(ledger, self.peers[p].position.size)
            case PeerRefuse(refuse=rf) if ledger is not None:
                return serving.partial_plan(ledger, rf.offset)
            case PeerProbe(probe=p) if (ledger is not None and p.what is ProbeWhat.BYTES
                                        and self.may_serve(False)):
                return serving.probe_plan(ledger, p)
            case PeerProbed(peer=peer, probed=p) if (
                    p.what is ProbeWhat.BYTES and self.locator.asked(peer, p)):
                return ReadPlan(((p.start, p.start + len(p.data)),))
        return NO_READS

    def _digest_at(self, offset: int, snap: Snapshot) -> bytes | None:
        return serving.digest_at(self.ledger, offset, snap)

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
                    self.locator.refuse(peer, rf.offset, ours)  # so that it learns ours
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
            self.holdback.due(),
            (self.last_announce + self.tuning.reannounce
             if self.mode in (Mode.LIVE, Mode.FROZEN, Mode.ADOPTING) else None),
            (self.last_persist + self.tuning.persist_interval) if self._persist_ready()
            else None,
        ) if t is not None]
        for peer, f in self.diverged.items():
            if (self.locator.wants(peer, f, self.knows_of_fork(peer)) and self.online.get(peer)
                    and self.ledger is not None):
                times.append(self.locator.retry_at(peer))
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
        verdict = loading.judge_record(rec, ev.chain, snap, self.records,
                                       self.appending is not None)
        match verdict:
            case loading.Reset(detail=detail):
                if detail is not None and self.freeze is None:
                    self._freeze("reset", detail, now, wall, out, keep=True)
                self._finish_load_frozen(out)
            case loading.Empty():
                self._start(Ledger(self.records), None, now, wall, out)
            case loading.Restore(ledger=ledger):
                self._start(ledger, st, now, wall, out, recorded=rec)
            case loading.RehashFile(hold=hold, intent_check=check, note_appending=note):
                self._intent_check = check
                if note:
                    assert self.appending is not None
                    out.append(NoteAppending(self.appending, durable=True))
                out.append(Rehash("load", hold=hold))

    def _finish_load_frozen(self, out: list[Effect]) -> None:
        self._record = None
        self._enter(Mode.FROZEN)
        out.append(Send(Kind.POS, self._announcement(), retain=True))

    def _start(self, ledger: Ledger, st: Stat | None, now: float, wall: float,
               out: list[Effect], recorded: FileRecord | None = None) -> None:
        """Loading is over: `ledger` describes the file. `recorded`: the record it was
        restored from, which needs no rewrite if it says what we would write now (at a
        restart with 1000 idle keys, 1000 identical records written by the records thread
        held up the loads, which share its lock)."""
        self._record = None
        self._hold(ledger)
        self._adopt_stat(st)
        self.position = Position(ledger.size, ledger.digest())
        self.record_dirty = recorded is None or not self._record_says_now(recorded)
        self._kept = None if self.record_dirty else recorded
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
            if self.mode is Mode.LOADING:
                self._on_load_rehashed(fresh, snap, now, wall, out)
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
            if loading.still_vouched(ledger, fresh, snap):
                return  # every byte we vouched for is still there
            where = first_change(ledger.chain, ledger.known_tail, ledger.size, fresh.chain,
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
            where = first_change(ledger.chain, ledger.known_tail, ledger.size, fresh.chain,
                                 fresh.tail, fresh.size)
            self._replace_history(fresh, snap.stat, where, ev.why, now, out)

    def _on_load_rehashed(self, fresh: Ledger | None, snap: Snapshot, now: float, wall: float,
                          out: list[Effect]) -> None:
        rec = self._record
        check, self._intent_check = self._intent_check, None
        match loading.judge_rehash(rec, self._record_chain, fresh, snap, check):
            case loading.Empty():
                self._start(Ledger(self.records), None, now, wall, out)
            case loading.Reset(detail=detail):
                if self.freeze is None:
                    self._freeze("reset", detail or "", now, wall, out, keep=True)
                self._finish_load_frozen(out)
            case loading.NotTheIntent():
                # Not the peer's bytes we wrote: hash again without them (they are local).
                assert rec is not None
                self.intent = None
                out.append(Rehash("load", hold=rec.size))
            case loading.Hashed(edited_at=where):
                assert fresh is not None
                self._rebuilt = True
                self._start(fresh, snap.stat, now, wall, out)
                if self.intent is not None and fresh.size >= self.intent[2]:
                    self.intent = None
                if where is not None:
                    self._noticed_edit(where, "while syncd was stopped", now, out)

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
        change = localfile.judge_file(ledger, self.inode, self.seen, snap)
        if ledger.size == 0 and st is not None:
            self.inode = st.inode  # an empty history holds nothing to lose: any file is ours
        if change is not LocalChange.SHRUNK:
            self.settle = None
        if change is not LocalChange.GROWTH:
            self.holdback.drop()  # what was held back is gone (rolled back) or never was
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
        if self.holdback.held_back(line_end > ledger.size, st, now):
            return
        self._ship(snap, line_end, st, now, out, send=self.may_ship())

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
        new = first_read(snap)[start - ledger.recheck_start():]
        # A backlog larger than one read: ship its whole records now, the rest next look.
        end = localfile.ship_end(self.records, new, start, line_end)
        for pos, stop in localfile.pieces(self.records, new, start, start, end,
                                          self.tuning.chunk_bytes):
            data = new[pos - start: stop - start]
            if send:
                out.append(Send(Kind.LIVE, Data(pos, ledger.digest(), data)))
                self.counters["shipped_bytes"] += len(data)
                self.counters["shipped_frames"] += 1
            ledger.extend(data)
        pos = max(start, end)  # shipped (or recorded) up to here
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
        self._hold(fresh)
        self._rebuilt = True
        self._adopt_stat(st)
        self.position = Position(fresh.size, fresh.digest())
        self._noticed_edit(where, why, now, out)

    def _noticed_edit(self, where: int, why: str, now: float, out: list[Effect]) -> None:
        self.note = (f"bytes already replicated were changed locally ({why}); first "
                     f"difference in the 64 KiB block at offset {block_start(where)}")
        out.append(Log(logging.WARNING, f"{self.name}: {self.note}"))
        peers.unverify(self.peers)
        self.record_dirty = True
        out.append(LogCheck(restart=True))
        out.append(Sync(local=True))  # durable before announced, edited bytes included
        self._announce(now, out, at_once=True)

    # --- peers --------------------------------------------------------------------------------

    def _on_announce(self, peer: str, a: Announce, snap: Snapshot, now: float, wall: float,
                     out: list[Effect]) -> None:
        view = self.peers[peer] = peers.heard(self.peers.get(peer), a, wall)
        ad = self.adoption
        if ad is not None and adoption.answered(ad, peer, a.answers):
            ad.fresh = view.position  # announced in reply to our request, so after it
        self._assess(peer, view, snap, now, wall, out)
        self._check_adopted(now, out)
        self._maybe_fetch(now, out)

    def _assess(self, peer: str, view: LogPeer, snap: Snapshot, now: float, wall: float,
                out: list[Effect], reread: bool = True) -> None:
        peers.note_ahead(view, self.position.size, wall)
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
                self.locator.refuse(peer, theirs.size, ours)
                self._diverge(peer, theirs.size, f"{peer} announced a copy of {theirs.size} "
                              "bytes whose prefix differs from ours", now, wall, out)
        found = self.diverged.get(peer)
        if found is None:
            return
        if view.verified and peers.fork_gone(found, view):
            # Its copy now holds our bytes where the copies parted: it adopted ours (or we
            # adopted its). Content decides, not what the peer says of itself.
            del self.diverged[peer]
            self.locator.forget(peer)
            self.record_dirty = True
            out.append(Log(logging.WARNING, f"{self.name}: {peer}'s copy is consistent with "
                                            "ours again; divergence with it cleared"))
            self._persist(now, out, force=True)
            self._announce(now, out, at_once=True)  # it learns that we no longer refuse it
        else:
            view.state = PeerState.DIVERGED

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
            self.locator.refuse(peer, ledger.size, ledger.digest())
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
            change = localfile.judge_file(ledger, self.inode, None, snap)
            got = first_read(snap)
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
                    ours = localfile.maybe_cut_short(self.appending, ledger.size, st.size)
                    if (ours and local and d.data.startswith(local)
                            and localfile.cut_short_is_ours(self.appending, ledger.size,
                                                            local, d)):
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
        note = localfile.append_note(ledger, d, self.unsynced, peer)
        if note is not None:  # a write a kill or a power loss may cut short: said first
            self.appending = note
            out.append(NoteAppending(note))
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
            refusal = self.locator.refuse(peer, at + len(local), ledger.digest_with(local))
            out.append(Send(Kind.REFUSE, refusal, to=peer))
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
            peers.took_from(view, ledger.size, ledger.digest(), wall)
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
            out.append(Send(Kind.REFUSE, self.locator.refuse(peer, r.have, ours), to=peer))
            self._diverge(peer, r.have, f"{peer} asked for bytes after a prefix of {r.have} "
                          "bytes that differs from ours", now, wall, out)
            return
        # A peer whose copy differs from ours gets nothing, unless an operator there adopts
        # ours (forced): its copy is then empty or a prefix of ours, and takes only our bytes.
        if verdict is Verdict.APPEND and self.may_serve(r.force) and (
                r.force or peer not in self.diverged) and self._serve(peer, r, snap, out):
            return  # the rest of the window follows (serving.serve), the announcement with it
        if r.force:
            # An adopting peer is done only on a position we announce after its request
            # (after the bytes just served): it recognises this one by its `ask`.
            self._announce(now, out, at_once=True, answers=r.ask)

    def _serve(self, peer: str, r: Request, snap: Snapshot, out: list[Effect]) -> bool:
        """Send the first step of what `r` gets; whether the rest follows (a Redeliver)."""
        assert self.ledger is not None
        sent = serving.serve(self.ledger, r, snap, peer, seen=self.seen, inode=self.inode,
                             window=self.tuning.fetch_window, chunk=self.tuning.fill,
                             records=self.records, step=self.tuning.serve_step)
        for e in sent:
            if isinstance(e, Send):
                assert isinstance(e.payload, Data)
                self.counters["served_bytes"] += len(e.payload.data)
                self.counters["served_frames"] += 1
        out += sent
        return bool(sent) and isinstance(sent[-1], Redeliver)

    def _forget(self, peer: str, now: float, out: list[Effect]) -> None:
        self.peers.pop(peer, None)
        self.online.pop(peer, None)
        self.locator.forget(peer)
        if self.fetch is not None and self.fetch.peer == peer:
            self.fetch = None
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
        candidates = peers.fetch_candidates(self.peers, self.online, self.diverged, self.node,
                                            ad.peer if ad is not None else None)
        source = choose_source(ledger.size, candidates)
        if source is None:
            if (ad is not None and self.mode is Mode.ADOPTING
                    and adoption.asks_again(ad, self.position, self.online.get(ad.peer, False))):
                # No answer to our asking describes our copy yet: ask again, on the request
                # timer, until a fresh answer says where it stands.
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
        if (due := self.holdback.due()) is not None and now >= due:
            self.holdback.looking()  # a look judges the file again (or it changed)
            out.append(LookAgain())
        if now >= self.last_announce + self.tuning.reannounce:
            self._announce(now, out, at_once=True)
        for peer, f in list(self.diverged.items()):
            if self.locator.due(peer, now) and self.locator.wants(peer, f,
                                                                 self.knows_of_fork(peer)):
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

    def _record_says_now(self, recorded: FileRecord) -> bool:
        """Whether `recorded` holds what a record written now would (its `.appending` note is
        a file of its own, not part of what a save writes)."""
        now = self._record_now()
        now.appending = recorded.appending
        return now == recorded

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
        if self._kept is not None and not self._rebuilt and self._record_says_now(self._kept):
            return None  # the disk holds it already, durably
        self.record_dirty = True
        return self._persist_record(durable=True)

    def record_not_kept(self) -> None:
        """The shell could not write a durable record: the next stop writes it again."""
        self._kept = None

    def _persist_record(self, durable: bool) -> Persist:
        chain = self.ledger.chain if self.ledger is not None else None
        effect = Persist(self._record_now(), chain, durable=durable, rebuilt=self._rebuilt)
        self._rebuilt = False
        self._kept = effect.record if durable else None
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
        out += self.locator.locate(peer, self.diverged.get(peer), self.knows_of_fork(peer), now,
                                   serving.sums_per_frame(self.tuning.chunk_bytes))

    def _answer_probe(self, peer: str, p: Probe, snap: Snapshot, out: list[Effect]) -> None:
        # Answered as a request is (may_serve): a frozen copy (a reset, a write on a replica)
        # has nothing to locate a divergence against. A diverged peer is answered: locating
        # the first differing byte is what a probe is for. The node checks `writers` and
        # charges the peer's budget before the probe gets here.
        ledger = self.ledger
        if ledger is None or not self.may_serve(False):
            return
        probed = serving.answer_probe(ledger, p, snap,
                                      serving.sums_per_frame(self.tuning.chunk_bytes))
        out.append(Send(Kind.PROBED, probed, to=peer))

    def _narrow(self, peer: str, p: Probed, snap: Snapshot, out: list[Effect]) -> None:
        ledger = self.ledger
        found = self.diverged.get(peer)
        if (ledger is None or found is None or found.line is not None
                or not self.locator.asked(peer, p)):
            return  # not the answer to the probe we sent last (a late one, or unasked)
        effect, located = self.locator.narrow(peer, p, ledger.chain, snap, found,
                                              serving.sums_per_frame(self.tuning.chunk_bytes))
        if located is not None:
            self.diverged[peer] = located
        out.append(effect)

    def _on_line_found(self, ev: LineFound, now: float, out: list[Effect]) -> None:
        found = with_line(self.diverged.get(ev.peer), ev)
        if found is None:
            return
        self.diverged[ev.peer] = found
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
        why = adoption.refusal(self.name, self.key, self.node, source, self.peers.get(source))
        if why is not None:
            out.append(AdoptDone(ticket, {"error": why}))
            return
        if self.adoption is not None:
            ad = self.adoption
            same = ad.peer == source and source != self.node and self.mode is Mode.ADOPTING
            self.adoption, said = adoption.supersede(ad, source, ticket, wall, self.name, same)
            out += said
            if self.adoption is not None:
                return
        if source == self.node:
            out.append(Rehash("keep"))
            self.adoption = Adoption(source, ticket)
            return
        self.adoption = Adoption(source, ticket)
        self.own_removal_until = now + OWN_REMOVAL_WINDOW
        out.append(Archive(adoption.archive_reason(self.freeze, self.diverged, source)))

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
        ad.ask = adoption.first_ask(wall)
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
        if not adoption.done(ad, self.position):
            return
        self.adoption = None
        self._enter(Mode.LIVE)  # a peer with yet another history stays diverged: that one only
        self._announce(now, out, at_once=True)  # no longer "adopting": a source again
        out.append(Log(logging.INFO, f"{self.name}: now identical to {ad.peer}'s copy "
                                     f"({self.position.size} bytes)"))
        out.append(adoption.finished(ad.ticket, self.file, ad.archive, self.position.size))
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
            out.append(adoption.finished(ad.ticket, self.file, None, self.position.size))

    def _hold(self, ledger: Ledger) -> None:
        self.ledger = ledger
        if not self.keep_tails:
            ledger.forget_tail()

    def _new_history(self, ledger: Ledger, st: Stat | None, out: list[Effect]) -> None:
        """The operator replaced this copy's history (adopt, or keep the local copy): forget
        all that was learned about the old one, from freezes to what each peer was shown."""
        self._hold(ledger)
        self._rebuilt = True
        self.freeze, self.diverged, self.note, self.intent = None, {}, None, None
        self.appending = None
        out.append(NoteAppending(None))  # about the history just replaced
        self.locator.clear()
        self._adopt_stat(st)
        self.position = Position(ledger.size, ledger.digest())
        peers.unverify(self.peers, probed=True)
        self.record_dirty = True

    def adoption_progress(self) -> tuple[int, int]:
        return adoption.progress(self.adoption, self.position.size, self.peers)

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
            "peers": peers.peers_status(self.peers, self.online, self.position.size,
                                        self.peer_state),
            **self.counters,
        }

    def peer_sizes_ahead(self) -> dict[str, int]:
        return peers.sizes_ahead(self.peers, self.position.size, self.diverged)

