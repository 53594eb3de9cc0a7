"""The instances replicated here, and their file tasks: found on disk by disk/discovery.py (the
sweep, and at once on a watcher hint about a path that is not a known file), or made on a
writer's word (its bytes or position) within the bounds of a new key (keyspace.py,
docs/peer-limits.md). Every key becomes a path through Config.key_dir only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from syncd.config import Config
from syncd.core.keyspace import KeySpace
from syncd.core.names import printable
from syncd.core.roots import KeyPathError
from syncd.core.telemetry import Telemetry
from syncd.daemon import logoutput
from syncd.daemon.filetask import FileTask, HostServices
from syncd.daemon.resourcehub import ResourceHub
from syncd.disk import tree
from syncd.disk.discovery import Scanner, Skipped

log = logging.getLogger("syncd.node")

REFUSED_SHOWN = 100  # keys refused (a peer's may be many): status and log name this many


class InstancesHost(HostServices, Protocol):
    """The host, as the instances see it: what a file task needs, and a few more."""

    config: Config
    telemetry: Telemetry
    resources: ResourceHub

    def refused(self, peer: str, reason: str, what: str, n: int = 1) -> None:
        """Count (and log, at most once a minute per peer and reason) refused items."""


class Instances:
    def __init__(self, host: InstancesHost) -> None:
        self.host = host
        self.tasks: dict[tuple[str, str], FileTask] = {}
        self.by_path: dict[str, FileTask] = {}  # str(task.path) -> task, for hints
        self.keyspace = KeySpace()  # the keys replicated here (keyspace.py)
        self.made_by: dict[str, str] = {}  # key -> the peer whose word made it here
        self.refusals: dict[str, str] = {}  # key -> why it cannot be replicated here
        self.scanner = _new_scanner(host.config)
        self.skipped: list[Skipped] = []  # directories found that cannot be replicated
        self._skips_logged: set[tuple[str, str]] = set()
        self._discover_pending = False
        self._chores: set[asyncio.Task[None]] = set()  # referenced until done (asyncio docs)

    def task(self, key: str, file: str, peer: str | None = None) -> FileTask | None:
        """The file task of (key, file), made if the config wants it. `peer`: made on that
        peer's word (its bytes or position), so within the bounds of a new key."""
        r = self.tasks.get((key, file))
        if r is None:
            config = self.host.config
            if not config.wants_key(key) or file not in config.files_of(key):
                return None
            try:
                root, parts = config.roots.locate(key)
            except KeyPathError as e:
                self.refuse(key, e.reason)
                return None
            spot = root.spot_of(parts)
            linked = tree.linked_component(spot)
            if linked is not None:
                # A key must be a directory of its own under its root, not a way out of it
                # (and every open goes through its levels again: disk/tree.py).
                self.refuse(key, f"{printable(str(linked))} is a symbolic link (not followed)")
                return None
            if peer is not None and key not in self.keyspace:
                refusal = self._new_key_refusal(key, root.path, parts)
                if refusal is not None:
                    reason, why = refusal
                    if reason == "keys":  # who took them: the operator's first question
                        made = Counter(self.made_by.values()).most_common(3)
                        why += "; made on peers' word: " + (", ".join(
                            f"{n} by {p}" for p, n in made) or "none")
                    self.refuse(key, f"announced by {peer}: {why}")
                    self.host.refused(peer, reason, f"new keys ({printable(key)}: {why})")
                    return None
                self.made_by[key] = peer
            r = FileTask(self.host, key, file, spot / file)
            if key in self.made_by:
                # Its bytes are a peer's: the partial block's bytes (up to 64 KiB a key, on
                # that peer's word) are not kept, as after a restart (core/ledger.py).
                r.machine.keep_tails = False
            self.tasks[(key, file)] = r
            self.by_path[str(r.path)] = r
            self.keyspace.add(key)
            self.refusals.pop(key, None)  # refused before (a full disk): no longer
            # The task inherits this context: its log lines carry key and file as fields
            # (JSON logs) without every call passing them.
            token = logoutput.FIELDS.set({"key": key, "file": file})
            try:
                r.start()
            finally:
                logoutput.FIELDS.reset(token)
            self.host.resources.ensure(key, if_present=True)
            chore = asyncio.get_running_loop().create_task(self._after_load(r))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)
        return r

    async def _after_load(self, r: FileTask) -> None:
        await r.loaded.wait()
        self.host.telemetry.baseline(r.key, r.file, r.machine.position.size)
        # Divergences recorded before a restart may name a node removed from [peers] since.
        for node in set(r.machine.peers) | set(r.machine.diverged):
            if node not in self.host.config.peers:
                r.forget_peer(node)

    def _new_key_refusal(self, key: str, root: Path,
                         parts: tuple[str, ...]) -> tuple[str, str] | None:
        """(reason, why) a peer may not make `key` here now; None: it may (keyspace.py)."""
        config = self.host.config
        refusal = self.keyspace.refusal(key, config.limits.max_keys)
        if refusal is not None:
            return refusal
        # An instance on disk that discovery has not listed yet (made a moment ago, or one
        # that include/exclude leave out): a directory above the key holding a log file.
        for depth in range(1, len(parts)):
            above = root.joinpath(*parts[:depth])
            for name in config.all_files():
                with contextlib.suppress(OSError):
                    if os.lstat(above / name):
                        return "nested", f"inside the instance {printable(str(above))}"
        why = self.host.growth_problem(key)
        if why is not None:
            return "disk_low", why
        return None

    def is_instance(self, key: str) -> bool:
        return key in self.keyspace

    def instance_for(self, key: str, peer: str) -> bool:
        """Whether `key` is an instance here, made on `peer`'s word (a writer's resource
        files) within the bounds of a new key: the file tasks of its files come first."""
        if key in self.keyspace:
            return True
        config = self.host.config
        if not config.may_write(key, peer):
            return False
        for file in config.files_of(key):
            if self.task(key, file, peer) is None:
                return False
        return key in self.keyspace

    def refuse(self, key: str, reason: str) -> None:
        """A key this host was asked to replicate (found here, or a peer's) that it cannot:
        logged once, and listed by status (the first REFUSED_SHOWN of them)."""
        if key not in self.refusals and len(self.refusals) < REFUSED_SHOWN:
            self.refusals[key] = reason
            log.error("key %s is not replicated: %s", printable(key), reason)

    def drop(self, r: FileTask) -> None:
        """Forget a stopped file task (a reload): its key too once it has no file left."""
        del self.tasks[(r.key, r.file)]
        self.by_path.pop(str(r.path), None)
        if not any(k == r.key for k, _ in self.tasks):
            self.keyspace.discard(r.key)
            self.made_by.pop(r.key, None)

    def rescan(self, config: Config) -> None:
        """A new config (a reload): what was refused may not be now, and every directory is
        listed again."""
        self.refusals.clear()
        self.scanner = _new_scanner(config)
        self.discover(force=True)

    def discover(self, force: bool = False) -> None:
        """Find new instances (the sweep calls this every second: directories that did not
        change since the last scan are not listed again, see disk/discovery.py)."""
        scan = self.scanner.scan()
        self.skipped = scan.skipped
        for s in scan.skipped:
            if (str(s.folder), s.reason) not in self._skips_logged:
                self._skips_logged.add((str(s.folder), s.reason))
                log.error("%s: key %s is not replicated: %s", printable(str(s.folder)),
                          s.key or "-", s.reason)
        if not scan.changed and not force:
            return
        config = self.host.config
        for found in scan.instances:
            if config.wants_key(found.key):
                for file in config.files_of(found.key):
                    self.task(found.key, file)

    def discover_soon(self) -> None:
        """Discover at the next turn of the loop: a burst of hints costs one scan."""
        if not self._discover_pending:
            self._discover_pending = True
            asyncio.get_running_loop().call_soon(self._discover_hinted)

    def _discover_hinted(self) -> None:
        self._discover_pending = False
        self.discover()

    def skipped_status(self) -> list[dict[str, Any]]:
        """Status `skipped`: directories found that cannot be replicated, then keys refused."""
        skipped = [s.to_json() for s in self.skipped]
        return skipped + [{"key": printable(k), "path": None, "reason": why}
                          for k, why in sorted(self.refusals.items())]

    def limits_status(self) -> dict[str, Any]:
        """The keys part of status `peer_limits`."""
        return {"keys": len(self.keyspace), "max_keys": self.host.config.limits.max_keys,
                "keys_made_by": dict(sorted(Counter(self.made_by.values()).items()))}


def _new_scanner(config: Config) -> Scanner:
    return Scanner(config.roots, config.files_of, config.all_files())
