"""The status document of a host (`syncd status`, the metrics, the status page): every file's
status and what the host's parts hold, read from them; nothing here decides anything."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from syncd.config import Config
from syncd.core.budget import Budgets, Holdings
from syncd.core.oslimits import shortfalls
from syncd.core.telemetry import Telemetry
from syncd.core.unsafe import UnsafePaths
from syncd.daemon import logfollow
from syncd.daemon.filetask import FileTask
from syncd.daemon.freespace import FreeSpace
from syncd.daemon.gate import FrameGate
from syncd.daemon.instances import Instances
from syncd.daemon.outbound import Outbound
from syncd.daemon.presence import Presence
from syncd.daemon.resourcehub import ResourceHub
from syncd.daemon.window import CommitGate
from syncd.disk import oslimits
from syncd.disk.watcher import Watcher
from syncd.net.link import Link

STATUS_SLICE = 0.004  # seconds of building a status before the loop gets a turn


class StatusHost(Protocol):
    node: str
    config: Config
    started: float
    link: Link
    telemetry: Telemetry
    budgets: Budgets
    holdings: Holdings
    unsafe: UnsafePaths
    resources: ResourceHub
    heard: Presence
    outbound: Outbound
    gate: FrameGate
    instances: Instances
    free_space: FreeSpace
    commits: CommitGate[FileTask]
    watcher: Watcher

    def connected_since(self) -> float | None: ...


def limit_warnings(host: StatusHost) -> list[str]:
    """The kernel's limits that the roots need more of (core/oslimits.py)."""
    if not host.config.watch:
        return []
    w = host.watcher
    found = shortfalls(oslimits.inotify_limits(), w.needed, w.unwatched)
    return [*found, w.no_instance] if w.no_instance else found


def os_limits(host: StatusHost) -> dict[str, Any]:
    """What status and the metrics show of the kernel's limits at scale (core/oslimits.py):
    inotify's watches and instances, and this process's file descriptors."""
    limits = oslimits.inotify_limits()
    open_now, soft, hard = oslimits.open_files()
    w = host.watcher
    watch = host.config.watch
    return {
        "inotify": {
            "enabled": watch and w.active,
            "watches": w.watched,  # directories under watch
            "watches_needed": w.needed if watch else 0,  # one per directory
            "max_user_watches": limits.max_user_watches,
            "max_user_instances": limits.max_user_instances,
            "warnings": limit_warnings(host),
        },
        "open_files": {"open": open_now, "limit": soft, "hard_limit": hard},
    }


def status(host: StatusHost, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The status document, built at once (metrics; tests); with `wanted`, of the files of
    the keys it accepts only (each file's status is the costly part: ~0.3 ms, a second at
    3000 files)."""
    return _status_of(host, [_file_status(host, r) for (key, _), r
                             in sorted(host.instances.tasks.items())
                             if wanted is None or wanted(key)])


async def status_sliced(host: StatusHost, wanted: Callable[[str], bool] | None = None
                        ) -> tuple[dict[str, Any], float]:
    """The same as status(), built STATUS_SLICE seconds of work at a time, the loop free
    in between (with a thousand keys the whole document costs ~150 ms of CPU); and the
    seconds the building itself took (the slices, not what ran between them)."""
    files = []
    spent = 0.0
    started = time.monotonic()
    for (key, _), r in sorted(host.instances.tasks.items()):
        if wanted is not None and not wanted(key):
            continue
        files.append(_file_status(host, r))
        now = time.monotonic()
        if now - started >= STATUS_SLICE:
            spent += now - started
            await asyncio.sleep(0)
            started = time.monotonic()
    document = _status_of(host, files)
    return document, spent + time.monotonic() - started


def _file_status(host: StatusHost, r: FileTask) -> dict[str, Any]:
    f = r.status()
    now = time.monotonic()
    telemetry = host.telemetry
    peers: dict[str, dict[str, Any]] = f["peers"]  # type: ignore[assignment]
    for p in peers.values():
        p["lag_seconds"] = round(telemetry.lag_seconds(
            r.key, r.file, p["size"], f["size"], now), 3)  # type: ignore[arg-type]
    telemetry.prune(r.key, r.file, min((p["size"] for p in peers.values()), default=0))
    return f


def _status_of(host: StatusHost, files: list[dict[str, Any]]) -> dict[str, Any]:
    skipped = host.instances.skipped_status()
    ready = sum(1 for f in files if f["ready"])
    link = host.link
    return {
        "node": host.node,
        "broker": link.broker,  # the one in use (connected, or being tried)
        "brokers": link.brokers,  # every broker listed, in order
        "broker_switches": link.switches,
        "connected": link.connected.is_set(),
        "connected_since": host.connected_since(),
        "queued_bytes": link.queued,  # published, not yet acknowledged by the broker
        "publishes_dropped": link.dropped,  # over [mqtt] max_queued_bytes
        "peers": host.heard.status(),
        "restatements": {"asked": host.outbound.asks, "made": host.outbound.restatements},
        # Local changes read and shipped, and how many joined a commit (window.py).
        "group_commit": host.commits.status(),
        "ready_count": {"yes": ready, "no": len(files) - ready},
        "rejected_frames": host.gate.rejected,
        "sealed_not_for_us": host.gate.not_for_us,
        "peer_budgets": host.budgets.status(),
        "peer_limits": _limits_status(host),
        "uptime_s": round(time.time() - host.started, 1),
        "files": files,
        "resources": host.resources.status(),
        # Entries below the roots refused as links, devices, ... (syncd/core/unsafe.py).
        "unsafe_paths": host.unsafe.status(),
        # Directories that would be instances but cannot be replicated: `syncd status`
        # shows each as state "error" with its reason.
        "skipped": skipped,
        **os_limits(host),
    }


def _limits_status(host: StatusHost) -> dict[str, Any]:
    """What the bounds of docs/peer-limits.md hold and refused (status `peer_limits`)."""
    lim = host.config.limits
    return {
        **host.instances.limits_status(),
        "remote_growth": host.free_space.status(lim.min_free_bytes),
        "refused": host.telemetry.refusals(),
        "held": host.holdings.status(),
        "max_peer_bytes": lim.max_peer_bytes,
        "unfinished_lines": logfollow.HELD.status(),  # the log checks' pool (logfollow.py)
    }
