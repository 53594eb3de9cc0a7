"""The node's side of resource replication: one ResourceFiles per instance key, and routing.

The node hands over resource items, hints under an instance's resources/, its sweep, its
connection and peers' presence; this file finds the instance's ResourceFiles (creating it for a
key this node replicates), applies the key's `writers` and the peers' serving budgets, and
answers the readiness question "which files the log references are missing here".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from syncd.config import Config
from syncd.core import frames
from syncd.core.budget import Budgets
from syncd.core.frames import Kind
from syncd.core.names import printable
from syncd.core.resources import Connected, PeerItem, PeerPresence, PeerView, ResourceMachine
from syncd.core.roots import KeyPathError
from syncd.core.spot import Spot
from syncd.daemon.resourcefiles import ResourceFiles, ResourceHost
from syncd.disk import tree
from syncd.disk.persist import RecordStore

log = logging.getLogger("syncd.resources")

RESOURCE_KINDS = frozenset({Kind.RSUM, Kind.RLIST, Kind.RHAVE, Kind.RREQ, Kind.RDATA,
                            Kind.RREFUSE})
# What a host that is not among a key's writers may not tell us about it: its files do not
# count (it may still ask for ours).
_CLAIMS = frozenset({Kind.RSUM, Kind.RHAVE, Kind.RDATA})
MISSING_SHOWN = 5
# inotify finds changes at once; the rescan is a safety net, paced so that 1000 idle instances
# cost little: each every 30 s at most, 16 per sweep (a full round every 63 s with 1000).
RESCAN_SECONDS = 30.0
RESCAN_BATCH = 16
SWEEP_INSTANCES = 100  # instances looked at per sweep, round-robin, with inotify on
# Chunks a resource fetch keeps in flight: a few, beside the log's own fetch window, so that a
# big blob does not fill a slow peer's broker queue (Mosquitto drops past it, positions too).
RESOURCE_WINDOW_CHUNKS = 8


class HubHost(ResourceHost, Protocol):
    config: Config
    records: RecordStore
    budgets: Budgets

    def is_online(self, node: str) -> bool: ...


class ResourceHub:
    def __init__(self, host: HubHost) -> None:
        self.host = host
        self.files: dict[str, ResourceFiles] = {}
        self.dropped = 0  # items refused here (wrong file, not a writer, over budget)
        self._cursor = 0  # where the next sweep's round-robin batch starts

    def ensure(self, key: str, if_present: bool = False) -> ResourceFiles | None:
        """The instance's resources, made on first need. `if_present`: only if its
        `resources/` directory exists (an instance that has none costs nothing until a peer
        announces files, a hint shows one, or its log references one)."""
        r = self.files.get(key)
        if r is not None:
            return r
        config = self.host.config
        rules = config.resources_of(key)
        if not config.wants_key(key) or rules is None:
            return None
        try:
            folder = config.key_spot(key) / "resources"
        except KeyPathError:
            return None  # the log's replica says why
        if if_present and not _present(folder):
            return None
        writers = config.keys[key].writers if key in config.keys else None
        machine = ResourceMachine(config.node, rules,
                                  frozenset(writers) if writers is not None else None,
                                  chunk_bytes=config.chunk_bytes,
                                  window=min(config.fetch_window_bytes,
                                             RESOURCE_WINDOW_CHUNKS * config.chunk_bytes),
                                  timeout=config.request_timeout)
        for node in config.peers:
            if node != config.node:  # presence heard before this key was found
                machine.peers[node] = PeerView(online=self.host.is_online(node))
        r = ResourceFiles(self.host, key, folder,
                          self.host.records.folder(key) / "resources.json", machine)
        self.files[key] = r
        r.start()
        return r

    def deliver(self, sender: str, item: frames.Item) -> None:
        config = self.host.config
        if item.file != frames.RESOURCES:
            self.dropped += 1
            return
        if item.kind in _CLAIMS and (not config.may_write(item.key, sender)
                                     or config.role_of(item.key) == "source"):
            self.dropped += 1  # a `source` takes no remote files either (it serves them)
            return
        if isinstance(item.payload, frames.ResAsk):
            cost = item.payload.length
            if not self.host.budgets.admit(sender, cost, time.monotonic()):
                self.dropped += 1
                return  # asked again after the requester's timeout
        if (item.key not in self.files and isinstance(item.payload, frames.ResSum)
                and item.payload.count == 0):
            return  # an empty manifest, of an instance with none here either: nothing to do
        r = self.ensure(item.key)
        if r is not None:
            r.deliver(PeerItem(sender, item.payload))

    def hint(self, key: str, path: str) -> None:
        """A change at `path`, inside the instance directory of `key`."""
        if path.endswith(".tmp"):
            return  # a temp file (the writer's, or ours being filled): its rename will say
        r = self.ensure(key, if_present=True)
        if r is not None:
            r.hint(path)

    def look_everywhere(self) -> None:
        """Hints were lost (an inotify queue overflow): scan every instance now."""
        for r in self.files.values():
            r.hint()

    def sweep(self) -> None:
        # Timers, and every file of every instance stat'ed at most every RESCAN_SECONDS
        # (every sweep without inotify), RESCAN_BATCH instances per sweep at most: hints find
        # changes at once, this finds what they missed. With inotify on, an idle instance is
        # looked at once per SWEEP_INSTANCES-sized round (its summary timer can wait that
        # long); one with transfers under way, every sweep.
        now = time.monotonic()
        files = list(self.files.values())
        watch = self.host.config.watch
        if not watch or len(files) <= SWEEP_INSTANCES:
            batch = files
        else:
            start = self._cursor % len(files)
            batch = files[start:start + SWEEP_INSTANCES]
            self._cursor = start + len(batch)
            picked = {id(r) for r in batch}
            batch += [r for r in files if id(r) not in picked and r.machine.busy]
        every = 0.0 if not watch else RESCAN_SECONDS
        stale = [r for r in batch if now - r.scanned_at >= every]
        stale.sort(key=lambda r: r.scanned_at)
        rescan = {id(r) for r in stale[:RESCAN_BATCH]}
        for r in batch:
            r.sweep(id(r) in rescan)

    def connected(self) -> None:
        for r in self.files.values():
            r.deliver(Connected())

    def presence(self, node: str, online: bool) -> None:
        for r in self.files.values():
            r.deliver(PeerPresence(node, online))

    def configure(self, config: Config) -> None:
        """A reloaded config: new rules and writers for the instances kept."""
        for key, r in list(self.files.items()):
            rules = config.resources_of(key)
            if not config.wants_key(key) or rules is None:
                del self.files[key]
                continue
            r.machine.rules = rules
            writers = config.keys[key].writers if key in config.keys else None
            r.machine.writers = frozenset(writers) if writers is not None else None
            r.machine.refused.clear()
            r.machine.retry_at.clear()
            r.hint()

    async def stop(self) -> None:
        for r in self.files.values():
            await r.stop()

    def missing(self, key: str, refs: Iterable[str]) -> tuple[list[str], int, int]:
        """(missing files, referenced files no host holds, conflicts) for the log's refs."""
        refs = list(refs)
        r = self.files.get(key) or (self.ensure(key) if refs else None)
        if r is None:
            return [], 0, 0
        missing, unheld = r.machine.missing(refs)
        return missing, len(unheld), len(r.machine.conflicts())

    def status(self) -> list[dict[str, Any]]:
        return [r.status() for _, r in sorted(self.files.items())]

    def conflict_count(self) -> int:
        return sum(len(r.machine.conflicts()) for r in self.files.values())


def _present(folder: Spot) -> bool:
    """Whether resources/ exists, as anything: a link or a file there is shown by its scan.
    (A link above it, the instance directory itself, is the log's replica's to refuse.)"""
    try:
        return tree.lstat(folder) is not None
    except OSError:
        return False


def describe(names: list[str]) -> str:
    shown = ", ".join(printable(n) for n in names[:MISSING_SHOWN])
    more = f" and {len(names) - MISSING_SHOWN} more" if len(names) > MISSING_SHOWN else ""
    return shown + more
