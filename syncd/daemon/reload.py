"""A re-read config applied to a running host (SIGHUP, `syncd reload`): new and removed keys,
file lists, roles, peers, tuning. Identity and wiring (node, directories, broker) need a
restart; they are kept as they were, and the reply says so."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from syncd.config import Config, ConfigError, load_config
from syncd.core.budget import Budgets, Holdings
from syncd.core.filemachine import Tuning
from syncd.daemon.filetask import FileTask
from syncd.daemon.freespace import FreeSpace
from syncd.daemon.instances import Instances
from syncd.daemon.outbound import Outbound
from syncd.daemon.resourcehub import ResourceHub
from syncd.daemon.window import CommitGate
from syncd.net.link import Link

log = logging.getLogger("syncd.node")

# What a reload cannot change (a restart can).
FIXED = ("node", "roots", "state_dir", "mqtt", "identity_file")


class ReloadHost(Protocol):
    config: Config
    link: Link
    outbound: Outbound
    commits: CommitGate[FileTask]
    budgets: Budgets
    holdings: Holdings
    free_space: FreeSpace
    instances: Instances
    resources: ResourceHub

    def tuning(self) -> Tuning: ...

    def unlist(self, node: str) -> None:
        """A node removed from [peers]: dropped from presence, every file and the metrics."""


async def from_source(host: ReloadHost, expected: str | None = None) -> dict[str, Any]:
    """Re-read the config file we started from and apply it (SIGHUP, `syncd reload`).

    A file that does not load changes nothing; the reply says why, for `syncd reload` to
    show (systemctl reload then fails) and the log too (a bare SIGHUP has nobody to tell).
    `expected`: the file the caller checked; another one is refused, not reloaded.
    """
    source = host.config.source
    assert source is not None
    if expected is not None and not _same_file(expected, source):
        return {"ok": False, "config": str(source),
                "error": f"this daemon runs {source}, not {expected}"}
    try:
        config = load_config(source)
    except ConfigError as e:
        log.error("reload refused, keeping the running configuration: %s", e)
        return {"ok": False, "error": f"config error: {e}", "config": str(source)}
    needs_restart = await apply(host, config)
    return {"ok": True, "config": str(source), "files": len(host.instances.tasks),
            "needs_restart": needs_restart}


async def apply(host: ReloadHost, config: Config) -> list[str]:
    """Apply a re-read config; returns the names of the settings that need a restart."""
    changed = [name for name in FIXED if getattr(config, name) != getattr(host.config, name)]
    if changed:
        log.warning("reload: %s changed; that takes a restart (keeping the running values)",
                    ", ".join(changed))
        config = dataclasses.replace(config, **{n: getattr(host.config, n) for n in FIXED})
    removed = set(host.config.peers) - set(config.peers)
    peers_changed = config.peers.keys() != host.config.peers.keys()
    host.config = config
    for node in sorted(removed):
        host.unlist(node)
    if peers_changed:
        await host.link.resubscribe()
    host.outbound.outbox.limit = config.chunk_bytes
    host.commits.window = config.batch_window
    host.commits.flush()
    host.budgets.configure(config.limits)
    host.holdings.limit = config.limits.max_peer_bytes
    host.free_space.look_soon()  # a new floor: look again at the next sweep
    instances = host.instances
    for (key, file), r in list(instances.tasks.items()):
        if not config.wants_key(key) or file not in config.files_of(key):
            await r.stop()
            host.commits.forget(r)
            instances.drop(r)
            host.outbound.clear_position(key, file)  # under hide_names, nobody else can
            log.info("reload: %s is no longer replicated", r.name)
        else:
            r.retune(host.tuning())
            if r.machine.role != config.role_of(key):
                log.info("reload: %s role %s -> %s", r.name, r.machine.role,
                         config.role_of(key))
                r.set_role(config.role_of(key))
    host.resources.configure(config)
    before = len(instances.tasks)
    instances.rescan(config)
    log.info("reload: configuration applied (%d files, %d new)", len(instances.tasks),
             len(instances.tasks) - before)
    return changed


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
