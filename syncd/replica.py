"""One replicated file on this host: its ledger, what peers hold, and one task that acts.

Everything that touches the file goes through this replica's task, one event at a time, so a
local append, a peer's bytes and a peer's request never race each other. The decisions come
from `reconcile`; this module reads and writes what they need and publishes what they say.

Events: "local" (the watcher or the sweep says: look at the file), a peer's position, data,
request or refusal, "tick" (time passed: retry a stalled fetch, persist), and "scrub" (check
the bytes already shipped against the ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from syncd import adoption, frames, locate, logs, store
from syncd.adoption import Adoption
from syncd.frames import Announce, Data, Probe, Probed, Refuse, Request
from syncd.groupsync import GroupSync
from syncd.ledger import BLOCK, Ledger, Position, block_start
from syncd.persist import FileRecord, Freeze, RecordStore
from syncd.readiness import IncrementalVerifier, readiness
from syncd.reconcile import (
    LocalChange,
    PeerState,
    Verdict,
    choose_source,
    classify_local,
    file_state,
    first_differing_byte,
    judge_data,
    judge_peer,
    judge_request,
)

log = logging.getLogger("syncd.replica")


class Host(Protocol):
    """What a replica needs from the node that owns it."""

    node: str
    chunk_bytes: int
    fetch_window: int
    request_timeout: float
    persist_interval: float
    records: RecordStore
    busy: int  # how many replicas have work waiting or under way
    syncer: GroupSync
    state_dir: Path

    def role_of(self, key: str) -> str: ...

    def send(self, kind: frames.Kind, key: str, file: str, payload: frames.Payload,
             to: str = "", retain: bool = False) -> None: ...

    def is_online(self, node: str) -> bool: ...

    def durable(self, key: str, file: str, size: int) -> None: ...


@dataclass
class PeerView:
    position: Position
    frozen: str | None
    state: PeerState = PeerState.AHEAD
    verified: bool = False  # consistency checked for this position
    probed: bool = False  # a zero-length request was sent to check consistency


@dataclass
class Fetch:
    peer: str
    upto: int
    deadline: float


Event = tuple[str, str, object]  # (what, from node, payload)
ANNOUNCE_GAP = 0.5  # seconds between position announcements of one file
LOAD_RETRY_SECONDS = 5
PAUSE_RETRY_SECONDS = 2.0
INLINE_SYNC_BYTES = 64 * 1024  # how often a paused file tries to write again
SETTLE_SECONDS = 0.2  # a file that shrank must hold still this long before it is judged


class Replica:
    def __init__(self, host: Host, key: str, file: str, path: Path) -> None:
        self.host = host
        self.key = key
        self.file = file
        self.path = path
        self.ledger: Ledger | None = None  # None until verified at start, or frozen meanwhile
        self.position = Position.empty()  # what we announce
        self.inode: tuple[int, int] | None = None
        self.seen: tuple[int, int] | None = None
        self.role = host.role_of(key)
        self.freeze: Freeze | None = None
        self.diverged: dict[str, Freeze] = {}
        self.note: str | None = None
        self.paused: str | None = None  # why applying stopped for now (disk full, ...)
        self.error: str | None = None  # why the file cannot be loaded at all
        self._pause_until = 0.0
        self._locating: dict[str, float] = {}  # peer -> when we last asked it (to retry)
        self.adopting: Adoption | None = None
        self.peers: dict[str, PeerView] = {}
        self.fetch: Fetch | None = None
        self.verifying = True
        self.record_dirty = False
        self.last_persist = 0.0
        self._unsynced = 0  # bytes written but not yet fdatasync'ed: never recorded as held
        self.last_stat: store.Stat | None = None
        self.counters = {"shipped_bytes": 0, "applied_bytes": 0, "served_bytes": 0,
                         "shipped_frames": 0, "applied_frames": 0, "served_frames": 0}
        self._inbox: deque[Event] = deque()
        self._local_pending = False
        self._busy = False  # counted in host.busy
        self._swept: tuple[int, int, int, int] | None = None  # stat at the last sweep
        self._replaced = False  # the watcher saw the file deleted or renamed over
        self._settle: tuple[tuple[int, int, int] | None, float] | None = None
        self._absorbing = -1  # offset of a peer's frame held back while local bytes ship
        self._own_move_until = 0.0  # deletions before this are our own (archiving on adopt)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.verifier = IncrementalVerifier(path, host.records.root / key / f"{file}.verify")
        self._last_announce = -ANNOUNCE_GAP
        self._announce_timer: asyncio.TimerHandle | None = None
        self.loaded = asyncio.Event()  # set once the start-up check is done (even if it failed)

    # --- intake (called on the event loop, never blocks) ------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.persist(force=True)
        await self.verifier.close()
        if self._busy:
            self._busy = False
            self.host.busy -= 1

    def forget_peer(self, node: str) -> None:
        """`syncd forget`: a retired node's copy no longer counts, nor any divergence with it."""
        self.peers.pop(node, None)
        self._locating.pop(node, None)
        if self.fetch is not None and self.fetch.peer == node:
            self.fetch = None
        if self.diverged.pop(node, None) is not None:
            log.warning("%s: divergence with %s dropped: that node was retired (syncd forget)",
                        self.name, node)
            self.record_dirty = True
            self.persist(force=True)
            if not self.frozen:
                self.announce(now=True)
        self.deliver("tick", "", None)

    def _verify_follow(self) -> None:
        # Not while catching up: the log checks would compete with the fetch for the GIL, and
        # a copy that is behind is not ready anyway. The tick resumes them.
        if self.fetch is None:
            self.verifier.follow(lambda: self.ledger.size if self.ledger is not None else 0)

    @property
    def name(self) -> str:
        return f"{self.key}/{self.file}"

    def hint_local(self, replaced: bool = False) -> None:
        """Look at the local file again; `replaced`: it was deleted or renamed over."""
        if (replaced and self.ledger is not None and self.ledger.size > 0
                and time.monotonic() > self._own_move_until):
            self._replaced = True
        if not self._local_pending:
            self._local_pending = True
            self._signal()

    def sweep(self) -> None:
        """The node's periodic safety net: look again if the file changed since the last sweep
        (inotify can merge or drop events), and tick only if time-driven work is pending, so
        that thousands of idle files cost one stat each per sweep and nothing more."""
        st = store.stat(self.path)
        now = (st.ino, st.size, st.mtime_ns, st.ctime_ns) if st else None
        if now != self._swept:
            self._swept = now
            self.hint_local()
        if self._wants_tick():
            self.deliver("tick", "", None)

    def _wants_tick(self) -> bool:
        return bool(
            self.fetch is not None
            or self.paused is not None
            or (self.ledger is not None and self.verifier.size < self.ledger.size)
            or self.adopting is not None
            or self.record_dirty
            or self.verifier.unsaved
            or any(f.line is None and self.host.is_online(p) for p, f in self.diverged.items())
        )

    def deliver(self, what: str, sender: str, payload: object) -> None:
        self._inbox.append((what, sender, payload))
        self._signal()

    def _signal(self) -> None:
        """Wake the task; count this file as busy until its work is done (see _sync)."""
        if not self._busy:
            self._busy = True
            self.host.busy += 1
        self._wake.set()

    @property
    def frozen(self) -> str | None:
        if self.freeze is not None:
            return self.freeze.reason
        return "diverged" if self.diverged else None

    # --- the task ---------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                try:
                    await self._load()
                    break
                except OSError as e:
                    # Unreadable (permissions, a directory in its place, an I/O error): say so
                    # once, keep the other files going, and try again now and then.
                    if self.error is None:
                        log.error("%s: cannot read %s: %s; this file is not replicated until "
                                  "it can be read (retrying every %ds)", self.name, self.path,
                                  e.strerror or e, LOAD_RETRY_SECONDS)
                    self.error = f"cannot read {self.path}: {e.strerror or e}"
                    self.verifying = False
                    self.loaded.set()
                    await asyncio.sleep(LOAD_RETRY_SECONDS)
        except Exception:
            log.exception("%s: cannot load; this file is not replicated", self.name)
            return
        finally:
            self.verifying = False
            self.loaded.set()
        if self.error is not None:
            log.warning("%s: readable again; replication starts", self.name)
            self.error = None
        if self.ledger is not None and self.note is None:
            self.verifier.restore(self.ledger.size)
        self._verify_follow()
        self.announce()
        self._local_pending = True
        self._signal()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._drain()
            except asyncio.CancelledError:
                raise
            except OSError as e:
                # Disk full, permissions, a vanished directory: say so, keep everything, retry
                # on the next event or tick.
                log.error("%s: I/O error: %s (will retry)", self.name, e)
            except Exception:
                log.exception("%s: unexpected error (will retry)", self.name)
            finally:
                if self._busy and not self._wake.is_set():
                    self._busy = False
                    self.host.busy -= 1

    async def _drain(self) -> None:
        while self._inbox or self._local_pending:
            if self._local_pending:
                self._local_pending = False
                logs.PEER.set(None)
                await self._look_local()
                continue
            what, sender, payload = self._inbox.popleft()
            logs.PEER.set(sender or None)  # JSON log lines about this event name the peer
            match what:
                case "pos":
                    assert isinstance(payload, Announce)
                    self._on_announce(sender, payload)
                case "data":
                    assert isinstance(payload, Data)
                    self._on_data(sender, payload)
                    if self._unsynced >= self.host.fetch_window:
                        await self._make_durable()
                case "req":
                    assert isinstance(payload, Request)
                    self._on_request(sender, payload)
                case "refuse":
                    assert isinstance(payload, Refuse)
                    self._on_refuse(sender, payload)
                case "tick":
                    self._on_tick()
                case "scrub":
                    await self._check_whole_file("scrub")
                case "probe":
                    assert isinstance(payload, Probe)
                    locate.answer(self, sender, payload)
                case "probed":
                    assert isinstance(payload, Probed)
                    await locate.narrow(self, sender, payload)
                case "adopt":
                    assert isinstance(payload, asyncio.Future)
                    await adoption.adopt(self, sender, payload)
        await self._make_durable()
        self.persist()

    async def _sync(self) -> None:
        """fdatasync the file: inline when this is the only busy file and the batch is small
        (a thread hop costs more than the sync), else in a worker thread, so that many busy
        files sync in parallel instead of one after the other on the event loop."""
        if self.host.busy <= 1 and self._unsynced <= INLINE_SYNC_BYTES:
            store.sync(self.path)
        else:
            await self.host.syncer.sync(self.path)

    async def _make_durable(self) -> None:
        """One fdatasync for a batch of applied bytes, then (and only then) tell everyone."""
        if not self._unsynced:
            return
        await self._sync()
        self._unsynced = 0
        assert self.ledger is not None
        self.host.durable(self.key, self.file, self.ledger.size)
        self._after_growth()
        self._maybe_fetch()

    # --- start-up: re-establish the ledger without trusting a changed file -----------------

    async def _load(self) -> None:
        try:
            loaded = self.host.records.load(self.key, self.file)
        except ValueError as e:
            log.warning("%s: %s; rehashing the file", self.name, e)
            loaded = None
        st = store.stat(self.path)
        if loaded is None:
            self.ledger = await asyncio.to_thread(store.hash_file, self.path) if st else Ledger()
            self._adopt_stat(st)
            self.record_dirty = True
            return
        rec, chain = loaded
        self.freeze, self.diverged, self.note = rec.freeze, dict(rec.diverged_peers), rec.note
        self.position = Position(rec.size, rec.digest)
        if st is None:
            if rec.size > 0 and self.freeze is None:
                self._freeze("reset", f"file deleted while syncd was stopped (held {rec.size} "
                                      "bytes)")
            if rec.size == 0:
                self.ledger = Ledger()
            return
        if rec.size > 0 and st.inode != (rec.dev, rec.ino):
            if self.freeze is None:
                self._freeze("reset", "file replaced (new inode) while syncd was stopped")
            return
        if st.size < rec.size:
            if self.freeze is None:
                self._freeze("reset", f"file shrank from {rec.size} to {st.size} bytes while "
                                      "syncd was stopped")
            return
        unchanged = (st.size, st.mtime_ns, st.ctime_ns) == (rec.file_size, rec.mtime_ns,
                                                            rec.ctime_ns)
        if unchanged:
            partial = store.partial_block(self.path, rec.size)
            if hashlib.sha256(partial).digest() == rec.partial and len(chain) > rec.size // BLOCK:
                self.ledger = Ledger.restore(chain, rec.size, partial)
                self._adopt_stat(st)
                return
        # Changed while we were away (appended, or edited): rehash before trusting anything.
        ledger = await asyncio.to_thread(store.hash_file, self.path)
        self.host.records.forget_chain(self.key, self.file)
        ok = ledger.size >= rec.size and ledger.digest_at(
            rec.size, store.partial_block(self.path, rec.size)) == rec.digest
        self.ledger = ledger
        self._adopt_stat(st)
        self.record_dirty = True
        if not ok:
            self._noticed_edit(_first_change(chain, ledger, rec.size), "while syncd was stopped")

    def _adopt_stat(self, st: store.Stat | None) -> None:
        self.last_stat = st
        self.inode = st.inode if st else None
        self.seen = (st.size, st.mtime_ns) if st else None
        if self.ledger is not None:
            self.position = Position(self.ledger.size, self.ledger.digest())

    # --- local file -------------------------------------------------------------------------

    async def _look_local(self) -> None:
        if self.ledger is None:
            return
        st = store.stat(self.path)
        now = (st.dev, st.ino, st.size, st.mtime_ns) if st else None
        change = classify_local(self.ledger.size, self.inode, self.seen, now)
        if self._replaced:
            self._replaced = False
            if self.freeze is None:
                what = "deleted" if st is None else "deleted or renamed over, then recreated"
                self._freeze("reset", f"file {what} (held {self.ledger.size} bytes)")
            return
        if change is LocalChange.NONE:
            return
        if change is LocalChange.RESET:
            # A rewrite (truncate, then write) passes through "shorter": judge the file only
            # once it has stopped changing for a moment.
            if self._settled(st):
                await self._shrunk_or_replaced(st)
            return
        assert st is not None
        self.seen = (st.size, st.mtime_ns)
        self.last_stat = st
        if self.inode is None:
            self.inode = st.inode
        if change is LocalChange.TOUCHED:
            await self._check_whole_file("changed without growing")
            return
        if self.frozen:
            return
        if self.role == "replica" and store.last_line_end(self.path, self.ledger.size,
                                                          st.size) > self.ledger.size:
            self._freeze("diverged", "local write on a host whose role for this key is "
                                     f"'replica' (bytes past offset {self.ledger.size})",
                         offset=self.ledger.size)
            return
        await self._ship(st.size)

    def _settled(self, st: store.Stat | None) -> bool:
        now = (st.ino, st.size, st.mtime_ns) if st else None
        loop = asyncio.get_running_loop()
        if self._settle is None or self._settle[0] != now:
            self._settle = (now, loop.time())
            loop.call_later(SETTLE_SECONDS, self.hint_local)
            return False
        if loop.time() - self._settle[1] < SETTLE_SECONDS:
            loop.call_later(SETTLE_SECONDS, self.hint_local)
            return False
        self._settle = None
        return True

    async def _shrunk_or_replaced(self, st: store.Stat | None) -> None:
        """Fewer bytes than we held, or another file: a reset, unless it is plainly an edit.

        A reset freezes the file here and nowhere else: we neither pour the old history back
        into the new file nor push the reset to the peers. A copy that shrank because bytes
        inside it changed (the seed's "delete the bad line") is an edit: described as it is,
        it makes every peer that holds the old bytes diverge, as any other edit does.
        """
        ledger = self.ledger
        assert ledger is not None
        if st is None:
            self._freeze("reset", f"file deleted (held {ledger.size} bytes)")
            return
        if self.inode is not None and st.inode != self.inode:
            self._freeze("reset", f"file replaced (new inode; held {ledger.size} bytes)")
            return
        raw = await asyncio.to_thread(store.hash_file, self.path, None, False)
        if raw.size < ledger.size and ledger.is_prefix_of_ours(raw) is False:
            where = _first_change(ledger, raw)
            self.ledger = await asyncio.to_thread(store.hash_file, self.path)
            self.host.records.forget_chain(self.key, self.file)
            self._adopt_stat(store.stat(self.path))
            self._noticed_edit(where, f"file rewritten shorter, {ledger.size} -> {st.size} "
                                      "bytes")
            return
        self._freeze("reset", f"file truncated from {ledger.size} to {st.size} bytes")

    async def _ship(self, file_size: int) -> None:
        """Send local growth: whole lines only, after re-reading the bytes we vouch for."""
        ledger = self.ledger
        assert ledger is not None
        start = ledger.size
        chunk = self.host.chunk_bytes
        # One read for the common case: the partial block below our end, which we re-check
        # (an in-place edit there followed by an append would otherwise ship under a stale
        # digest), and the new bytes.
        first = block_start(start)
        limit = min(file_size, start + chunk)
        buf = store.read_range(self.path, first, limit)
        if buf[: start - first] != ledger.tail:
            await self._check_whole_file("bytes below the end changed")
            return
        pending = buf[start - first :]
        if limit == file_size:
            cut = pending.rfind(b"\n")
            end = start + cut + 1 if cut >= 0 else start
        else:
            end = store.last_line_end(self.path, start, file_size)
        pos = start
        while pos < end:
            want = min(end - pos, chunk)
            if len(pending) < want:
                pending = store.read_range(self.path, pos, pos + want)
                if len(pending) < want:
                    break  # shrank under us; the next look will say how
            n = frames.piece_end(pending, 0, end - pos, chunk)
            data, pending = pending[:n], pending[n:]
            frame = Data(pos, ledger.digest(), data)
            ledger.extend(data)
            self.host.send(frames.Kind.LIVE, self.key, self.file, frame)
            pos += len(data)
            self.counters["shipped_bytes"] += len(data)
            self.counters["shipped_frames"] += 1
        if pos == start:
            return
        # Never inline here: the frames just queued go out on the next loop turn, which an
        # inline sync would hold back.
        await self.host.syncer.sync(self.path)
        self.host.durable(self.key, self.file, ledger.size)
        self._after_growth()

    async def _check_whole_file(self, why: str) -> None:
        """Rehash the file and compare it with the ledger (which describes what we shipped)."""
        ledger = self.ledger
        if ledger is None:
            return
        fresh = await asyncio.to_thread(store.hash_file, self.path, None)
        if fresh.size >= ledger.size:
            partial = store.partial_block(self.path, ledger.size)
            if fresh.digest_at(ledger.size, partial) == ledger.digest():
                return
        where = _first_change(ledger, fresh)
        self.ledger = fresh
        self.host.records.forget_chain(self.key, self.file)
        self._adopt_stat(store.stat(self.path))
        self._noticed_edit(where, why)

    def _noticed_edit(self, where: int, why: str) -> None:
        """Bytes we had already vouched for changed here. Describe the file as it is now.

        We do not freeze on our own: announcing the new digest makes every peer that holds
        the old bytes see a divergence (and us see theirs), while a peer that never had those
        bytes may still fast-forward: that is the reconcile rule, applied to the copy we hold.
        """
        self.note = (f"bytes already replicated were changed locally ({why}); first "
                     f"difference in the 64 KiB block at offset {where}")
        log.warning("%s: %s", self.name, self.note)
        for view in self.peers.values():
            view.verified = False
        self.record_dirty = True
        self.verifier.restart()
        self._verify_follow()
        self.announce(now=True)

    # --- peers ------------------------------------------------------------------------------

    def _on_announce(self, sender: str, a: Announce) -> None:
        view = self.peers.get(sender)
        pos = Position(a.size, a.digest)
        if view is None or view.position != pos:
            view = PeerView(pos, a.frozen)
            self.peers[sender] = view
        view.frozen = a.frozen
        self._assess(sender, view)
        adoption.check_done(self)
        self._maybe_fetch()

    def _assess(self, sender: str, view: PeerView) -> None:
        ledger = self.ledger
        if ledger is None:
            return
        peer = view.position
        if view.verified:
            view.state = PeerState.IN_SYNC if peer.size == ledger.size else PeerState.BEHIND
            return
        if peer.size > ledger.size:
            view.state = PeerState.DIVERGED if sender in self.diverged else PeerState.AHEAD
            if view.frozen is not None and not view.probed:
                # We will not fetch from a frozen peer, so ask it once whether our prefix is
                # its prefix: a zero-length request is answered only by a refusal.
                view.probed = True
                self.host.send(frames.Kind.REQ, self.key, self.file,
                               Request(ledger.size, ledger.digest(), ledger.size, 0), to=sender)
            return
        view.state = judge_peer(self._position(), peer, self._digest_at(peer.size))
        view.verified = view.state is not PeerState.DIVERGED
        if view.state is PeerState.DIVERGED:
            self._diverge(sender, peer.size, f"{sender} announced a copy of {peer.size} bytes "
                                             "whose prefix differs from ours")
        elif sender in self.diverged:
            del self.diverged[sender]
            self.record_dirty = True
            log.warning("%s: %s's copy is consistent with ours again; divergence with it cleared",
                        self.name, sender)
            if not self.frozen:
                self.announce()

    def _on_data(self, sender: str, d: Data) -> None:
        """Apply a peer's bytes if they extend ours (made durable by `_make_durable`)."""
        ledger = self.ledger
        if ledger is None:
            return
        adopting = self.adopting is not None and self.adopting.peer == sender
        if not adopting and (self.frozen or self.role == "source"):
            return
        verdict = judge_data(self._position(), d.offset, d.base)
        if verdict is Verdict.GAP:
            self._maybe_fetch()
            return
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.DIVERGED:
            self._diverge(sender, d.offset, f"{sender} sent bytes at {d.offset} after a prefix "
                                           "that differs from ours")
            return
        st = store.stat(self.path)
        data = d.data
        if st is not None and st.size > ledger.size:
            # Bytes past our end that are the very bytes this frame brings: the first pieces
            # of a long line that we applied before a crash (a restart only trusts whole
            # lines). They are the sender's history, so count them and append the rest.
            have = store.read_range(self.path, ledger.size, min(st.size, d.end))
            if have and data.startswith(have):
                ledger.extend(have)
                self._unsynced += len(have)
                data = data[len(have) :]
                if not data:
                    self._adopt_stat(st)
                    return
                st = store.stat(self.path)
        if st is not None and st.size != ledger.size:
            # Bytes we have not shipped yet sit past our end: a local writer. Take them into
            # the ledger first (and announce them), so both sides see the two histories;
            # then this frame is judged again.
            if self._absorbing != d.offset:
                self._absorbing = d.offset
                self._inbox.appendleft(("data", sender, d))
                self._local_pending = True
                return
            self._diverge(sender, ledger.size, f"unterminated local line past offset "
                                               f"{ledger.size}, while {sender} sent other bytes")
            return
        self._absorbing = -1
        try:
            if st is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            after = store.append(self.path, ledger.size, data, durable=False)
        except store.ConcurrentWrite as e:
            self._freeze("diverged", f"another process wrote while applying {sender}'s bytes: "
                                     f"{e}", peer=sender, offset=d.offset)
            return
        except OSError as e:
            # Disk full, quota, permissions: nothing partial stays behind (store.append takes
            # its own bytes back); stop asking for more until a tick tries again.
            self._pause(f"cannot write {self.path}: {e.strerror or e}")
            return
        if self.paused is not None:
            log.warning("%s: writing works again; replication resumed", self.name)
            self.paused = None
        ledger.extend(data)
        self._unsynced += len(data)
        self.counters["applied_bytes"] += len(data)
        self.counters["applied_frames"] += 1
        self._adopt_stat(after)
        # The sender held exactly these bytes: its position is known without its announcement.
        view = self.peers.get(sender)
        if view is not None and view.position.size < ledger.size:
            view.position, view.verified = Position(ledger.size, ledger.digest()), True
            view.state = PeerState.IN_SYNC
        if self.fetch is not None and self.fetch.peer == sender:
            self.fetch.deadline = time.monotonic() + self.host.request_timeout

    def _on_request(self, sender: str, r: Request) -> None:
        # Even a frozen file answers "your prefix differs": that is how the others learn.
        ledger = self.ledger
        if ledger is None:
            return
        ours = self._digest_at(r.have) if r.have <= ledger.size else None
        verdict = judge_request(ledger.size, r.have, r.digest, ours)
        if verdict is Verdict.DIVERGED:
            assert ours is not None
            self.host.send(frames.Kind.REFUSE, self.key, self.file, Refuse(r.have, ours),
                           to=sender)
            self._diverge(sender, r.have, f"{sender} asked for bytes after a prefix of {r.have} "
                                          "bytes that differs from ours")
            return
        if verdict is not Verdict.APPEND or (self.frozen and not r.force):
            return
        start = max(r.start, r.have)
        end = min(ledger.size, start + min(r.length, self.host.fetch_window))
        if start >= end:
            return
        first = block_start(start)
        buf = store.read_range(self.path, first, end)
        if len(buf) != end - first:
            self.hint_local()  # the file shrank under us; the local look will say how
            return
        pos = start
        while pos < end:
            stop = first + frames.piece_end(buf, pos - first, end - first, self.host.chunk_bytes)
            base = ledger.digest_at(pos, buf[block_start(pos) - first : pos - first])
            chunk = buf[pos - first : stop - first]
            self.host.send(frames.Kind.FILL, self.key, self.file, Data(pos, base, chunk),
                           to=sender)
            self.counters["served_bytes"] += len(chunk)
            self.counters["served_frames"] += 1
            pos = stop

    def _on_refuse(self, sender: str, rf: Refuse) -> None:
        ledger = self.ledger
        if ledger is None or rf.offset > ledger.size:
            return
        if self._digest_at(rf.offset) != rf.digest:
            self._diverge(sender, rf.offset, f"{sender} holds a different prefix of {rf.offset} "
                                             "bytes")

    def _pause(self, reason: str) -> None:
        if self.paused is None:
            log.error("%s: PAUSED: %s; the copy stays a prefix, retrying every few seconds",
                      self.name, reason)
        self.paused = reason
        self._pause_until = time.monotonic() + PAUSE_RETRY_SECONDS
        self.fetch = None

    def _on_tick(self) -> None:
        if self.fetch is not None and time.monotonic() > self.fetch.deadline:
            log.info("%s: no answer from %s for bytes up to %d; asking again", self.name,
                     self.fetch.peer, self.fetch.upto)
            self.fetch = None
        self.verifier.save()
        self._verify_follow()
        for peer, f in self.diverged.items():
            asked = self._locating.get(peer)
            if f.line is None and (asked is None or time.monotonic() - asked > 5):
                locate.ask(self, peer)
        self._maybe_fetch()

    def _maybe_fetch(self) -> None:
        ledger = self.ledger
        adoption = self.adopting
        if ledger is None or (adoption is None and (self.frozen or self.role == "source")):
            self.fetch = None
            return
        if self.paused is not None and time.monotonic() < self._pause_until:
            return
        if adoption is not None:
            view = self.peers.get(adoption.peer)
            candidates = {adoption.peer: (view.position.size if view else 0,
                                          self.host.is_online(adoption.peer))}
        else:
            candidates = {
                node: (v.position.size,
                       v.frozen is None and node not in self.diverged
                       and self.host.is_online(node))
                for node, v in self.peers.items()
            }
        source = choose_source(ledger.size, candidates)
        if source is None:
            self.fetch = None
            return
        window = self.host.fetch_window
        peer_size = self.peers[source].position.size
        f = self.fetch
        if f is not None and f.peer == source:
            if f.upto >= peer_size or f.upto - ledger.size >= window // 2:
                return  # enough already on its way
            start = max(ledger.size, f.upto)
        else:
            start = ledger.size
        self.host.send(frames.Kind.REQ, self.key, self.file,
                       Request(ledger.size, ledger.digest(), start, window,
                               force=adoption is not None), to=source)
        self.fetch = Fetch(source, start + window, time.monotonic() + self.host.request_timeout)

    # --- helpers ----------------------------------------------------------------------------

    def _position(self) -> Position:
        assert self.ledger is not None
        return Position(self.ledger.size, self.ledger.digest())

    def _digest_at(self, offset: int) -> bytes:
        assert self.ledger is not None
        if offset == self.ledger.size:
            return self.ledger.digest()
        return self.ledger.digest_at(offset, store.partial_block(self.path, offset))

    def _after_growth(self) -> None:
        assert self.ledger is not None
        self.position = Position(self.ledger.size, self.ledger.digest())
        self.record_dirty = True
        for sender, view in self.peers.items():
            self._assess(sender, view)
        self.announce()
        adoption.check_done(self)
        self._verify_follow()

    def announce(self, now: bool = False) -> None:
        """Publish our position (retained), at most every ANNOUNCE_GAP seconds per file.

        Positions are not on the data path (live frames and gaps are), so under a stream of
        appends one trailing announcement per gap carries the latest position; a freeze or
        a new connection is announced at once.
        """
        loop = asyncio.get_running_loop()
        wait = self._last_announce + ANNOUNCE_GAP - loop.time()
        if now or wait <= 0:
            if self._announce_timer is not None:
                self._announce_timer.cancel()
                self._announce_timer = None
            self._last_announce = loop.time()
            self.host.send(frames.Kind.POS, self.key, self.file,
                           Announce(self.position.size, self.position.digest, self.frozen),
                           retain=True)
        elif self._announce_timer is None:
            self._announce_timer = loop.call_later(wait, self.announce, True)

    def _diverge(self, peer: str, offset: int, detail: str) -> None:
        if peer in self.diverged:
            return
        first = not self.frozen
        self.diverged[peer] = Freeze("diverged", detail, time.time(), peer=peer, offset=offset)
        view = self.peers.get(peer)
        if view is not None:
            view.state, view.verified = PeerState.DIVERGED, False
        log.error("%s: DIVERGED from %s: %s; this file is frozen (no bytes are written or sent) "
                  "until an operator resolves it", self.name, peer, detail)
        if self.adopting is None:
            self.fetch = None
        locate.ask(self, peer)
        self.record_dirty = True
        self.persist(force=True)
        if first:
            self.announce(now=True)

    def _freeze(self, reason: str, detail: str, peer: str | None = None,
                offset: int | None = None) -> None:
        self.freeze = Freeze(reason, detail, time.time(), peer=peer, offset=offset)
        self.fetch = None
        if reason == "reset":
            # We no longer know what the file holds; keep announcing what we last held.
            self.ledger = None
        log.error("%s: %s: %s; this file is frozen until an operator resolves it", self.name,
                  reason.upper(), detail)
        self.record_dirty = True
        self.persist(force=True)
        self.announce(now=True)

    def persist(self, force: bool = False) -> None:
        # Never record a size that is not durable yet: after a power loss the file would look
        # shorter than recorded, which reads as a reset.
        if not self.record_dirty or self.verifying or self._unsynced:
            return
        now = time.monotonic()
        if not force and now - self.last_persist < self.host.persist_interval:
            return
        st = self.last_stat
        ledger = self.ledger
        partial = ledger.partial_digest() if ledger else b""
        chain = ledger.chain if ledger else []
        if ledger is None and st is None:
            st = store.Stat(0, 0, 0, 0, 0)
        record = FileRecord(
            size=self.position.size, digest=self.position.digest,
            file_size=st.size if st else 0, dev=st.dev if st else 0, ino=st.ino if st else 0,
            mtime_ns=st.mtime_ns if st else 0, ctime_ns=st.ctime_ns if st else 0,
            partial=partial, freeze=self.freeze, diverged_peers=dict(self.diverged),
            note=self.note,
        )
        if ledger is None:
            # Frozen before a ledger existed: keep the previous chain file as it is.
            loaded = self.host.records.load(self.key, self.file)
            chain = loaded[1] if loaded else []
        self.host.records.save(self.key, self.file, record, chain, durable=force)
        self.record_dirty = False
        self.last_persist = now

    def status(self) -> dict[str, object]:
        peers = {}
        for node, v in sorted(self.peers.items()):
            peers[node] = {
                "size": v.position.size,
                "state": v.state.value,
                "frozen": v.frozen,
                "online": self.host.is_online(node),
                "lag_bytes": max(0, self.position.size - v.position.size),
            }
        states = [v.state for v in self.peers.values()]
        if self.error:
            state = "error"
        elif self.paused and not self.frozen:
            state = "paused"
        else:
            state = file_state(self.frozen, self.verifying, states)
        report = self.verifier.report()
        ahead = {n: v.position.size - self.position.size for n, v in self.peers.items()
                 if v.position.size > self.position.size and n not in self.diverged}
        ready, why_not = readiness(state, self.frozen, ahead, report, self.verifier.size,
                                   self.ledger.size if self.ledger else self.position.size)
        return {
            "key": self.key,
            "file": self.file,
            "path": str(self.path),
            "size": self.position.size,
            "file_size": self.last_stat.size if self.last_stat else 0,
            "state": state,
            "ready": ready,
            "not_ready": why_not,
            "log_check": {"bytes": self.verifier.size, "read": self.verifier.bytes_read,
                          "clean": report.clean if report else None,
                          "problems": dict(report.problem_counts) if report else {}},
            "role": self.role,
            "paused": self.paused,
            "error": self.error,
            "note": self.note,
            "adopting": self.adopting.peer if self.adopting else None,
            "freeze": self.freeze.to_json() if self.freeze else None,
            "diverged": {n: f.to_json() for n, f in sorted(self.diverged.items())},
            "peers": peers,
            **self.counters,
        }


def _first_change(old: Ledger | list[bytes], fresh: Ledger, size: int | None = None) -> int:
    """Where two versions of a file first differ: the byte when the old tail is known (old is
    a Ledger), else the start of the first differing block."""
    chain = old.chain if isinstance(old, Ledger) else old
    changed = fresh.first_changed_block(chain)
    if changed is not None:
        return changed * BLOCK
    if isinstance(old, Ledger):
        at = first_differing_byte(old.tail, fresh.tail) if old.size // BLOCK == (
            fresh.size // BLOCK) else None
        return block_start(min(old.size, fresh.size)) + (
            at if at is not None else min(len(old.tail), len(fresh.tail)))
    return block_start(min(size if size is not None else fresh.size, fresh.size))
