"""One replicated file on this host: the shell around its machine (`core/filemachine/`).

The machine decides; this module does the I/O it asks for and nothing else. One asyncio task
per file takes one event at a time: it reads what the machine's plan names (stat and bytes,
through one descriptor), hands the event and the snapshot to the machine, and carries out the
effects in order, feeding each result (appended, synced, rehashed, archived) straight back,
so that a local append, a peer's bytes and a peer's request never race each other.

Beside it: when the file's log checks run (logchecks.py), and the facts its READY is decided
on (readyfacts.py). A watcher hint comes in as changed(): our own append is no news, anything
else goes through the host's commit gate (window.py), which calls released() back.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Protocol

from syncd.core import frames
from syncd.core.budget import Holdings
from syncd.core.errors import ConcurrentWrite, FileReplaced
from syncd.core.events import (
    EMPTY,
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
    PeerForgotten,
    PeerProbe,
    PeerRequest,
    Persist,
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
from syncd.core.filemachine import (
    FileMachine,
    Mode,
    Tuning,
)
from syncd.core.ledger import Ledger
from syncd.core.names import printable
from syncd.core.readiness import MISSING_SHOWN, decide
from syncd.core.records import Stat
from syncd.core.spot import Spot
from syncd.daemon import logoutput, readyfacts
from syncd.daemon.answers import Answers
from syncd.daemon.flag import Flag
from syncd.daemon.logchecks import LogChecks
from syncd.daemon.readyfacts import FactsHost, Unhandled
from syncd.disk import logfile, tree
from syncd.disk.archive import archive_copy
from syncd.disk.groupsync import GroupSync
from syncd.disk.recordfiles import RecordFiles, Save

log = logging.getLogger("syncd.replica")

# Events without fields, made once (frozen: one value each).
LOOK, DRAINED, SYNCED, TICK = Look(), Drained(), Synced(), Tick()
LOOK_FULL = Look(full=True)  # the commit gate's look: the bytes at once (released())

INLINE_SYNC_BYTES = 64 * 1024  # below this, a lone busy file's sync may be waited for


class Commits(Protocol):
    """The host's commit gate, as a file sees it (window.py CommitGate)."""

    def offer(self, thing: FileTask) -> None:
        """The file changed: its look starts now, after the batch window, or after the one
        under way (the gate then calls FileTask.released)."""

    def done(self, thing: FileTask) -> None:
        """The file's look is over: the next may start."""


class HostServices(FactsHost, Protocol):
    """What a file task needs from the host that owns it."""

    node: str
    records: RecordFiles
    syncer: GroupSync
    state_dir: Path
    presence: dict[str, bool]
    holdings: Holdings  # what peers' queued events hold here (docs/peer-limits.md)
    answers: Answers  # peers' requests waiting while their answers are in flight
    # The files with work waiting or under way: each file adds and removes itself.
    busy_files: set[FileTask]

    @property
    def commits(self) -> Commits:
        """Local changes pass here before a look: each file offers itself, and says when its
        look is over."""

    def tuning(self) -> Tuning: ...

    def growth_problem(self, key: str) -> str | None:
        """Why no peer's bytes may be written for `key` now (free space below the floor)."""

    def role_of(self, key: str) -> str: ...

    def records_of(self, key: str, file: str) -> str:
        """What one record of the file is: "lines" or "zstd-frames" (core/recordkinds.py)."""

    def settle_of(self, key: str, file: str) -> float:
        """Seconds the writer's file must hold still before its new records ship."""

    def send(self, kind: frames.Kind, key: str, file: str, payload: frames.Payload,
             to: str = "", retain: bool = False) -> None: ...

    def durable(self, key: str, file: str, size: int) -> None: ...

    def note_unsafe(self, path: str, kind: str, reason: str) -> None: ...

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None: ...

    def flush(self) -> None:
        """Send every item queued so far now, not at the end of this loop turn."""


class FileTask:
    def __init__(self, host: HostServices, key: str, file: str, spot: Spot) -> None:
        self.host = host
        self.key = key
        self.file = file
        # Every read and write goes through `spot` (from the root, one directory at a time,
        # no link followed: disk/tree.py); the path is for messages and for stat hints.
        self.spot = spot
        self.path = spot.path
        self._fspath = os.fspath(self.path)
        self.record_kind = host.records_of(key, file)  # lines or zstd frames
        self.machine = FileMachine(host.node, key, file, host.role_of(key), host.tuning(),
                               online=host.presence, records=self.record_kind,
                               settle=host.settle_of(key, file))
        # The log checks READY needs (logchecks.py), run as the machine asks.
        self.checks = LogChecks(spot, host.records.folder(key) / f"{file}.verify",
                                self.record_kind, self.machine)
        # Set once the start-up check is done (even if it failed). Flags, not asyncio.Events:
        # a peer may make max_keys files (daemon/flag.py).
        self.loaded = Flag()
        self._inbox: deque[Event] = deque()
        # id(event) -> (peer, bytes) of queued peers' events, taken from host.holdings
        self._held: dict[int, tuple[str, int]] = {}
        self._look_pending = False
        self._look_full = False  # the pending look reads the bytes at once (LOOK_FULL)
        self._busy = False  # in host.busy_files
        self._wake = Flag()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the one start() ran on
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._swept: tuple[int, int, int, int] | None = None
        self._own: Stat | None = None  # the file as our last append left it
        self._unsendable = False  # logged that the link refused this file's topic
        self._shipped = 0  # bytes of live frames sent since the last sync (see _sync)
        # Directories that got an entry from us (the file, its folders) since the last sync:
        # made durable with the file's next sync (groupsync.py).
        self._new_entries: set[Spot] = set()
        self._entry_synced: tuple[int, int] | None = None  # the inode whose entry we synced
        # Peers' positions and bytes delivered and not handled yet (readiness: readyfacts.py).
        self._unhandled = Unhandled()

    @property
    def ledger(self) -> Ledger | None:
        return self.machine.ledger

    @property
    def name(self) -> str:
        return f"{self.key}/{self.file}"

    # --- intake (on the event loop, never blocks) ------------------------------------------------

    def start(self) -> None:
        # Kept: every event's turn asks for the loop's time, and asyncio's lookup of the
        # running loop costs a getpid(2) (its check for a fork), several per replicated write.
        self._loop = loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=self.name)

    async def stop(self, saves: list[Save] | None = None) -> None:
        """`saves`: the daemon stops; the durable record goes there, for the caller to write
        with every other file's at once (RecordFiles.save_all), instead of now."""
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # Shutting down: record the position now if it may be recorded at all.
        record = self.machine.record_at_shutdown()
        if record is not None and saves is not None:
            saves.append(Save(self.key, self.file, record.record, record.chain, record.rebuilt))
        elif record is not None:
            with contextlib.suppress(OSError):
                await self._persist(record)
        await self.checks.close()
        for peer, size in self._held.values():
            self.host.holdings.give(peer, size)
        self._held.clear()
        if self._busy:
            self._busy = False
            self.host.busy_files.discard(self)

    def deliver(self, event: Event) -> None:
        self._unhandled.arrived(event)
        self._inbox.append(event)
        self._signal()

    def deliver_held(self, event: Event, peer: str, size: int) -> None:
        """A peer's event whose `size` bytes the node took from the peer's Holdings: given
        back when the event leaves the queue (handled, or the replica stopped)."""
        self._held[id(event)] = (peer, size)
        self.deliver(event)

    def _answer_waits(self, event: PeerRequest | PeerProbe) -> bool:
        """Whether a peer's request for bytes waits (or is dropped) while what we answered
        that peer is still in flight (daemon/answers.py)."""
        waits = self.host.answers.wait(event.peer, self, event)
        if waits is None:
            self.host.refused(event.peer, "peer_bytes", "requests waiting for answers")
            return True
        return waits

    def _release(self, event: Event) -> None:
        held = self._held.pop(id(event), None)
        if held is not None:
            self.host.holdings.give(*held)

    def changed(self) -> None:
        """The watcher saw the file change: look at it when the commit gate says (window.py),
        unless it is exactly as our own last append left it (a standby's own write is no
        news). Decided here, where that append is known, before the gate is asked."""
        if not self._as_own_append_left_it():
            self.host.commits.offer(self)

    def hint_local(self, replaced: bool = False) -> None:
        """Look at the local file again (the sweep, a directory moved, released());
        `replaced`: the watcher saw it deleted or moved over (kept as its own event: a later
        look must not swallow it)."""
        if replaced:
            self.deliver(Look(replaced=True))
        elif not self._look_pending:
            self._look_pending = True
            self._signal()

    def released(self) -> None:
        """The commit gate's release of a change the watcher saw that is not our own append:
        on a writer, new bytes nearly always. The look is full from the start: the stat and
        the read in one turn of the machine, not a stat-only look that hands on to a full one
        (two turns per commit). A sweep's or a directory's hint still starts with the stat
        alone (hint_local): at thousands of files, most of what a sweep finds changed is a
        standby's own appends, and a stat is all they need."""
        self._look_full = True
        self.hint_local()

    def _as_own_append_left_it(self) -> bool:
        """Whether the file is exactly as our own last append left it: the watcher reports our
        own writes too, and a look at them would find nothing the machine has not judged (it
        got this stat with the append). Any other write changes size, times or inode."""
        own = self._own
        if own is None:
            return False
        try:
            st = os.lstat(self._fspath)
        except OSError:
            return False
        return (st.st_ino == own.ino and st.st_size == own.size and st.st_dev == own.dev
                and st.st_mtime_ns == own.mtime_ns and st.st_ctime_ns == own.ctime_ns)

    def sweep(self, full: bool = True) -> None:
        """The node's periodic safety net: look again if the file changed since the last
        sweep (inotify can merge or drop events), and resume the log check if it is behind,
        so that thousands of idle files cost one stat each per sweep and nothing more.

        `full`: also tick if the machine is overdue. Its own timer (armed after every turn of
        the task, and on a reload) does that; this only backs it up, so the node asks for it
        on a few sweeps only (computing each idle machine's deadline every second was a fifth
        of the idle CPU)."""
        try:
            st = os.lstat(self._fspath)  # as logfile.stat: a symbolic link is not followed
        except FileNotFoundError:
            now = None
        else:
            now = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if now != self._swept:
            self._swept = now
            self.hint_local()
        self.checks.sweep()
        if full:
            due = self.machine.deadline()
            if due is not None and due <= asyncio.get_running_loop().time():
                self.deliver(TICK)

    @property
    def running(self) -> bool:
        """Started and not stopped (a reload may stop a replica the sweep still lists)."""
        return self._task is not None

    def retune(self, tuning: Tuning) -> None:
        """New timings (a reload): the machine's deadline may have moved earlier."""
        self.machine.tuning = tuning
        self._arm_timer()

    def reconnected(self) -> None:
        """A new broker connection: announce our position again and fetch what we lack."""
        self.deliver(Reconnected())

    def forget_peer(self, node: str) -> None:
        """`syncd forget`: a retired node's copy no longer counts, nor any divergence with it."""
        self.deliver(PeerForgotten(node))

    def set_role(self, role: str) -> None:
        self.deliver(RoleChanged(role))

    def _signal(self) -> None:
        """Wake the task; count this file as busy until its work is done."""
        if not self._busy:
            self._busy = True
            self.host.busy_files.add(self)
        self._wake.set()

    # --- the task -----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._load()
        finally:
            self.loaded.set()
        while True:
            await self._wake.wait(self._loop)
            self._wake.clear()
            try:
                await self._drain()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: unexpected error (will retry)", self.name)
            finally:
                if self._busy and not self._wake.is_set():
                    self._busy = False
                    self.host.busy_files.discard(self)
                self._arm_timer()

    async def _load(self) -> None:
        try:
            loaded = self.host.records.load(self.key, self.file)
            event: Event = (Loaded(*loaded) if loaded else Loaded(
                None, [], appending=self.host.records.load_appending(self.key, self.file)))
        except ValueError as e:
            event = Loaded(None, [], problem=str(e))
        except OSError as e:
            event = LoadFailed(f"cannot read the state of {self.name}: {e.strerror or e}")
        await self._handle(event)
        if self.machine.mode is Mode.LOADING:
            return  # a Rehash is under way or failed; its result is handled the same way
        self._look_pending = True
        self._signal()

    async def _drain(self) -> None:
        while self._inbox or self._look_pending:
            # The writer's new bytes first: everything else waits less than they do.
            if self._look_pending:
                self._look_pending = False
                event: Event = LOOK_FULL if self._look_full else LOOK
                self._look_full = False
            else:
                event = self._inbox.popleft()
                if self._held:
                    self._release(event)
                # Requests for bytes, and probes (up to 256 KiB of digests each): read only
                # while the answers to that peer in flight stay under the bound (answers.py).
                if isinstance(event, PeerRequest | PeerProbe) and self._answer_waits(event):
                    continue
            try:
                await self._handle(event)
            finally:
                self._unhandled.handled(event)
                # The commit under way is over, unless it goes on: a look at the stat hands
                # on to one with the bytes (Redeliver, first in the queue), and a read that
                # did not reach the end asks to look again. What changed meanwhile may
                # start the next one (daemon/window.py).
                if isinstance(event, Look) and not self._look_pending and not (
                        self._inbox and isinstance(self._inbox[0], Look)):
                    self.host.commits.done(self)
        await self._handle(DRAINED)

    async def _handle(self, event: Event) -> None:
        m = self.machine
        logoutput.PEER.set(getattr(event, "peer", None))  # JSON log lines about it name the peer
        plan = m.reads_for(event)
        loop = self._loop or asyncio.get_running_loop()
        if plan.empty:  # a decision that needs no file (two of a replicated write's three)
            effects = m.handle(event, EMPTY, loop.time(), time.time())
            if effects:
                await self._perform(effects)
            return
        reads: dict[tuple[int, int], bytes] = {}
        try:
            if not plan.ranges and plan.line_end_from is None:
                st, line_end = logfile.stat(self.spot), None
            elif event is LOOK_FULL:
                # The name resolved first, as a stat-only look would have: the descriptor of
                # the last read is then used again, not a fresh open (openfiles.py).
                st, reads, line_end = logfile.look(self.spot, plan.ranges, plan.line_end_from,
                                                 self.record_kind, plan.record_start)
            else:
                st, reads, line_end = logfile.snapshot(self.spot, plan.ranges, plan.line_end_from,
                                                     self.record_kind, plan.record_start)
        except OSError as e:
            self._unsafe(e)
            effects = m.handle(IoFailed(event, e.strerror or str(e)), EMPTY, loop.time(),
                               time.time())
        else:
            effects = m.handle(event, Snapshot(st, reads, line_end), loop.time(), time.time())
        await self._perform(effects)

    async def _perform(self, effects: list[Effect]) -> None:
        for e in effects:
            match e:
                case Send(kind=kind, payload=payload, to=to, retain=retain):
                    try:
                        self.host.send(kind, self.key, self.file, payload, to=to,
                                       retain=retain)
                    except ValueError as err:
                        # A topic the broker client refuses: the file stays served locally,
                        # the rest of the effects still run, and the log says why, once.
                        if not self._unsendable:
                            self._unsendable = True
                            log.error("%s: cannot publish: %s", self.name, err)
                    if kind is frames.Kind.LIVE and isinstance(payload, frames.Data):
                        self._shipped += len(payload.data)
                case Append():
                    await self._handle(self._append(e))
                case Sync(local=local):
                    await self._handle(await self._sync(local))
                case Durable(size=size):
                    self.host.durable(self.key, self.file, size)
                case LogCheck(restart=restart):
                    self.checks.on_log_check(restart)
                case Persist():
                    await self._persist(e)
                case NoteAppending(appending=appending, durable=durable):
                    # Before an append: a plain pwrite, never synced (one sync per frame
                    # doubled the lag). Durable only at a start with bytes past our end: off
                    # the loop, this file's effects wait for it.
                    note = self.host.records.note_appending
                    try:
                        if durable:
                            await asyncio.to_thread(note, self.key, self.file, appending, True)
                        else:
                            note(self.key, self.file, appending, False)
                    except OSError as err:
                        log.warning("%s: cannot note the append under way: %s", self.name,
                                    err.strerror or err)
                case Rehash():
                    await self._rehash(e)
                case Archive(manifest=manifest):
                    await self._handle(await self._archive(manifest))
                case FindLine(peer=peer, offset=offset):
                    try:
                        line = await asyncio.to_thread(logfile.line_number, self.spot, offset,
                                                        self.record_kind)
                    except OSError as err:
                        log.warning("%s: cannot count lines: %s", self.name, err)
                        continue
                    await self._handle(LineFound(peer, offset, line))
                case LookAgain():
                    self._look_pending = True
                case Redeliver(event=event):
                    self._unhandled.arrived(event)
                    self._inbox.appendleft(event)
                case Reassess():
                    self._inbox.append(e)
                case Reload():
                    await self._load()
                case Log(level=level, message=message):
                    log.log(level, "%s", message)
                case AdoptDone(ticket=ticket, result=result):
                    if isinstance(ticket, asyncio.Future) and not ticket.done():
                        ticket.set_result(result)

    # --- effects with results -----------------------------------------------------------------

    def _append(self, e: Append) -> Event:
        # Every Append is a peer's bytes (the local writer writes its own): none while free
        # space is below [limits] min_free_bytes, so that a full disk never stops the writer.
        # The machine pauses as on ENOSPC, and tries again every few seconds.
        why = self.host.growth_problem(self.key)
        if why is not None:
            return AppendFailed("full", f"not written: {why}")
        try:
            if e.inode is None:
                os.close(tree.open_dir(self.spot.parent, create_from=0))
                # The file is created here: its entry, and any folder made for it, are made
                # durable with its next sync (every directory from the root down: rare).
                parts = self.spot.parts
                self._new_entries.update(Spot(self.spot.top, parts[:i])
                                         for i in range(len(parts)))
            st = logfile.append_at(self.spot, e.offset, e.data, e.inode)
        except FileReplaced as err:
            return AppendFailed("replaced", str(err))
        except ConcurrentWrite as err:
            return AppendFailed("concurrent", str(err))
        except OSError as err:
            self._unsafe(err)
            kind = "full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "error"
            return AppendFailed(kind, f"cannot write {self.path}: {err.strerror or err}")
        self._own = st
        return Appended(e.peer, e.data, st)

    async def _sync(self, local: bool) -> Event:
        """fdatasync this file (and fsync the directories it or its folders were created in)
        on the sync thread, together with the other files waiting (groupsync.py). A lone
        small sync is waited for on the loop for a moment only (groupsync.INLINE_WAIT).

        Before such a sync, the frames queued so far are sent (the link writes them to the
        socket at once): the peers need not wait for our disk."""
        # Local bytes: only a batch just shipped is known to be small (a sync after a rehash
        # may flush a whole file the writer wrote while we were away).
        small = (0 < self._shipped <= INLINE_SYNC_BYTES if local
                 else self.machine.unsynced <= INLINE_SYNC_BYTES)
        self._shipped = 0
        inline = small and len(self.host.busy_files) <= 1
        if inline:
            self.host.flush()
        # The file's own entry too, once per inode: bytes announced as durable must not
        # vanish with a name a power loss takes back (the writer created the file, or renamed
        # a new one in, and may never have synced its directory).
        inode = self.machine.inode
        entry = () if inode is None or inode == self._entry_synced else (self.spot.parent,)
        dirs = tuple(self._new_entries | set(entry))
        try:
            await self.host.syncer.sync(self.spot, dirs, inline=inline and not entry)
        except OSError as err:
            return SyncFailed(err.strerror or str(err))
        self._new_entries.difference_update(dirs)
        if entry:
            self._entry_synced = inode
        return SYNCED

    async def _rehash(self, e: Rehash) -> None:
        try:
            ledger: Ledger | None = await asyncio.to_thread(
                logfile.hash_file, self.spot, None, e.whole_lines, e.hold, self.record_kind)
        except FileNotFoundError:
            ledger = None
        except OSError as err:
            self._unsafe(err)
            await self._perform(self.machine.handle(
                IoFailed(e, err.strerror or str(err)), EMPTY, asyncio.get_running_loop().time(),
                time.time()))
            return
        await self._handle(Rehashed(e.purpose, ledger, e.why))

    async def _archive(self, manifest: dict[str, object]) -> Event:
        try:
            dest = await asyncio.to_thread(archive_copy, self.host.state_dir, self.host.node,
                                           self.key, self.file, self.spot, manifest)
        except OSError as err:
            self._unsafe(err)
            return ArchiveFailed(err.strerror or str(err))
        self.host.records.forget_chain(self.key, self.file)
        return Archived(str(dest))

    def _unsafe(self, err: OSError) -> None:
        """A link or a special file where the log or its directories should be: counted and
        shown with the others (the machine says what it means for the file)."""
        if isinstance(err, logfile.NotRegularFile):
            self.host.note_unsafe(printable(err.where), err.kind, err.strerror or str(err))

    async def _persist(self, e: Persist) -> None:
        records = self.host.records
        if e.rebuilt:
            records.forget_chain(self.key, self.file)
        chain = e.chain
        if chain is None:
            # Frozen before a ledger existed: keep the previous chain file as it is.
            loaded = records.load(self.key, self.file)
            chain = loaded[1] if loaded else []
        if not e.durable and e.chain is not None:
            records.save_later(self.key, self.file, e.record, chain)
            return
        try:
            if e.durable:  # fsyncs (file, rename, folder): off the loop, waited for here
                await asyncio.to_thread(records.save, self.key, self.file, e.record, chain,
                                        True)
            else:
                records.save(self.key, self.file, e.record, chain, durable=False)
        except OSError as err:
            self.machine.record_not_kept()
            log.error("%s: cannot record the position in %s: %s", self.name, records.root, err)

    # --- time ---------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        due = self.machine.deadline()
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = due
        if due is not None:
            self._timer = (self._loop or asyncio.get_running_loop()).call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self.deliver(TICK)

    # --- operator ------------------------------------------------------------------------------

    def adopt(self, source: str, done: asyncio.Future[dict[str, object]]) -> None:
        self.deliver(AdoptRequested(source, done))

    def scrub_failed(self) -> None:
        self.deliver(ScrubMismatch())

    def status(self) -> dict[str, object]:
        m = self.machine
        checks = self.checks
        report = checks.report()
        out = m.status()
        facts = readyfacts.gather(m, out, checks, report, self.host, self.key, self._unhandled)
        verdict = decide(facts)
        peers = out["peers"]
        assert isinstance(peers, dict)
        for node, p in peers.items():
            p["offline_since"] = self.host.offline_since(node)
            p["heard_at"] = m.peers[node].heard_at
        missing = facts.missing_resources
        # What the file holds now, even while frozen (when nothing else looks at it).
        st = logfile.stat(self.path)
        out.update(
            path=str(self.path),
            file_size=st.size if st else 0,
            ready=verdict.ready,
            not_ready=verdict.not_ready,
            notes=verdict.notes,
            missing_resources=len(missing),
            missing_resources_first=list(missing[:MISSING_SHOWN]),
            log_check=checks.status(report),
        )
        return out
