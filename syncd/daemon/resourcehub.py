"""The node's side of resource replication: one ResourceFiles per instance key, and routing.

The node hands over resource items, hints under an instance's resources/, its sweep, its
connection and peers' presence; this file finds the instance's ResourceFiles (creating it for a
key this node replicates), applies the key's `writers` and the peers' serving budgets, and
answers the readiness question "which files the log references are missing here".

Bounds (docs/peer-limits.md): a peer's word makes a ResourceFiles only for an instance this
host replicates, or for a key its files (a writer's) may create by the node's rules; every
request is charged to the asker's budget by the bytes it makes us send (a whole manifest, a
window of a file); what waits for an instance's first scan is held in the sender's Holdings;
no fetched bytes are written while remote growth is stopped (free space below the floor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from syncd.config import Config
from syncd.core import frames
from syncd.core.budget import ANSWER_OVERHEAD, Budgets, Holdings, chunked_cost
from syncd.core.frames import Kind
from syncd.core.names import printable
from syncd.core.resources import (
    ENTRIES_PER_ITEM,
    Connected,
    Event,
    PeerBounds,
    PeerItem,
    PeerManifest,
    PeerPresence,
    ResourceMachine,
    entry_cost,
)
from syncd.core.roots import KeyPathError
from syncd.core.spot import Spot
from syncd.daemon.answers import Answering
from syncd.daemon.resourcefiles import ResourceFiles, ResourceHost
from syncd.disk import tree
from syncd.disk.recordfiles import RecordFiles

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


class _ListAnswer:
    """A manifest request that waited for the answers in flight (answers.py): given to its
    instance's resources once they may go."""

    def __init__(self, hub: ResourceHub, key: str) -> None:
        self._hub, self._key = hub, key

    @property
    def running(self) -> bool:
        return self._key in self._hub.files

    def deliver_held(self, event: Event, peer: str, size: int) -> None:
        self._hub.host.holdings.give(peer, size)  # taken by Answers.wait
        r = self._hub.files.get(self._key)
        if r is not None:
            r.deliver(event)


class HubHost(ResourceHost, Protocol):
    config: Config
    records: RecordFiles
    budgets: Budgets
    holdings: Holdings

    def is_online(self, node: str) -> bool: ...

    def is_instance(self, key: str) -> bool:
        """Whether this host replicates `key` (its log's replica exists)."""

    def instance_for(self, key: str, peer: str) -> bool:
        """Whether `key` is an instance here, made on `peer`'s word if the bounds allow (the
        refusal is counted and logged by the host)."""

    def charge(self, peer: str, cost: int) -> bool:
        """Whether `peer`'s request that sends `cost` bytes is within its budget (paid)."""

    def answer_waits(self, peer: str, task: Answering, event: Event) -> bool | None:
        """Whether `peer`'s request must wait while its answers are in flight (None: it
        cannot, dropped); daemon/answers.py."""

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None:
        """Count (and log, at most once a minute per peer and reason) refused items."""

    def growth_problem(self, key: str) -> str | None:
        """Why no peer's bytes may be written for `key` now (None: they may)."""


class ResourceHub:
    def __init__(self, host: HubHost) -> None:
        self.host = host
        self.files: dict[str, ResourceFiles] = {}
        self.dropped = 0  # items refused here (wrong file, not a writer, over budget)
        self._cursor = 0  # where the next sweep's round-robin batch starts
        # key -> peer -> bytes of its items waiting for the instance's first scan (Holdings)
        self._preload: dict[str, dict[str, int]] = {}

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
        bounds = PeerBounds(self.host.holdings, config.limits.max_resource_files,
                            lambda peer, reason, n: self.host.refused(
                                peer, reason, f"manifest entries of {printable(key)}", n))
        machine = ResourceMachine(config.node, rules,
                                  frozenset(writers) if writers is not None else None,
                                  chunk_bytes=config.chunk_bytes,
                                  window=min(config.fetch_window_bytes,
                                             RESOURCE_WINDOW_CHUNKS * config.chunk_bytes),
                                  timeout=config.request_timeout,
                                  serve_max=config.fetch_window_bytes, bounds=bounds)
        for node in config.peers:
            if node != config.node:  # presence heard before this key was found
                machine.peers[node] = PeerManifest(online=self.host.is_online(node))
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
        p = item.payload
        r = self.files.get(item.key)
        if r is None:
            if isinstance(p, frames.ResSum) and p.count == 0:
                return  # an empty manifest, of an instance with none here either: nothing to do
            # A writer's files may make the instance (as its log's bytes would); a request or
            # a refusal is about an instance we hold, or about nothing.
            known = (self.host.instance_for(item.key, sender) if item.kind in _CLAIMS
                     else self.host.is_instance(item.key))
            r = self.ensure(item.key) if known else None
            if r is None:
                self.dropped += 1
                return
        cost = self._cost(r, p)
        if cost is not None and not self.host.charge(sender, cost):
            self.dropped += 1
            return  # asked again after the requester's timeout
        if isinstance(p, frames.ResChunk) and self.host.growth_problem(item.key):
            self.host.refused(sender, "disk_low", f"resource bytes of {printable(item.key)}")
            self.dropped += 1
            return  # fetched again once space is back (the transfer times out meanwhile)
        if not r.loaded and not self._hold_until_loaded(item.key, sender, p):
            self.dropped += 1
            return
        event = PeerItem(sender, p)
        if isinstance(p, frames.ResList) and r.loaded:
            # Our whole manifest, sent at once: read only while what we answered that peer
            # is not in flight past the bound, as a request for bytes (daemon/answers.py).
            # A frame of 300 RLIST items of other digests made 300 answers at once, all
            # batched, sealed and held by paho before any was written.
            waits = self.host.answer_waits(sender, _ListAnswer(self, item.key), event)
            if waits is None:
                self.host.refused(sender, "peer_bytes", "manifest requests waiting for answers")
                self.dropped += 1
                return
            if waits:
                return
        r.deliver(event)

    def _cost(self, r: ResourceFiles, p: frames.Payload) -> int | None:
        """Bytes a request makes us send (None: it is no request): what the machine answers,
        a window of the file at most, or the whole manifest."""
        m = r.machine
        if isinstance(p, frames.ResAsk):
            ours = m.local.get(p.name)
            if ours is None or ours.digest != p.digest or p.offset > ours.size:
                return ANSWER_OVERHEAD  # a refusal
            length = min(p.length, ours.size - p.offset, m.serve_max)
            return chunked_cost(length, m.chunk_bytes)
        if isinstance(p, frames.ResList):
            return m.manifest_bytes + ANSWER_OVERHEAD * (len(m.local) // ENTRIES_PER_ITEM + 1)
        return None

    def _hold_until_loaded(self, key: str, sender: str, p: frames.Payload) -> bool:
        """Items that wait for an instance's first scan are held in the sender's account."""
        size = ANSWER_OVERHEAD + len(getattr(p, "data", b""))
        if isinstance(p, frames.ResHave):
            size += sum(entry_cost(e) for e in p.entries)
        if not self.host.holdings.take(sender, size):
            self.host.refused(sender, "peer_bytes", f"resource items for {printable(key)}")
            return False
        held = self._preload.setdefault(key, {})
        held[sender] = held.get(sender, 0) + size
        return True

    def _release_loaded(self) -> None:
        for key in [k for k, r in self.files.items() if r.loaded and k in self._preload]:
            for peer, size in self._preload.pop(key).items():
                self.host.holdings.give(peer, size)

    def forget_peer(self, node: str) -> None:
        """A node removed from [peers]: its manifests, and what they held here, go."""
        for r in self.files.values():
            r.machine.forget_peer(node)
        for held in self._preload.values():
            size = held.pop(node, 0)
            self.host.holdings.give(node, size)

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
        self._release_loaded()
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
            r.machine.bounds.max_files = config.limits.max_resource_files
            r.machine.serve_max = config.fetch_window_bytes
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
