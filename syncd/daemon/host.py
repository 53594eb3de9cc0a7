"""The daemon: one Host owns the file tasks of the instances found here and wires the parts
that do the rest, each in a module of its own:

- instances.py: the instances, and their file tasks (found on disk, or on a writer's word);
- sweep.py: the watcher's hints routed to their file, and the periodic sweep under them;
- gate.py: every inbound frame, checked, bounded and charged, then routed to its file task;
- presence.py: what this host has heard of each peer (online, versions, run key, stream);
- outbound.py: our frames (sealed, batched, retained) and our numbered stream (beats, asks);
- freespace.py: the floor below which no peer's bytes are written here;
- reload.py: a re-read config applied; hoststatus.py: the status document.

What remains here is lifetime (start, run, stop), the wiring, and the HostServices the file
tasks call (filetask.py): thin answers read from those parts and from the config. It routes,
it does not decide. Its control socket (`syncd status`, `adopt`, `reload`) is served by
ops/controlserver.py, attached as a Service so that this layer never imports that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from syncd.config import SOCKET_NAME, Config
from syncd.core import frames
from syncd.core.budget import Budgets, Holdings
from syncd.core.errors import SyncdError
from syncd.core.events import PeerOnline
from syncd.core.filemachine import Tuning
from syncd.core.frames import Kind
from syncd.core.freshness import ReplayGuard
from syncd.core.identity import Identity, IdentityError
from syncd.core.oslimits import shortfalls
from syncd.core.pairkeys import PairKeys
from syncd.core.readiness import Unconfirmed, when
from syncd.core.roots import MAX_DEPTH, KeyPathError
from syncd.core.telemetry import Telemetry
from syncd.core.unsafe import UnsafePaths
from syncd.daemon import hoststatus, reload
from syncd.daemon.answers import Answering, Answers
from syncd.daemon.filetask import FileTask
from syncd.daemon.freespace import FreeSpace
from syncd.daemon.gate import FrameGate
from syncd.daemon.instances import Instances
from syncd.daemon.outbound import Outbound
from syncd.daemon.presence import Presence
from syncd.daemon.resourcehub import ResourceHub
from syncd.daemon.scrub import scrub_forever
from syncd.daemon.sweep import Sweep
from syncd.daemon.window import CommitGate
from syncd.disk import durable, oslimits
from syncd.disk.discovery import root_problems
from syncd.disk.epoch import next_epoch
from syncd.disk.groupsync import GroupSync
from syncd.disk.keyfile import load_identity
from syncd.disk.peerepochs import PeerEpochs
from syncd.disk.recordfiles import RecordFiles, Save
from syncd.disk.watcher import Watcher
from syncd.net.link import Link

log = logging.getLogger("syncd.node")

ADOPT_STALL_SECONDS = 60


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
        self.busy_files: set[FileTask] = set()  # files with work waiting or under way
        self.services: list[Service] = []
        self.syncer = GroupSync()
        self.records = RecordFiles(config.state_dir)
        self.identity: Identity | None = None  # read in check_dirs(), before anything is sent
        self.epoch = 0  # this run's number, counted up in check_dirs()
        self.pairs: PairKeys | None = None  # this run's keys and the peers' (check_dirs())
        self._peer_epochs = PeerEpochs(config.state_dir)
        self._epochs_unsaved = False
        self.started = time.time()
        self.telemetry = Telemetry(time.monotonic())
        self.budgets = Budgets(config.limits)  # what each peer's requests may cost us
        self.holdings = Holdings(config.limits.max_peer_bytes)  # memory on each peer's word
        # Links, devices, unreadable or too deep directories met below the roots (unsafe.py).
        self.unsafe = UnsafePaths()
        self.free_space = FreeSpace(config.state_dir)
        self.heard = Presence()
        self.presence = self.heard.online  # node -> online, the one dict the machines read
        self.outbound = Outbound(self, self.heard)
        self.gate = FrameGate(self, self.heard)
        self.instances = Instances(self)
        self.replicas = self.instances.tasks  # (key, file) -> its file task (the same dict)
        self.sweeper = Sweep(self, self.instances)
        self.link = Link(config, self.gate.on_message, self._on_connected,
                         self.outbound.seal_presence, self._subscriptions)
        self.outbound.link = self.link
        # Peers' requests for bytes wait while their answers are in flight (answers.py).
        self.answers = Answers(self.link.queued_to, self.outbound.flush, self.holdings)
        self.link.on_acked = self.answers.acked
        self.watcher = Watcher(config.roots.watch_dirs(), self.sweeper.hint,
                               self.sweeper.overflow, max_depth=watch_depth(config))
        self.sweeper.watcher = self.watcher
        # Local changes: read and shipped at once when nothing is in flight for the file, else
        # together in the next commit, after the optional batch_window (window.py).
        self.commits: CommitGate[FileTask] = CommitGate(
            config.batch_window, FileTask.released, self.watcher.hold, self.watcher.drain,
            self.watcher.resume)
        self._stop = asyncio.Event()
        self._durable_hooks: list[Callable[[str, str, int], None]] = []
        self.resources = ResourceHub(self)  # each instance's resources/ (resourcehub.py)

    # --- HostServices, what the file tasks call -------------------------------------------

    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None:
        self.outbound.send(kind, key, file, payload, to, retain)

    def flush(self) -> None:
        self.outbound.flush()

    def role_of(self, key: str) -> str:
        return self.config.role_of(key)

    def records_of(self, key: str, file: str) -> str:
        return self.config.records_of(key, file)

    def settle_of(self, key: str, file: str) -> float:
        return self.config.settle_of(key, file)

    # The tuning values are read from the config each time (never copied), so that a reload
    # has one place to change.
    def tuning(self) -> Tuning:
        c = self.config
        return Tuning(chunk_bytes=c.chunk_bytes, fill_bytes=c.fill_bytes,
                      fetch_window=c.fetch_window_bytes,
                      request_timeout=c.request_timeout, persist_interval=c.persist_interval)

    def is_online(self, node: str) -> bool:
        return self.heard.is_online(node)

    def is_listed(self, node: str) -> bool:
        return node in self.config.peers

    def offline_since(self, node: str) -> float | None:
        return self.heard.offline_since(node)

    def connected_since(self) -> float | None:
        return self.heard.connected_at if self.link.connected.is_set() else None

    def missing_resources(self, key: str, refs: Iterable[str]) -> tuple[list[str], int, int]:
        return self.resources.missing(key, refs)

    def unconfirmed_peers(self, key: str) -> list[Unconfirmed]:
        return self.heard.unconfirmed(lambda node: self.config.may_write(key, node))

    def growth_problem(self, key: str) -> str | None:
        """Why no peer's bytes may be written for `key` now (None: they may)."""
        return self.free_space.problem(lambda: self._root_of(key),
                                       self.config.limits.min_free_bytes)

    def _root_of(self, key: str) -> Path | None:
        try:
            return self.config.roots.locate(key)[0].path
        except KeyPathError:
            return None

    def note_unsafe(self, path: str, kind: str, reason: str) -> None:
        """An entry below a root refused (never followed): counted, logged once, shown."""
        if self.unsafe.note(path, kind, reason):
            log.error("%s: %s (refused: syncd reads, serves and writes nothing through it; "
                      "shown in status under unsafe_paths)", path, reason)

    def durable(self, key: str, file: str, size: int) -> None:
        self.telemetry.durable(key, file, size, time.time(), time.monotonic())
        for hook in self._durable_hooks:
            hook(key, file, size)

    def on_durable(self, hook: Callable[[str, str, int], None]) -> None:
        """Call `hook(key, file, size)` each time bytes become durable here (tests, bench)."""
        self._durable_hooks.append(hook)

    # --- what the parts ask of the host (gate, instances, sweep, resources, outbound) -----

    def file_task(self, key: str, file: str, peer: str) -> FileTask | None:
        return self.instances.task(key, file, peer)

    def is_instance(self, key: str) -> bool:
        return self.instances.is_instance(key)

    def instance_for(self, key: str, peer: str) -> bool:
        return self.instances.instance_for(key, peer)

    def charge(self, peer: str, cost: int) -> bool:
        return self.gate.charge(peer, cost)

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None:
        self.gate.refused(peer, reason, what, n)

    async def answer_room(self, peer: str) -> None:
        await self.answers.room(peer)

    def answer_waits(self, peer: str, task: Answering, event: object) -> bool | None:
        return self.answers.wait(peer, task, event)

    def asked_by(self, peer: str) -> None:
        self.outbound.asked_by(peer)

    def stated_positions(self) -> Iterable[tuple[str, str, frames.Payload | None]]:
        for (key, file), r in sorted(self.replicas.items()):
            yield key, file, r.machine.stated_position()

    def each_sweep(self) -> None:
        self._check_free_space()

    def after_sweep(self) -> None:
        self._keep_peer_epochs()

    def scrubbed(self) -> list[FileTask]:
        return list(self.replicas.values())

    def presence_changed(self, node: str, online: bool) -> None:
        """A peer came online or went: every file and the resources hear of it."""
        if not self.heard.change(node, online):
            return
        if online:
            positions = self.outbound.positions
            positions.retain_everything()  # it has just read our retained positions
            positions.announce_everything()  # ... not all of them, past a broker queue
        for each in self.replicas.values():
            each.deliver(PeerOnline(node, online))
        self.resources.presence(node, online)

    def unlist(self, node: str) -> None:
        """A node removed from [peers]: drop it from presence, every file and the metrics."""
        self.heard.forget(node)
        if self.pairs is not None:
            self.pairs.forget(node)
        self.telemetry.forget(node)
        self.budgets.forget(node)
        self.resources.forget_peer(node)
        self.holdings.forget(node)
        for r in self.replicas.values():
            if r.loaded.is_set():  # else the instances' after-load chore does it
                r.forget_peer(node)
        log.warning("node %s is no longer in [peers]: dropped from status and metrics, its "
                    "frames are refused", node, extra={"peer": node})

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
        self.gate.guard = ReplayGuard(self._peer_epochs.load())

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Run until `stop()`; `ready` is called once file tasks are loaded and the link is
        up."""
        self.check_dirs()
        self._check_free_space()  # before the first peer's byte: a host may start on a full disk
        self.instances.discover()
        if self.config.watch:
            self.watcher.start()  # says itself when it gets no inotify instance
            w = self.watcher
            for warning in shortfalls(oslimits.inotify_limits(), w.needed, w.unwatched):
                log.warning("%s", warning)
        else:
            log.info("watch = false: changes are found by the stat sweep every %.2gs",
                     self.config.sweep_interval)
        tasks = [
            asyncio.create_task(self.link.run(), name="link"),
            asyncio.create_task(self.sweeper.forever(), name="sweep"),
            asyncio.create_task(scrub_forever(self), name="scrub"),
            asyncio.create_task(self.outbound.stream_forever(), name="stream"),
        ]
        for service in self.services:
            await service.start(self.socket_path)
        log.info("node %s watching %s (%d files), state in %s", self.node,
                 self.config.roots.describe(), len(self.replicas), self.config.state_dir)
        try:
            stop = asyncio.create_task(self._stop.wait())
            if ready is not None:
                # Not past a stop or a failure: SIGTERM must work while the broker is away.
                waiting = asyncio.create_task(self._wait_ready(ready))
                await asyncio.wait([waiting, stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    waiting.result()  # what ready() raised, raised here as before
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
            self.watcher.stop()
            await self.link.close()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            saves: list[Save] = []
            for r in self.replicas.values():
                await r.stop(saves)
            # Every file's durable record at once: one by one, 1000 fsynced records took 2 s
            # on a quiet disk and 17 s on a busy one.
            await asyncio.to_thread(self.records.save_all, saves)
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
        """Re-read the config file we started from and apply it (reload.py)."""
        return await reload.from_source(self, expected)

    async def reload(self, config: Config) -> list[str]:
        """Apply a re-read config (reload.py); the names of what needs a restart."""
        return await reload.apply(self, config)

    @property
    def socket_path(self) -> Path:
        return self.config.state_dir / SOCKET_NAME

    async def _wait_ready(self, ready: Callable[[], None]) -> None:
        await self.link.connected.wait()
        for r in list(self.replicas.values()):
            await r.loaded.wait()
        # Said here, the moment it holds: through the wait in run() it came a few loop turns
        # later, after every file had handled the connection (1000 keys: ~0.2 s).
        ready()

    def _check_free_space(self) -> None:
        """statvfs of each root (and glob's directory) and of state_dir (freespace.py)."""
        self.free_space.check(self.config.roots.watch_dirs(), self.config.limits.min_free_bytes)

    def _keep_peer_epochs(self) -> None:
        """Keep the peers' newest runs in state_dir (written only when one changed)."""
        try:
            self._peer_epochs.save(self.gate.guard.epochs())
        except OSError as e:
            if not self._epochs_unsaved:  # once until it works again, not every second
                log.warning("cannot keep the peers' runs in %s: %s", self.state_dir,
                            e.strerror or e)
            self._epochs_unsaved = True
        else:
            self._epochs_unsaved = False

    # --- the link ---------------------------------------------------------------------------

    async def _on_connected(self) -> None:
        connected_at = self.heard.connected_at = time.time()
        # What every peer sent while we were away is unknown: each is asked to state its
        # positions again (the presence we are about to read may be old: ask them all).
        self.heard.streams.reconnected(connected_at, when(connected_at))
        self.outbound.ask(sorted(n for n in self.config.peers if n != self.node))
        # The broker may have lost them: every file's next position goes at once.
        self.outbound.positions.forget()
        for r in self.replicas.values():
            r.reconnected()
        self.resources.connected()

    def _subscriptions(self) -> list[str]:
        return frames.subscriptions(self.outbound.prefix, self.node, self.config.peers,
                                    self.config.mqtt.hide_names)

    # --- the operator -----------------------------------------------------------------------

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
                    if (r := self.instances.task(key, f)) is not None]
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

    # --- status (hoststatus.py) -------------------------------------------------------------

    def limit_warnings(self) -> list[str]:
        return hoststatus.limit_warnings(self)

    def os_limits(self) -> dict[str, Any]:
        return hoststatus.os_limits(self)

    def status(self, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
        return hoststatus.status(self, wanted)

    async def status_sliced(self, wanted: Callable[[str], bool] | None = None
                            ) -> tuple[dict[str, Any], float]:
        return await hoststatus.status_sliced(self, wanted)


def watch_depth(config: Config) -> int:
    """Levels below a watched directory worth a watch: a glob's levels down to its roots,
    the instances (MAX_DEPTH), resources/ and as deep as its scans go ([resources]
    max_depth). Deeper, nothing is replicated: a bot-made tree costs no watches there."""
    rules = [config.resources, *(k.resources for k in config.keys.values())]
    walk = max((r.max_depth for r in rules if r is not None), default=0)
    roots = max((1 + len(s.tail) for s in config.roots.specs if s.is_glob), default=0)
    return roots + MAX_DEPTH + 1 + walk
