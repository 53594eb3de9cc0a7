"""The daemon: finds instance keys, owns their replicas, and wires watcher, sweep and link.

Instances are found by disk/discovery.py (the sweep, and at once on a watcher hint about a path
that is not a known replica's file); every key becomes a path through Config.key_dir only.

It routes, it does not decide: frames go to the replica of their (key, file), filesystem hints
to the replica of their path. Its control socket (`syncd status`, `adopt`, `reload`) is served
by ops/controlserver.py.

What a peer's frames may cost here is bounded before anything is routed (docs/peer-limits.md):
only a writer's bytes and positions may make a key, and only within `[limits] max_keys`,
never inside or above another instance (keyspace.py), never while free space is below
`[limits] min_free_bytes`; every request is charged to the asker's budget by the bytes it
makes us send (budget.py), once per frame; what waits in a replica's queue is held in the
sender's account (`max_peer_bytes`). Past a bound the item is refused, counted by reason and
logged at most once a minute per peer and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from syncd.config import SOCKET_NAME, Config, ConfigError, load_config
from syncd.core import frames, sealed, versions
from syncd.core.budget import ANSWER_OVERHEAD, Budgets, Holdings, probe_cost, serve_cost
from syncd.core.errors import SyncdError
from syncd.core.events import (
    Event,
    PeerData,
    PeerOnline,
    PeerProbe,
    PeerRefuse,
    PeerRequest,
    peer_event,
)
from syncd.core.filemachine import Tuning
from syncd.core.frames import Channel, FrameError, Kind
from syncd.core.freshness import ACTIVE_FOR, BEAT_INTERVAL, IDLE_BEAT, PeerStreams, ReplayGuard
from syncd.core.identity import Identity, IdentityError
from syncd.core.keyspace import KeySpace
from syncd.core.ledger import BLOCK, DIGEST_SIZE
from syncd.core.names import printable
from syncd.core.oslimits import shortfalls
from syncd.core.pairkeys import PairKeyError, PairKeys
from syncd.core.readiness import Unconfirmed, when
from syncd.core.roots import MAX_DEPTH, KeyPathError
from syncd.core.telemetry import Telemetry
from syncd.core.unsafe import UnsafePaths
from syncd.daemon import logfollow, logoutput
from syncd.daemon.filetask import FileTask
from syncd.daemon.resourcehub import RESOURCE_KINDS, ResourceHub
from syncd.daemon.scrub import scrub_forever
from syncd.daemon.window import CommitGate
from syncd.disk import durable, oslimits, tree
from syncd.disk.discovery import Scanner, Skipped, root_problems
from syncd.disk.epoch import next_epoch
from syncd.disk.groupsync import GroupSync
from syncd.disk.keyfile import load_identity
from syncd.disk.peerepochs import PeerEpochs
from syncd.disk.recordfiles import RecordFiles
from syncd.disk.watcher import Watcher
from syncd.net.link import Link
from syncd.net.outbox import Outbox
from syncd.net.positions import PositionSender

log = logging.getLogger("syncd.node")

ADOPT_STALL_SECONDS = 60
FULL_SWEEP = 10  # every how many rounds of the sweep the machines' deadlines are checked too
SWEEP_FILES = 100  # files stat'ed per sweep while the watcher is on (see _sweep_forever)
# With the watcher on, the directory scan of discovery (also a safety net: new instance
# directories are hinted at once) runs every DISCOVER_EVERY-th sweep only.
DISCOVER_EVERY = 5
REFUSED_SHOWN = 100  # keys refused (a peer's may be many): status and log name this many
STATUS_SLICE = 0.004  # seconds of building a status before the loop gets a turn
# A peer may ask us to state every position again (freshness.py): at most once a RESTATE_GAP
# seconds, however many ask, so that what asking costs us stays bounded.
RESTATE_GAP = 1.0
LIMIT_LOG_EVERY = 60.0  # seconds: at most one log line per peer and bound
FREE_SPACE_EVERY = 1.0  # seconds between two looks at the free space of each filesystem
# Kinds that make us send or read: each is answered once per frame (a duplicate is dropped).
_REQUESTS = frozenset({Kind.REQ, Kind.PROBE, Kind.REFUSE, Kind.RLIST, Kind.RREQ})


_CLAIMS = {Kind.POS, Kind.LIVE, Kind.FILL}


class Service(Protocol):
    """Something that lives as long as `run()`: the control socket (ops/controlserver.py),
    attached by the caller, so that the daemon layer never imports the operations layer."""

    async def start(self, socket_path: Path) -> None: ...

    def close(self) -> None: ...


class StartupError(SyncdError):
    """The daemon cannot start (directories, permissions); the message says what to fix."""


class Host:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.node = config.node
        self.state_dir = config.state_dir
        self._busy: set[FileTask] = set()  # files with work waiting or under way
        self.services: list[Service] = []
        self.syncer = GroupSync()
        self.records = RecordFiles(config.state_dir)
        self.replicas: dict[tuple[str, str], FileTask] = {}
        self._by_path: dict[str, FileTask] = {}  # str(replica.path) -> replica, for hints
        self.presence: dict[str, bool] = {}
        # node -> wall time its presence last changed as heard here (first heard, at start):
        # readiness says how long a peer has been offline.
        self.presence_since: dict[str, float] = {}
        self._connected_at: float | None = None  # wall time of the last broker connection
        self.rejected = 0
        self._refused: dict[str, str] = {}  # key -> why it cannot be replicated here
        self._scanner = self._new_scanner(config)
        self.skipped: list[Skipped] = []  # directories found that cannot be replicated
        self._skips_logged: set[tuple[str, str]] = set()
        self._discover_pending = False
        self._last_reject_log: dict[str, float] = {}  # sender level ("" for none) -> when
        self._listed_for: Config | None = None
        self._listed_cache: dict[str, tuple[str, Any]] = {}
        self._prefix = config.mqtt.topic_prefix
        self._level = frames.level(config.node)
        self.identity: Identity | None = None  # read in check_dirs(), before anything is sent
        self.epoch = 0  # this run's number, counted up in check_dirs()
        self.pairs: PairKeys | None = None  # this run's keys and the peers' (check_dirs())
        # node -> the wire versions its newest presence says it speaks (versions.py)
        self.speaks: dict[str, tuple[int, ...]] = {}
        self._sealing = sealed.BodyKeys()  # ours, per recipient set (sealed.py)
        self._opening = sealed.BodyKeys()  # the peers', as unwrapped
        self.heard_version: dict[str, int] = {}  # node -> the version of its last frame here
        self._last_presence: dict[str, bytes] = {}  # node -> its last presence accepted
        self.not_for_us = 0  # sealed frames not for this run of ours to open (sealed.NotForUs)
        self._seq = itertools.count()
        self._guard = ReplayGuard()  # again in check_dirs(), with the runs kept in state_dir
        self._peer_epochs = PeerEpochs(config.state_dir)
        self._epochs_unsaved = False
        # Our frames on P/a are numbered (frames.py, `lane`); theirs are followed here.
        self._lane = 0
        self._lane_sent_at = 0.0  # loop time of our last frame there (a beat follows a quiet)
        self._active_at = 0.0  # loop time of our last frame there other than a lone beat
        self._beat_every = BEAT_INTERVAL  # what our last beat promised
        self._pace = asyncio.Event()  # set when the fast pace is back: the beat loop wakes
        self._streams = PeerStreams()
        self._restate_timer: asyncio.TimerHandle | None = None
        self._restated_at = -RESTATE_GAP
        self.asks = 0  # asks for a restatement received
        self.restatements = 0
        self._dropped_seen = 0  # link.dropped when the stream loop last looked
        self.link = Link(config, self._on_message, self._on_connected, self.seal_presence,
                         self._subscriptions)
        self._outbox = Outbox(self._publish_batch, config.chunk_bytes)
        self._positions = PositionSender(
            lambda item: self._outbox.add(frames.all_topic(self._prefix, self.node), "", item),
            self._publish_retained)
        self._watcher = Watcher(config.roots.watch_dirs(), self._on_hint, self._on_overflow,
                                max_depth=watch_depth(config))
        # Local changes: read and shipped at once when nothing is in flight for the file, else
        # together in the next commit, after the optional batch_window (window.py).
        self._window: CommitGate[FileTask] = CommitGate(
            config.batch_window, FileTask.hint_local, self._watcher.hold, self._watcher.drain,
            self._watcher.resume)
        self._stop = asyncio.Event()
        self._durable_hooks: list[Callable[[str, str, int], None]] = []
        self.started = time.time()
        self.telemetry = Telemetry(time.monotonic())
        self._chores: set[asyncio.Task[None]] = set()  # referenced until done (asyncio docs)
        self.budgets = Budgets(config.limits)  # what each peer's requests may cost us
        self.holdings = Holdings(config.limits.max_peer_bytes)  # memory on each peer's word
        self.keyspace = KeySpace()  # the keys replicated here (keyspace.py)
        self.made_by: dict[str, str] = {}  # key -> the peer whose word made it here
        self._limit_logged: dict[tuple[str, str], float] = {}  # (peer, reason) -> when
        self._low_space: dict[str, int] = {}  # filesystems below min_free_bytes: path -> free
        self._low_since: float | None = None  # wall time remote growth stopped
        self._space_at = -1e18  # monotonic time of the last look at free space
        # Links, devices, unreadable or too deep directories met below the roots (unsafe.py).
        self.unsafe = UnsafePaths()
        self.resources = ResourceHub(self)  # each instance's resources/ (resourcehub.py)

    # --- HostServices, what the file tasks call -------------------------------------------

    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None:
        """Queue one item; positions go out at once (retained, one topic per file), the rest
        in a batch per topic at the end of this turn of the event loop."""
        item = frames.Item(kind, payload, key, file)
        self.telemetry.count("sent", kind.value, item.size)
        if kind is Kind.POS:  # in the batch, and retained for later hosts (net/positions.py)
            self._positions.announce(key, file, item)
            return
        if not to:  # live bytes, and resource summaries and changes: for everyone
            self._outbox.add(frames.all_topic(self._prefix, self.node), "", item)
        else:
            self._outbox.add(frames.to_topic(self._prefix, to, self.node), to, item)

    def _publish_retained(self, key: str, file: str, item: frames.Item) -> None:
        self._outbox.flush()  # keep order: bytes announced are sent before the position
        topic = frames.position_topic(self._prefix, self.node, key, file)
        self.link.publish(topic, self._seal(topic, (item,)), retain=True)

    def _publish_batch(self, topic: str, to: str, items: tuple[frames.Item, ...]) -> None:
        # Live batches at QoS 0: a lost one is a gap the next batch or position reveals (and
        # fetched again), and QoS 1 costs a PUBACK each way per write (docs/protocol.md, QoS).
        lane = 0
        if not to:
            # Numbered even if the publish is dropped: the peers then see the gap.
            self._lane += 1
            lane = self._lane
            self._lane_sent_at = asyncio.get_running_loop().time()
            lone = items[0].payload if len(items) == 1 else None
            if not (isinstance(lone, frames.Beat) and lone.every_ms):
                # Not a beat promising its own pace: the next frame comes within
                # BEAT_INTERVAL (a peer assumes so of any frame but such a beat).
                self._active_at = self._lane_sent_at
                if self._beat_every != BEAT_INTERVAL:
                    self._beat_every = BEAT_INTERVAL
                    self._pace.set()
        self.link.publish(topic, self._seal(topic, items, to=to, lane=lane),
                          qos=1 if to else 0)

    def _seal(self, topic: str, items: tuple[frames.Item, ...], to: str = "",
              conn: int | None = None, lane: int = 0, signed: bool = False) -> bytes:
        """Encode a frame for `topic`, stamped with our run, connection and order: sealed for
        its readers (version 6) when they all speak it, else signed (5); `signed`: always 5
        (presence: every release reads it, and it carries the run key)."""
        assert self.identity is not None and self.pairs is not None
        frame = frames.Frame(self.node, self.epoch, next(self._seq), time.time_ns() // 1_000_000,
                             items, to, self.link.conn if conn is None else conn, lane)
        if not signed:
            readers = [to] if to else [n for n, o in self.presence.items()
                                       if o and n != self.node and n in self.config.peers]
            if versions.for_everyone(self.speaks.get(n, versions.LEGACY)
                                     for n in readers) == versions.SEALED:
                recipients = []
                for n in sorted(readers):
                    pair = self.pairs.sending(n)
                    if pair is None:  # a run key that did not make a pair key: refused
                        break
                    recipients.append((n, *pair))
                else:
                    return sealed.encode(frame, topic, recipients, self._sealing)
        return frames.encode(frame, self.identity, topic)

    def seal_presence(self, topic: str, online: bool, conn: int) -> bytes:
        assert self.pairs is not None
        presence = frames.Presence(online, speaks=versions.SPEAKS, run_key=self.pairs.run_public)
        return self._seal(topic, (frames.Item(Kind.NODE, presence),), conn=conn, signed=True)

    def wire_version(self, node: str) -> int | None:
        """The version of our frames for `node` alone (versions.py); None: none in common."""
        return versions.common(self.speaks.get(node, versions.LEGACY))

    def role_of(self, key: str) -> str:
        return self.config.role_of(key)

    def records_of(self, key: str, file: str) -> str:
        return self.config.records_of(key, file)

    def settle_of(self, key: str, file: str) -> float:
        return self.config.settle_of(key, file)

    # The tuning values are read from the config each time (never copied), so that a reload
    # has one place to change.
    @property
    def chunk_bytes(self) -> int:
        return self.config.chunk_bytes

    @property
    def fetch_window(self) -> int:
        return self.config.fetch_window_bytes

    @property
    def busy(self) -> int:
        return len(self._busy)

    def set_busy(self, replica: FileTask, busy: bool) -> None:
        if busy:
            self._busy.add(replica)
        else:
            self._busy.discard(replica)

    def tuning(self) -> Tuning:
        c = self.config
        return Tuning(chunk_bytes=c.chunk_bytes, fetch_window=c.fetch_window_bytes,
                      request_timeout=c.request_timeout, persist_interval=c.persist_interval)

    def is_online(self, node: str) -> bool:
        return self.presence.get(node, False)

    def is_listed(self, node: str) -> bool:
        return node in self.config.peers

    def offline_since(self, node: str) -> float | None:
        if self.presence.get(node, True):
            return None
        return self.presence_since.get(node)

    def connected_since(self) -> float | None:
        return self._connected_at if self.link.connected.is_set() else None

    def missing_resources(self, key: str, refs: Iterable[str]) -> tuple[list[str], int, int]:
        return self.resources.missing(key, refs)

    def unconfirmed_peers(self, key: str) -> list[Unconfirmed]:
        now = time.time()
        out = []
        for node, online in self.presence.items():
            if not online or not self.config.may_write(key, node):
                continue
            c = self._streams.confirmation(node, now)
            if not c.confirmed:
                out.append(Unconfirmed(node, c.since, c.why or "unknown"))
        return out

    def note_unsafe(self, path: str, kind: str, reason: str) -> None:
        """An entry below a root refused (never followed): counted, logged once, shown."""
        if self.unsafe.note(path, kind, reason):
            log.error("%s: %s (refused: syncd reads, serves and writes nothing through it; "
                      "shown in status under unsafe_paths)", path, reason)

    def durable(self, key: str, file: str, size: int) -> None:
        self.telemetry.durable(key, file, size, time.time(), time.monotonic())
        for hook in self._durable_hooks:
            hook(key, file, size)

    def flush(self) -> None:
        self._outbox.flush()

    def on_durable(self, hook: Callable[[str, str, int], None]) -> None:
        """Call `hook(key, file, size)` each time bytes become durable here (tests, bench)."""
        self._durable_hooks.append(hook)

    # --- lifetime ---------------------------------------------------------------------------

    def check_dirs(self) -> None:
        """Refuse to start, saying what to fix, unless directories and identity are usable."""
        try:
            self.identity = load_identity(self.config.identity_file)
        except IdentityError as e:
            raise StartupError(str(e)) from None
        listed = self.config.peers.get(self.node)
        if listed is not None and listed != self.identity.public:
            raise StartupError(
                f"[peers] lists another public key for this node ({self.node}) than "
                f"identity_file {self.config.identity_file} holds ({self.identity.public}): "
                "fix the [peers] line on every host, or use the right identity_file")
        for where, problem in root_problems(self.config.roots, "this user"):
            fix = "create it, or fix" if "does not exist" in problem else "grant access, or fix"
            raise StartupError(f"{where} {problem} ({fix} {where} in the config)")
        sd = self.config.state_dir
        try:
            durable.make_dirs(sd)  # durable in its parent, as every record below it
        except OSError as e:
            raise StartupError(f"state_dir {sd} cannot be created: {e.strerror}") from None
        if not os.access(sd, os.R_OK | os.W_OK | os.X_OK):
            raise StartupError(f"state_dir {sd} is not readable and writable by this user")
        try:
            self.epoch = next_epoch(sd)
        except (OSError, ValueError) as e:
            raise StartupError(f"cannot count up this run's epoch in {sd}: {e}") from None
        self.pairs = PairKeys(self.node, self.epoch, self.identity.key)
        self._guard = ReplayGuard(self._peer_epochs.load())

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Run until `stop()`; `ready` is called once replicas are loaded and the link is up."""
        self.check_dirs()
        self._check_free_space()  # before the first peer's byte: a host may start on a full disk
        self._discover()
        if self.config.watch:
            self._watcher.start()  # says itself when it gets no inotify instance
            w = self._watcher
            for warning in shortfalls(oslimits.inotify_limits(), w.needed, w.unwatched):
                log.warning("%s", warning)
        else:
            log.info("watch = false: changes are found by the stat sweep every %.2gs",
                     self.config.sweep_interval)
        tasks = [
            asyncio.create_task(self.link.run(), name="link"),
            asyncio.create_task(self._sweep_forever(), name="sweep"),
            asyncio.create_task(scrub_forever(self), name="scrub"),
            asyncio.create_task(self._stream_forever(), name="stream"),
        ]
        for service in self.services:
            await service.start(self.socket_path)
        log.info("node %s watching %s (%d files), state in %s", self.node,
                 self.config.roots.describe(), len(self.replicas), self.config.state_dir)
        try:
            stop = asyncio.create_task(self._stop.wait())
            if ready is not None:
                # Not past a stop or a failure: SIGTERM must work while the broker is away.
                waiting = asyncio.create_task(self._wait_ready())
                await asyncio.wait([waiting, stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    ready()
                waiting.cancel()
            # A background task that ends on its own is a bug: stop loudly, not half-working.
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if stop not in done:
                stop.cancel()
                broken = done.pop()
                raise RuntimeError(f"internal task {broken.get_name()} ended: "
                                   f"{broken.exception()!r}")
        finally:
            for service in self.services:
                service.close()
            self._watcher.stop()
            await self.link.close()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            for r in self.replicas.values():
                await r.stop()
            await self.resources.stop()
            self._keep_peer_epochs()
            self.records.flush()  # what the worker had not written yet (files not stopped)
            await self.syncer.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            log.info("node %s stopped", self.node)

    def stop(self) -> None:
        self._stop.set()

    async def reload_from_source(self, expected: str | None = None) -> dict[str, Any]:
        """Re-read the config file we started from and apply it (SIGHUP, `syncd reload`).

        A file that does not load changes nothing; the reply says why, for `syncd reload` to
        show (systemctl reload then fails) and the log too (a bare SIGHUP has nobody to tell).
        `expected`: the file the caller checked; another one is refused, not reloaded.
        """
        source = self.config.source
        assert source is not None
        if expected is not None and not _same_file(expected, source):
            return {"ok": False, "config": str(source),
                    "error": f"this daemon runs {source}, not {expected}"}
        try:
            config = load_config(source)
        except ConfigError as e:
            log.error("reload refused, keeping the running configuration: %s", e)
            return {"ok": False, "error": f"config error: {e}", "config": str(source)}
        needs_restart = await self.reload(config)
        return {"ok": True, "config": str(source), "files": len(self.replicas),
                "needs_restart": needs_restart}

    async def reload(self, config: Config) -> list[str]:
        """Apply a re-read config (SIGHUP): new and removed keys, file lists, roles, tuning.

        Identity and wiring (node, directories, broker) need a restart; they are kept as they
        were, the log says so, and their names are returned.
        """
        fixed = ("node", "roots", "state_dir", "mqtt", "identity_file")
        changed = [name for name in fixed if getattr(config, name) != getattr(self.config, name)]
        if changed:
            log.warning("reload: %s changed; that takes a restart (keeping the running values)",
                        ", ".join(changed))
            config = dataclasses.replace(config, **{n: getattr(self.config, n) for n in fixed})
        removed = set(self.config.peers) - set(config.peers)
        peers_changed = config.peers.keys() != self.config.peers.keys()
        self.config = config
        for node in sorted(removed):
            self._unlist(node)
        if peers_changed:
            await self.link.resubscribe()
        self._outbox.limit = config.chunk_bytes
        self._window.window = config.batch_window
        self._window.flush()
        self.budgets.configure(config.limits)
        self.holdings.limit = config.limits.max_peer_bytes
        self._space_at = -1e18  # a new floor: look again at the next sweep
        for (key, file), r in list(self.replicas.items()):
            if not config.wants_key(key) or file not in config.files_of(key):
                await r.stop()
                self._window.forget(r)
                del self.replicas[(key, file)]
                self._by_path.pop(str(r.path), None)
                if not any(k == key for k, _ in self.replicas):
                    self.keyspace.discard(key)
                    self.made_by.pop(key, None)
                log.info("reload: %s is no longer replicated", r.name)
            else:
                r.retune(self.tuning())
                if r.machine.role != config.role_of(key):
                    log.info("reload: %s role %s -> %s", r.name, r.machine.role,
                             config.role_of(key))
                    r.set_role(config.role_of(key))
        self.resources.configure(config)
        before = len(self.replicas)
        self._refused.clear()
        self._scanner = self._new_scanner(config)
        self._discover(force=True)
        log.info("reload: configuration applied (%d files, %d new)", len(self.replicas),
                 len(self.replicas) - before)
        return changed

    def scrubbed(self) -> list[FileTask]:
        return list(self.replicas.values())

    @property
    def socket_path(self) -> Path:
        return self.config.state_dir / SOCKET_NAME

    async def _wait_ready(self) -> None:
        await self.link.connected.wait()
        for r in list(self.replicas.values()):
            await r.loaded.wait()

    # --- discovery and hints ----------------------------------------------------------------

    async def adopt(self, key: str, source: str,
                    progress: Callable[[str, int, int], Awaitable[None]]) -> dict[str, Any]:
        """Archive our copies of KEY and take SOURCE's, file by file (the operator's `adopt`).

        `progress(file, have, total)` is awaited about every 0.2 s while a file is fetched.
        The reply is the control socket's: {"ok": True, "adopted": [...]} or an error.
        """
        if source != self.node:
            if source not in self.presence:
                known = ", ".join(sorted(self.presence)) or "none"
                return {"ok": False, "error": f"unknown node {source!r} (known peers: {known})"}
            if not self.presence[source]:
                return {"ok": False, "error": f"{source} is offline; its copy cannot be fetched "
                                              "now"}
        replicas = [r for f in self.config.files_of(key)
                    if (r := self._replica(key, f)) is not None]
        for r in replicas:
            await r.loaded.wait()
            if source != self.node and not r.machine.has_peer(source):
                return {"ok": False, "error": f"{source} has announced no copy of {r.name}"}
        results = []
        for r in replicas:
            done: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
            r.adopt(source, done)
            last, moved_at = -1, time.monotonic()
            while not done.done():
                have, total = r.machine.adoption_progress()
                if have != last:
                    last, moved_at = have, time.monotonic()
                elif time.monotonic() - moved_at > ADOPT_STALL_SECONDS:
                    return {"ok": False, "error": (
                        f"{r.name}: no progress from {source} for {ADOPT_STALL_SECONDS}s "
                        f"(at {have} of {total} bytes); the local copy is already archived and "
                        "the fetch goes on in the background: watch syncd status")}
                await progress(r.name, have, total)
                await asyncio.wait([done], timeout=0.2)
            result = done.result()
            if "error" in result:
                return {"ok": False, "error": f"{r.name}: {result['error']}"}
            results.append(result)
        return {"ok": True, "adopted": results}

    def _replica(self, key: str, file: str, peer: str | None = None) -> FileTask | None:
        """The replica of (key, file), made if the config wants it. `peer`: made on that
        peer's word (its bytes or position), so within the bounds of a new key."""
        r = self.replicas.get((key, file))
        if r is None:
            if not self.config.wants_key(key) or file not in self.config.files_of(key):
                return None
            try:
                root, parts = self.config.roots.locate(key)
            except KeyPathError as e:
                self._refuse(key, e.reason)
                return None
            spot = root.spot_of(parts)
            linked = tree.linked_component(spot)
            if linked is not None:
                # A key must be a directory of its own under its root, not a way out of it
                # (and every open goes through its levels again: disk/tree.py).
                self._refuse(key, f"{printable(str(linked))} is a symbolic link (not followed)")
                return None
            if peer is not None and key not in self.keyspace:
                refusal = self._new_key_refusal(key, root.path, parts)
                if refusal is not None:
                    reason, why = refusal
                    if reason == "keys":  # who took them: the operator's first question
                        made = Counter(self.made_by.values()).most_common(3)
                        why += "; made on peers' word: " + (", ".join(
                            f"{n} by {p}" for p, n in made) or "none")
                    self._refuse(key, f"announced by {peer}: {why}")
                    self.refused(peer, reason, f"new keys ({printable(key)}: {why})")
                    return None
                self.made_by[key] = peer
            r = FileTask(self, key, file, spot / file)
            self.replicas[(key, file)] = r
            self._by_path[str(r.path)] = r
            self.keyspace.add(key)
            self._refused.pop(key, None)  # refused before (a full disk): no longer
            # The replica's task inherits this context: its log lines carry key and file as
            # fields (JSON logs) without every call passing them.
            token = logoutput.FIELDS.set({"key": key, "file": file})
            try:
                r.start()
            finally:
                logoutput.FIELDS.reset(token)
            self.resources.ensure(key, if_present=True)
            chore = asyncio.get_running_loop().create_task(self._after_load(r))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)
        return r

    async def _after_load(self, r: FileTask) -> None:
        await r.loaded.wait()
        self.telemetry.baseline(r.key, r.file, r.machine.position.size)
        # Divergences recorded before a restart may name a node removed from [peers] since.
        for node in set(r.machine.peers) | set(r.machine.diverged):
            if node not in self.config.peers:
                r.forget_peer(node)

    def _new_key_refusal(self, key: str, root: Path,
                         parts: tuple[str, ...]) -> tuple[str, str] | None:
        """(reason, why) a peer may not make `key` here now; None: it may (keyspace.py)."""
        refusal = self.keyspace.refusal(key, self.config.limits.max_keys)
        if refusal is not None:
            return refusal
        # An instance on disk that discovery has not listed yet (made a moment ago, or one
        # that include/exclude leave out): a directory above the key holding a log file.
        for depth in range(1, len(parts)):
            above = root.joinpath(*parts[:depth])
            for name in self.config.all_files():
                with contextlib.suppress(OSError):
                    if os.lstat(above / name):
                        return "nested", f"inside the instance {printable(str(above))}"
        why = self.growth_problem(key)
        if why is not None:
            return "disk_low", why
        return None

    def is_instance(self, key: str) -> bool:
        return key in self.keyspace

    def instance_for(self, key: str, peer: str) -> bool:
        """Whether `key` is an instance here, made on `peer`'s word (a writer's resource
        files) within the bounds of a new key: the replicas of its files come first."""
        if key in self.keyspace:
            return True
        if not self.config.may_write(key, peer):
            return False
        for file in self.config.files_of(key):
            if self._replica(key, file, peer) is None:
                return False
        return key in self.keyspace

    def _refuse(self, key: str, reason: str) -> None:
        """A key this node was asked to replicate (found here, or a peer's) that it cannot:
        logged once, and listed by status (the first REFUSED_SHOWN of them)."""
        if key not in self._refused and len(self._refused) < REFUSED_SHOWN:
            self._refused[key] = reason
            log.error("key %s is not replicated: %s", printable(key), reason)

    @staticmethod
    def _new_scanner(config: Config) -> Scanner:
        return Scanner(config.roots, config.files_of, config.all_files())

    def _discover(self, force: bool = False) -> None:
        """Find new instances (the sweep calls this every second: directories that did not
        change since the last scan are not listed again, see disk/discovery.py)."""
        scan = self._scanner.scan()
        self.skipped = scan.skipped
        for s in scan.skipped:
            if (str(s.folder), s.reason) not in self._skips_logged:
                self._skips_logged.add((str(s.folder), s.reason))
                log.error("%s: key %s is not replicated: %s", printable(str(s.folder)),
                          s.key or "-", s.reason)
        if not scan.changed and not force:
            return
        for found in scan.instances:
            if self.config.wants_key(found.key):
                for file in self.config.files_of(found.key):
                    self._replica(found.key, file)

    def _discover_soon(self) -> None:
        """Discover at the next turn of the loop: a burst of hints costs one scan."""
        if not self._discover_pending:
            self._discover_pending = True
            asyncio.get_running_loop().call_soon(self._discover_hinted)

    def _discover_hinted(self) -> None:
        self._discover_pending = False
        self._discover()

    def _on_hint(self, path: str, gone: bool = False) -> None:
        found = self._by_path.get(path) if not gone else None
        if found is not None:  # the usual case, a file grew: no path arithmetic
            self._grew(found)
            return
        roots = self.config.roots
        place = roots.place(Path(path))
        if place is None:
            return
        if place.root is None or not place.parts:
            self._discover_soon()  # at or above a root: a root may have come or gone
            return
        root, parts = place.root, place.parts
        if len(parts) >= 2:
            found = self.replicas.get((roots.key_of(root, parts[:-1]), parts[-1]))
            if found is not None:
                if gone:
                    found.hint_local(replaced=True)
                else:
                    self._grew(found)
                return
        for depth in range(1, min(len(parts), MAX_DEPTH) + 1):
            if root.path.joinpath(*parts[:depth]) in self._scanner.leaves:
                if depth == len(parts):  # an instance's directory itself (moved, deleted)
                    # Its own files, looked up by key: a standby that creates thousands of
                    # instances hears of each directory, and scanning every replica for
                    # each one stalled the loop for 20 s at 3000 keys.
                    key = roots.key_of(root, parts)
                    for file in self.config.files_of(key):
                        if (r := self.replicas.get((key, file))) is not None:
                            r.hint_local(replaced=gone)
                else:
                    self.resources.hint(roots.key_of(root, parts[:depth]), path)
                return  # inside an instance: resources/, workspace/, ... are no instances
        if len(parts) > MAX_DEPTH + 1:
            return  # below the depth where instances are looked for
        if gone:
            self._hint_below(root.path.joinpath(*parts), gone)
        self._discover_soon()

    def looked(self, replica: FileTask) -> None:
        """`replica`'s look at its file is over (read, shipped, synced): its next commit may
        start (window.py)."""
        self._window.done(replica)

    def _grew(self, replica: FileTask) -> None:
        """A replicated file changed: look at it within the batch window (window.py), unless
        it is exactly as our own append left it (a standby's own write is no news)."""
        if not replica.as_own_append_left_it():
            self._window.offer(replica)

    def _on_overflow(self) -> None:
        """The kernel dropped events: look at everything, as a sweep would, now."""
        self._discover_soon()
        for r in self.replicas.values():
            r.hint_local()
        self.resources.look_everywhere()

    def _hint_below(self, folder: Path, gone: bool) -> None:
        """A directory moved or deleted: look again at every replica below it."""
        for r in self.replicas.values():
            if r.path.is_relative_to(folder):
                r.hint_local(replaced=gone)

    async def _sweep_forever(self) -> None:
        """The safety net under the watcher: inotify can merge or drop events.

        Discovery looks at every directory above the instances on each sweep (one stat each,
        see disk/discovery.py). Files: with `watch = false` the sweep is all there is, and every
        file is stat'ed on each sweep; with the watcher on, each sweep stats the next
        SWEEP_FILES files only, so that thousands of idle files cost a bounded amount of CPU
        (a change the watcher missed is found within ceil(files / SWEEP_FILES) sweeps). Each
        machine's deadline is checked on every FULL_SWEEP-th round only: the replica's own
        timer is what ticks it (see FileTask.sweep)."""
        # The list of a round is made once per round: even listing a thousand idle replicas
        # every second showed in an idle daemon's profile (cold objects, a cache miss each).
        replicas: list[FileTask] = []
        cursor, rounds, sweeps = 0, 0, 0
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            self._check_free_space()
            sweeps += 1
            if not self.config.watch or sweeps % DISCOVER_EVERY == 0:
                if self.config.watch:
                    self._watcher.rewatch()
                self._discover()
            if cursor == 0:
                replicas = list(self.replicas.values())
            if not self.config.watch or len(replicas) <= SWEEP_FILES:
                batch, cursor = replicas, len(replicas)
            else:
                batch = replicas[cursor:cursor + SWEEP_FILES]
                cursor += len(batch)
            full = rounds % FULL_SWEEP == 0
            for r in batch:
                if r.running:
                    r.sweep(full)
            if cursor >= len(replicas):
                cursor = 0
                rounds += 1
            self.resources.sweep()
            self._keep_peer_epochs()

    def _keep_peer_epochs(self) -> None:
        """Keep the peers' newest runs in state_dir (written only when one changed)."""
        try:
            self._peer_epochs.save(self._guard.epochs())
        except OSError as e:
            if not self._epochs_unsaved:  # once until it works again, not every second
                log.warning("cannot keep the peers' runs in %s: %s", self.state_dir,
                            e.strerror or e)
            self._epochs_unsaved = True
        else:
            self._epochs_unsaved = False

    # --- the link ---------------------------------------------------------------------------

    async def _on_connected(self) -> None:
        self._connected_at = time.time()
        # What every peer sent while we were away is unknown: each is asked to state its
        # positions again (the presence we are about to read may be old: ask them all).
        self._streams.reconnected(self._connected_at, when(self._connected_at))
        self._ask(sorted(n for n in self.config.peers if n != self.node))
        self._positions.forget()  # the broker may have lost them: every file's next goes at once
        for r in self.replicas.values():
            r.reconnected()
        self.resources.connected()

    def _on_message(self, topic: str, payload: bytes) -> None:
        if not payload:
            return  # a retained message being cleared (`syncd forget`): says nothing
        try:
            route = frames.parse_topic(self._prefix, topic)
        except FrameError as e:
            self._reject(topic, str(e))
            return
        if route.sender == self._level:
            return  # our own presence comes back (n/+), or a frame to ourselves: not news
        if route.channel is Channel.TO and route.to != self._level:
            return
        listed = self._listed.get(route.sender)
        if listed is None:
            name = frames.name_of_level(route.sender) or route.sender
            self._reject(topic, f"from {name!r}, a node not listed in [peers]", route.sender)
            return
        sender, key = listed
        if route.channel is Channel.PRESENCE and self._last_presence.get(sender) == payload:
            return  # the same retained presence again (a reload resubscribed): no news
        max_data = max(self.chunk_bytes, 16 << 20)
        assert self.pairs is not None
        pairs = self.pairs
        try:
            if route.channel is Channel.PRESENCE:  # always signed: it carries the run key
                frame = frames.decode(route, payload, sender, max_data, key, topic)
            else:
                frame = sealed.decode_any(route, payload, sender, max_data, topic, key,
                                          self.node, self.epoch,
                                          lambda epoch: pairs.receiving(sender, epoch),
                                          self._opening)
        except sealed.NotForUs as e:
            # Around a restart or a join: the sender restates what matters once it hears our
            # presence (and we asked every peer to, at connect).
            self.not_for_us += 1
            log.debug("%s: %s", topic, e)
            return
        except FrameError as e:
            self._reject(topic, str(e), route.sender)
            return
        if route.channel is Channel.POSITION and self._claimed(sender, frame.items[0]) is None:
            return  # no key of ours, nor one it may make: no replay state kept for it either
        verdict = self._guard.check(route.channel, topic, frame)
        if verdict.reason is not None:
            self._reject(topic, verdict.reason, route.sender)
            return
        if route.channel is Channel.PRESENCE:
            if not self._heard_presence(sender, key, frame):
                self._reject(topic, "unusable run key in presence", route.sender)
                return
            self._last_presence[sender] = payload
        else:
            self.heard_version[sender] = sealed.version_of(payload)
        if verdict.online is not None:
            self._presence_changed(sender, verdict.online)
        if frame.lane:
            beat = next((i.payload for i in frame.items if isinstance(i.payload, frames.Beat)),
                        None)
            every = beat.every_ms / 1000 if beat is not None and beat.every_ms else BEAT_INTERVAL
            self._streams.frame(sender, frame.epoch, frame.lane, time.time(), every)
        asked: set[tuple[Kind, str, str, frames.Payload]] = set()
        for item in frame.items:
            self.telemetry.count("received", item.kind.value, item.size)
            if item.kind is Kind.BEAT:
                assert isinstance(item.payload, frames.Beat)
                if item.payload.restated_from and frame.lane:
                    # After the positions this frame carried were delivered, in item order.
                    self._streams.restated(sender, item.payload.restated_from)
            elif item.kind is Kind.ASK:
                self._asked_by(sender)
            else:
                if item.kind in _REQUESTS:
                    # One answer per request per frame: 100 copies of a probe cost one.
                    seen = (item.kind, item.key, item.file, item.payload)
                    if seen in asked:
                        # Counted, not logged: a healthy host repeats a refusal when it also
                        # starts locating the fork.
                        self.telemetry.refuse("duplicate")
                        continue
                    asked.add(seen)
                self._deliver(sender, frame, item)

    def _heard_presence(self, sender: str, key: Any, frame: frames.Frame) -> bool:
        """Note the versions and run key a fresh presence announces; False: an unusable key."""
        p = frame.items[0].payload
        assert isinstance(p, frames.Presence) and self.pairs is not None
        if p.retired:
            self.pairs.forget(sender)
            return True
        self.speaks[sender] = versions.spoken(p.speaks)
        if p.run_key:
            try:
                if self.pairs.learn(sender, frame.epoch, key, p.run_key):
                    # Its last run's body keys die with that run's pair keys.
                    self._opening.clear()
            except PairKeyError:
                self.pairs.forget(sender)
                self.speaks[sender] = versions.LEGACY  # nothing sealed for it: signed frames
                return False
        return True

    def _claimed(self, sender: str, item: frames.Item) -> FileTask | None:
        """The replica a claim (a position, bytes) is about, made on a writer's word within
        the bounds of a new key; None: it does not count here. For a position topic this is
        asked before the replay guard, which keeps state per topic: a refused key leaves
        none (an old authentic position may then make the key its writer once had)."""
        if not self.config.may_write(item.key, sender):
            # The key's `writers` do not include the sender: its positions (which would make
            # us fetch from it) do not count here, and bytes it sends are refused.
            if item.kind is not Kind.POS:
                self._reject(f"{item.key}/{item.file}", f"{sender} is not among the writers "
                             f"of {item.key}", frames.level(sender))
            return None
        return self._replica(item.key, item.file, sender)

    def _deliver(self, sender: str, frame: frames.Frame, item: frames.Item) -> None:
        if item.kind in RESOURCE_KINDS:
            self.resources.deliver(sender, item)
            return
        event = peer_event(item.kind, sender, item.payload)
        if event is None:
            return
        if item.kind in _CLAIMS:
            replica = self._claimed(sender, item)
        else:
            # Requests, refusals and probes are about a file we hold, or about nothing.
            replica = self.replicas.get((item.key, item.file))
        if replica is None:
            return
        if item.kind is Kind.POS and not self._guard.newest_position(
                sender, item.key, item.file, frame.epoch, frame.seq):
            return  # a retained copy older than a batched one already heard: not news
        if item.kind is Kind.PROBE and not self.config.may_write(item.key, sender) \
                and sender not in replica.machine.diverged:
            # A probe locates a divergence: from a host whose copy cannot count for the key
            # (not among its writers), only once we know that its copy differs from ours.
            self._reject(f"{item.key}/{item.file}", f"{sender} is not among the writers of "
                         f"{item.key} (a probe)", frames.level(sender))
            return
        if (item.kind is Kind.LIVE and replica.machine.frozen is None
                and sender not in replica.machine.diverged):
            assert isinstance(item.payload, frames.Data)
            self.telemetry.expect(item.key, item.file, sender, item.payload.end, frame.ts,
                                  replica.machine.position.size)
        cost = self._request_cost(event, replica)
        if cost is not None and not self.charge(sender, cost):
            return  # dropped and counted; the requester asks again after its timeout
        size = ANSWER_OVERHEAD + (len(event.data.data) if isinstance(event, PeerData) else 0)
        if not self.holdings.take(sender, size):
            # Its events already hold max_peer_bytes here, waiting for replicas: dropped like
            # a lost frame (anti-entropy asks again once the queues have drained).
            self.refused(sender, "peer_bytes", "queued frames")
            return
        replica.deliver_held(event, sender, size)

    def _request_cost(self, event: Event, replica: FileTask) -> int | None:
        """Bytes a peer's request makes us send or read (None: it is no request)."""
        m = replica.machine
        match event:
            case PeerRequest(request=r):
                return serve_cost(r.have, r.start, r.length, m.held, self.fetch_window)
            case PeerProbe(probe=p):
                blocks = len(m.ledger.chain) - 1 if m.ledger is not None else 0
                return probe_cost(p.what is frames.ProbeWhat.SUMS, p.start, p.count, m.held,
                                  blocks, max(1, self.chunk_bytes // DIGEST_SIZE), BLOCK,
                                  DIGEST_SIZE)
            case PeerRefuse(refuse=rf):
                # Our digest at its offset: a read of up to one block, then perhaps a refusal
                # and a probe of our own.
                return ANSWER_OVERHEAD + min(rf.offset, m.held) % BLOCK
        return None

    def charge(self, peer: str, cost: int) -> bool:
        """Whether to serve a peer's request that makes us send `cost` bytes (budget.py);
        logs drops once a minute."""
        now = time.monotonic()
        if self.budgets.admit(peer, cost, now):
            return True
        self.telemetry.refuse("budget")
        line = self.budgets.report(peer, now)
        if line is not None:
            log.warning("%s", line, extra={"peer": peer})
        return False

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None:
        """`n` items of `peer` refused at a bound: counted by reason; logged at most once a
        minute per peer and bound, so that a peer's flood does not flood the log."""
        self.telemetry.refuse(reason, n)
        now = time.monotonic()
        if now - self._limit_logged.get((peer, reason), -1e18) < LIMIT_LOG_EVERY:
            return
        if len(self._limit_logged) > 1000:
            self._limit_logged.clear()
        self._limit_logged[(peer, reason)] = now
        lim = self.config.limits
        bound = {
            "duplicate": "answered once per frame",
            "parts": "a whole manifest in more parts than [limits] max_resource_files allows",
            "unasked": "a whole manifest this host did not ask for",
            "entries": f"over [limits] max_resource_files ({lim.max_resource_files})",
            "peer_bytes": f"its frames hold [limits] max_peer_bytes ({lim.max_peer_bytes}) "
                          "here already",
            "keys": f"over [limits] max_keys ({lim.max_keys})",
            "nested": "a key inside or above another instance",
            "disk_low": "remote growth stopped: free space below [limits] min_free_bytes "
                        f"({lim.min_free_bytes})",
        }.get(reason, reason)
        log.warning("peer %s: %s refused: %s (%d refused so far for this reason; "
                    "docs/peer-limits.md)", peer, what, bound, self.telemetry.rejected[reason],
                    extra={"peer": peer})

    # --- free space -------------------------------------------------------------------------

    def _check_free_space(self) -> None:
        """statvfs of each root (and glob's directory) and of state_dir, at most once a
        FREE_SPACE_EVERY: below `[limits] min_free_bytes`, no peer's bytes are written there
        (filetask.py, resourcehub.py) and no key is made on a peer's word."""
        now = time.monotonic()
        if now - self._space_at < FREE_SPACE_EVERY:
            return
        self._space_at = now
        floor = self.config.limits.min_free_bytes
        low: dict[str, int] = {}
        if floor > 0:
            for path in {*self.config.roots.watch_dirs(), self.state_dir}:
                try:
                    st = os.statvfs(path)
                except OSError:
                    continue  # a root that is not there yet: discovery says so
                free = st.f_bavail * st.f_frsize
                if free < floor:
                    low[str(path)] = free
        if bool(low) != bool(self._low_space):
            if low:
                self._low_since = time.time()
                log.error("remote growth stopped: free space %s below [limits] "
                          "min_free_bytes (%d bytes); no peer's bytes are written here until "
                          "there is more (the local writer keeps the rest)",
                          ", ".join(f"on {p} is {n} bytes" for p, n in sorted(low.items())),
                          floor)
            else:
                log.warning("remote growth resumed: free space is above [limits] "
                            "min_free_bytes (%d bytes) again", floor)
                self._low_since = None
        self._low_space = low

    def growth_problem(self, key: str) -> str | None:
        """Why no peer's bytes may be written for `key` now (None: they may)."""
        if not self._low_space:
            return None
        state = self._low_space.get(str(self.state_dir))
        if state is not None:
            return (f"free space in state_dir is {state} bytes, below [limits] "
                    f"min_free_bytes ({self.config.limits.min_free_bytes})")
        try:
            root = self.config.roots.locate(key)[0].path
        except KeyPathError:
            return None
        for path, free in self._low_space.items():
            if root.is_relative_to(path):
                return (f"free space on {path} is {free} bytes, below [limits] "
                        f"min_free_bytes ({self.config.limits.min_free_bytes})")
        return None

    def _subscriptions(self) -> list[str]:
        return frames.subscriptions(self._prefix, self.node, self.config.peers)

    @property
    def _listed(self) -> dict[str, tuple[str, Any]]:
        """Topic level -> (node, public key) of every peer in [peers] but us."""
        config = self.config
        if self._listed_for is not config:
            self._listed_cache = {frames.level(n): (n, k) for n, k in config.peer_keys().items()
                                  if n != self.node}
            self._listed_for = config
        return self._listed_cache

    def _presence_changed(self, node: str, online: bool) -> None:
        if self.presence.get(node) == online:
            return
        self.presence[node] = online
        self.presence_since[node] = time.time()
        log.info("peer %s is %s", node, "online" if online else "offline",
                 extra={"peer": node})
        if online:
            self._positions.retain_everything()  # it has just read our retained positions
            self._positions.announce_everything()  # ... not all of them, past a broker queue
        for each in self.replicas.values():
            each.deliver(PeerOnline(node, online))
        self.resources.presence(node, online)

    def _unlist(self, node: str) -> None:
        """A node removed from [peers]: drop it from presence, every file and the metrics."""
        self.presence.pop(node, None)
        self.speaks.pop(node, None)
        self.heard_version.pop(node, None)
        self._last_presence.pop(node, None)
        if self.pairs is not None:
            self.pairs.forget(node)
        self._streams.forget(node)
        self.presence_since.pop(node, None)
        self.telemetry.forget(node)
        self.budgets.forget(node)
        self.resources.forget_peer(node)
        self.holdings.forget(node)
        for r in self.replicas.values():
            if r.loaded.is_set():  # else _after_load does it
                r.forget_peer(node)
        log.warning("node %s is no longer in [peers]: dropped from status and metrics, its "
                    "frames are refused", node, extra={"peer": node})

    def _reject(self, topic: str, reason: str, sender: str | None = None) -> None:
        self.rejected += 1
        self.telemetry.reject(reason)
        now = time.monotonic()
        # One line per sender per minute at most: a hostile client must not flood the log.
        who = sender or ""
        if now - self._last_reject_log.get(who, -60.0) >= 60:
            if len(self._last_reject_log) > 1000:
                self._last_reject_log.clear()
            self._last_reject_log[who] = now
            log.warning("rejected frame on %r: %s (%d rejected so far)", topic[:200], reason,
                        self.rejected)

    # --- the numbered stream (freshness.py, PeerStreams) -----------------------------------

    async def _stream_forever(self) -> None:
        """A beat on P/a when nothing else went there for the interval our last frame promised
        (so that a peer can tell a quiet host from a stream it no longer hears): BEAT_INTERVAL,
        or IDLE_BEAT once only beats went for ACTIVE_FOR; and the asks that are due."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now >= self._lane_sent_at + self._beat_every:
                if self.link.connected.is_set():
                    # Promise the slow pace once this beat ends ACTIVE_FOR of quiet; a frame
                    # sent meanwhile brings the fast pace back at once.
                    quiet = now + BEAT_INTERVAL - self._active_at >= ACTIVE_FOR
                    every = IDLE_BEAT if quiet else BEAT_INTERVAL
                    self._outbox.add(frames.all_topic(self._prefix, self.node), "",
                                     frames.Item(Kind.BEAT, frames.Beat(
                                         every_ms=round(every * 1000))))
                    self._outbox.flush()
                    self._beat_every = every
                else:
                    self._lane_sent_at = now
            dropped = self.link.dropped
            if dropped != self._dropped_seen:
                # Our publishes are being dropped (the connection is congested, or went):
                # what reaches us may be short too, and our asks may be among them.
                self._streams.doubt_all(time.time(), f"{dropped - self._dropped_seen} "
                                        "publishes of ours were dropped (a congested link)")
                self._dropped_seen = dropped
            if self.link.connected.is_set():
                online = {n for n, o in self.presence.items() if o}
                self._ask(self._streams.asks_due(time.time(), online))
            wait = self._lane_sent_at + self._beat_every - loop.time()
            if self._streams.in_doubt():
                wait = min(wait, BEAT_INTERVAL)  # asks are due every ASK_RETRY
            self._pace.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, wait)):
                    await self._pace.wait()

    def _ask(self, nodes: list[str]) -> None:
        for node in nodes:
            if node in self.config.peers:
                self.send(Kind.ASK, "", "", frames.Ask(), to=node)

    def _asked_by(self, peer: str) -> None:
        """A peer doubts what it knows of us: state every position again, soon (at most once
        a RESTATE_GAP, for everyone who asked meanwhile)."""
        self.asks += 1
        if self._restate_timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._restate_timer = loop.call_at(max(loop.time(), self._restated_at + RESTATE_GAP),
                                           self._restate)

    def _restate(self) -> None:
        """Every position, on P/a, then a beat naming the lane where they began: a peer that
        got every frame from that lane to the beat knows all our positions again."""
        self._restate_timer = None
        self._restated_at = asyncio.get_running_loop().time()
        self.restatements += 1
        self._positions.release_held()  # older ones first, not after
        self._outbox.flush()
        topic = frames.all_topic(self._prefix, self.node)
        first = self._lane + 1
        for (key, file), r in sorted(self.replicas.items()):
            ann = r.machine.stated_position()
            if ann is not None:
                item = frames.Item(Kind.POS, ann, key, file)
                self.telemetry.count("sent", Kind.POS.value, item.size)
                self._outbox.add(topic, "", item)
        self._outbox.add(topic, "", frames.Item(Kind.BEAT, frames.Beat(first)))
        self._outbox.flush()  # more than a lone beat: the fast pace follows

    def _peer_status(self, node: str, online: bool, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"online": online, "since": self.presence_since.get(node),
                               "speaks": list(self.speaks.get(node, versions.LEGACY)),
                               "wire_version": self.wire_version(node),
                               "heard_version": self.heard_version.get(node)}
        c = self._streams.confirmation(node, now)
        out["confirmed"] = c.confirmed
        if not c.confirmed:
            out["unconfirmed_since"], out["unconfirmed"] = c.since, c.why
        return out

    # --- control socket ---------------------------------------------------------------------

    def limit_warnings(self) -> list[str]:
        """The kernel's limits that the roots need more of (core/oslimits.py)."""
        if not self.config.watch:
            return []
        w = self._watcher
        found = shortfalls(oslimits.inotify_limits(), w.needed, w.unwatched)
        return [*found, w.no_instance] if w.no_instance else found

    def os_limits(self) -> dict[str, Any]:
        """What status and the metrics show of the kernel's limits at scale (core/oslimits.py):
        inotify's watches and instances, and this process's file descriptors."""
        limits = oslimits.inotify_limits()
        open_now, soft, hard = oslimits.open_files()
        w = self._watcher
        return {
            "inotify": {
                "enabled": self.config.watch and w.active,
                "watches": w.watched,  # directories under watch
                "watches_needed": w.needed if self.config.watch else 0,  # one per directory
                "max_user_watches": limits.max_user_watches,
                "max_user_instances": limits.max_user_instances,
                "warnings": self.limit_warnings(),
            },
            "open_files": {"open": open_now, "limit": soft, "hard_limit": hard},
        }

    def status(self, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """The status document, built at once (metrics; tests); with `wanted`, of the files of
        the keys it accepts only (each file's status is the costly part: ~0.3 ms, a second at
        3000 files)."""
        return self._status_of([self._file_status(r) for (key, _), r
                                in sorted(self.replicas.items())
                                if wanted is None or wanted(key)])

    async def status_sliced(self, wanted: Callable[[str], bool] | None = None
                            ) -> tuple[dict[str, Any], float]:
        """The same as status(), built STATUS_SLICE seconds of work at a time, the loop free
        in between (with a thousand keys the whole document costs ~150 ms of CPU); and the
        seconds the building itself took (the slices, not what ran between them)."""
        files = []
        spent = 0.0
        started = time.monotonic()
        for (key, _), r in sorted(self.replicas.items()):
            if wanted is not None and not wanted(key):
                continue
            files.append(self._file_status(r))
            now = time.monotonic()
            if now - started >= STATUS_SLICE:
                spent += now - started
                await asyncio.sleep(0)
                started = time.monotonic()
        status = self._status_of(files)
        return status, spent + time.monotonic() - started

    def _file_status(self, r: FileTask) -> dict[str, Any]:
        f = r.status()
        now = time.monotonic()
        peers: dict[str, dict[str, Any]] = f["peers"]  # type: ignore[assignment]
        for p in peers.values():
            p["lag_seconds"] = round(self.telemetry.lag_seconds(
                r.key, r.file, p["size"], f["size"], now), 3)  # type: ignore[arg-type]
        self.telemetry.prune(r.key, r.file, min((p["size"] for p in peers.values()), default=0))
        return f

    def _status_of(self, files: list[dict[str, Any]]) -> dict[str, Any]:
        skipped = [s.to_json() for s in self.skipped]
        skipped += [{"key": printable(k), "path": None, "reason": why}
                    for k, why in sorted(self._refused.items())]
        ready = sum(1 for f in files if f["ready"])
        now_wall = time.time()
        return {
            "node": self.node,
            "broker": self.link.broker,  # the one in use (connected, or being tried)
            "brokers": self.link.brokers,  # every broker listed, in order
            "broker_switches": self.link.switches,
            "connected": self.link.connected.is_set(),
            "connected_since": self.connected_since(),
            "queued_bytes": self.link.queued,  # published, not yet acknowledged by the broker
            "publishes_dropped": self.link.dropped,  # over [mqtt] max_queued_bytes
            "peers": {n: self._peer_status(n, o, now_wall)
                      for n, o in sorted(self.presence.items())},
            "restatements": {"asked": self.asks, "made": self.restatements},
            # Local changes read and shipped, and how many joined a commit (window.py).
            "group_commit": self._window.status(),
            "ready_count": {"yes": ready, "no": len(files) - ready},
            "rejected_frames": self.rejected,
            "sealed_not_for_us": self.not_for_us,
            "peer_budgets": self.budgets.status(),
            "peer_limits": self._limits_status(),
            "uptime_s": round(time.time() - self.started, 1),
            "files": files,
            "resources": self.resources.status(),
            # Entries below the roots refused as links, devices, ... (syncd/core/unsafe.py).
            "unsafe_paths": self.unsafe.status(),
            # Directories that would be instances but cannot be replicated: `syncd status`
            # shows each as state "error" with its reason.
            "skipped": skipped,
            **self.os_limits(),
        }


    def _limits_status(self) -> dict[str, Any]:
        """What the bounds of docs/peer-limits.md hold and refused (status `peer_limits`)."""
        lim = self.config.limits
        return {
            "keys": len(self.keyspace),
            "max_keys": lim.max_keys,
            "keys_made_by": dict(sorted(Counter(self.made_by.values()).items())),
            "remote_growth": {"stopped": bool(self._low_space), "since": self._low_since,
                              "low": dict(sorted(self._low_space.items())),
                              "min_free_bytes": lim.min_free_bytes},
            "refused": self.telemetry.refusals(),
            "held": self.holdings.status(),
            "max_peer_bytes": lim.max_peer_bytes,
            "unfinished_lines": logfollow.HELD.status(),  # the log checks' pool (logfollow.py)
        }


def watch_depth(config: Config) -> int:
    """Levels below a watched directory worth a watch: a glob's levels down to its roots,
    the instances (MAX_DEPTH), resources/ and as deep as its scans go ([resources]
    max_depth). Deeper, nothing is replicated: a bot-made tree costs no watches there."""
    rules = [config.resources, *(k.resources for k in config.keys.values())]
    walk = max((r.max_depth for r in rules if r is not None), default=0)
    roots = max((1 + len(s.tail) for s in config.roots.specs if s.is_glob), default=0)
    return roots + MAX_DEPTH + 1 + walk


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
