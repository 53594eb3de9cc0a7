"""Prometheus metrics (`[metrics] listen`), read from the daemon's status at scrape time.

A scrape takes one snapshot of `Node.status()` (the same document `syncd status --json`
prints) and of the node's telemetry (`telemetry.py`: traffic by kind, refusals by reason,
append → durable latency) on the event loop, and turns them into metric families; the
process collector adds CPU, memory and open files. Off unless configured; the example binds
loopback only.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from syncd import __version__
from syncd.core.telemetry import REJECT_REASONS

if TYPE_CHECKING:
    from syncd.daemon.node import Node

STATES = ("in_sync", "ahead", "behind", "alone", "verifying", "diverged", "reset", "paused",
          "error")
_COUNTERS = {
    "shipped": "this host's own new bytes sent live",
    "applied": "bytes received from peers and appended here",
    "served": "bytes sent to peers that asked for them",
}

Status = Mapping[str, Any]


def families(status: Status) -> list[Metric]:
    """Every metric for one status snapshot (pure: testable without a daemon)."""
    file_labels = ["key", "file"]
    connected = GaugeMetricFamily("syncd_broker_connected", "1 while the broker link is up")
    connected.add_metric([], 1 if status["connected"] else 0)
    reconnects = CounterMetricFamily("syncd_broker_reconnects", "failed or lost connections")
    reconnects.add_metric([], status.get("reconnects", 0))
    info = GaugeMetricFamily("syncd_broker_info", "always 1; the label names the broker in use "
                             "(connected, or being tried)", labels=["broker"])
    if status.get("broker"):
        info.add_metric([status["broker"]], 1)
    switches = CounterMetricFamily("syncd_broker_switches",
                                   "connections made to another broker than the one before")
    switches.add_metric([], status.get("broker_switches", 0))
    queued = GaugeMetricFamily("syncd_queued_bytes",
                               "published bytes the broker has not acknowledged yet")
    queued.add_metric([], status.get("queued_bytes", 0))
    dropped = CounterMetricFamily("syncd_publishes_dropped",
                                  "publishes dropped over [mqtt] max_queued_bytes")
    dropped.add_metric([], status.get("publishes_dropped", 0))
    rejected = CounterMetricFamily("syncd_rejected_frames", "malformed or unauthenticated frames")
    rejected.add_metric([], status["rejected_frames"])
    online = GaugeMetricFamily("syncd_peer_online", "1 while a peer is online", labels=["peer"])
    for peer, p in status["peers"].items():
        online.add_metric([peer], 1 if p["online"] else 0)
    by_state = GaugeMetricFamily("syncd_files", "replicated files by state", labels=["state"])
    diverged = GaugeMetricFamily("syncd_diverged_files",
                                 "files whose copy differs from a peer's (diverged) or was reset")
    size = GaugeMetricFamily("syncd_file_size_bytes", "bytes of this host's copy",
                             labels=file_labels)
    ready = GaugeMetricFamily("syncd_file_ready", "1 when this host could take over the file",
                              labels=file_labels)
    behind = GaugeMetricFamily("syncd_behind_bytes",
                               "bytes the most advanced consistent peer holds beyond ours",
                               labels=file_labels)
    lag = GaugeMetricFamily("syncd_peer_lag_bytes", "bytes of ours a peer does not hold yet",
                            labels=[*file_labels, "peer"])
    counters = {
        (what, unit): CounterMetricFamily(f"syncd_{what}_{unit}", f"{help} ({unit})",
                                          labels=file_labels)
        for what, help in _COUNTERS.items() for unit in ("bytes", "frames")
    }
    lag_s = GaugeMetricFamily("syncd_peer_lag_seconds",
                              "how long ago this host held the first byte a peer still lacks",
                              labels=[*file_labels, "peer"])
    files = status["files"]
    states = [f["state"] for f in files]
    # Every known state, even at 0 (alerts need the series), and any newer one as it appears.
    for state in [*STATES, *sorted(set(states) - set(STATES))]:
        by_state.add_metric([state], states.count(state))
    diverged.add_metric([], states.count("diverged") + states.count("reset"))
    for f in files:
        labels = [f["key"], f["file"]]
        size.add_metric(labels, f["size"])
        ready.add_metric(labels, 1 if f["ready"] else 0)
        consistent = [p["size"] for n, p in f["peers"].items() if n not in f.get("diverged", {})]
        behind.add_metric(labels, max([0, *(s - f["size"] for s in consistent)]))
        for peer, p in f["peers"].items():
            lag.add_metric([*labels, peer], p["lag_bytes"])
            lag_s.add_metric([*labels, peer], p.get("lag_seconds", 0.0))
        for (what, unit), family in counters.items():
            if f"{what}_{unit}" in f:
                family.add_metric(labels, f[f"{what}_{unit}"])
    unreplicated = GaugeMetricFamily(
        "syncd_unreplicated_directories",
        "directories that would be instances but cannot be replicated (syncd status says why)")
    unreplicated.add_metric([], len(status.get("skipped", [])))
    requests = CounterMetricFamily(
        "syncd_peer_requests", "peers' requests for bytes: served, or dropped over the peer's "
        "budget ([limits])", labels=["peer", "outcome"])
    for peer, b in status.get("peer_budgets", {}).items():
        requests.add_metric([peer, "served"], b["served_requests"])
        requests.add_metric([peer, "dropped"], b["dropped_requests"])
    limits = status.get("peer_limits", {})
    growth = limits.get("remote_growth", {})
    stopped = GaugeMetricFamily(
        "syncd_remote_growth_stopped", "1 while no peer's bytes are written here: free space "
        "below [limits] min_free_bytes")
    stopped.add_metric([], 1 if growth.get("stopped") else 0)
    keys = GaugeMetricFamily("syncd_keys", "instance keys replicated here ([limits] max_keys "
                             "bounds what peers may add)")
    keys.add_metric([], limits.get("keys", 0))
    held = GaugeMetricFamily("syncd_peer_held_bytes", "memory a peer's frames hold here "
                             "(estimated; [limits] max_peer_bytes)", labels=["peer"])
    for peer, h in limits.get("held", {}).items():
        held.add_metric([peer], h["held_bytes"])
    res = status.get("resources", [])
    conflicts = GaugeMetricFamily(
        "syncd_resource_conflicts", "write-once resource files whose bytes differ from a peer's "
        "copy (frozen, shown in status)", labels=["key"])
    missing = GaugeMetricFamily(
        "syncd_missing_resources", "resource files the log references that this host lacks",
        labels=["key", "file"])
    res_files = GaugeMetricFamily("syncd_resource_files", "complete resource files held",
                                  labels=["key"])
    for r in res:
        conflicts.add_metric([r["key"]], len(r["conflicts"]))
        res_files.add_metric([r["key"]], r["files"])
    for f in status.get("files", []):
        missing.add_metric([f["key"], f["file"]], f.get("missing_resources", 0))
    build = GaugeMetricFamily("syncd_build_info", "always 1; the labels say what runs",
                              labels=["version", "python"])
    build.add_metric([__version__, platform.python_version()], 1)
    return [build, connected, reconnects, info, switches, queued, dropped, rejected, online,
            by_state, diverged, unreplicated, size, ready, behind, lag, lag_s, requests,
            stopped, keys, held,
            conflicts, missing, res_files, *counters.values(),
            *traffic(status.get("telemetry", {}))]


def traffic(t: Mapping[str, Any]) -> list[Metric]:
    """Frames and bytes by kind and direction, refusals by reason, append → durable latency."""
    frames = CounterMetricFamily("syncd_frames", "frames sent and received, by kind",
                                 labels=["direction", "kind"])
    for direction, kind, n in t.get("frames", []):
        frames.add_metric([direction, kind], n)
    sizes = CounterMetricFamily("syncd_frame_bytes", "frame bytes sent and received, by kind",
                                labels=["direction", "kind"])
    for direction, kind, n in t.get("bytes", []):
        sizes.add_metric([direction, kind], n)
    rejected = CounterMetricFamily("syncd_rejected_frames_by_reason",
                                   "frames refused, and items of authentic frames refused at "
                                   "a bound (docs/peer-limits.md), by reason",
                                   labels=["reason"])
    counts = t.get("rejected", {})
    for reason in [*REJECT_REASONS, *sorted(set(counts) - set(REJECT_REASONS))]:
        rejected.add_metric([reason], counts.get(reason, 0))
    latency = HistogramMetricFamily(
        "syncd_append_to_durable_seconds",
        "from a peer's live frame stamp (its clock) to the bytes being durable here",
        labels=["peer"])
    for peer, h in t.get("latency", {}).items():
        latency.add_metric([peer], [(b, n) for b, n in h["buckets"]], h["sum"])
    return [frames, sizes, rejected, latency]


class StatusCollector(Collector):
    def __init__(self, snapshot: Callable[[], Status]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self._snapshot())


def snapshot_from(node: Node, loop: asyncio.AbstractEventLoop) -> Callable[[], Status]:
    """A snapshot function for the HTTP thread: the status is taken on the event loop, where
    the replicas live, never read from another thread while they change."""

    async def take() -> Status:
        return {**node.status(), "reconnects": node.link.reconnects,
                "telemetry": node.telemetry.snapshot()}

    def snapshot() -> Status:
        return asyncio.run_coroutine_threadsafe(take(), loop).result(timeout=10)

    return snapshot


class Endpoint:
    """The /metrics HTTP server (prometheus_client's, in its own thread)."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], Status]) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatusCollector(snapshot))
        # CPU, memory, open files and start time; Python's version (Linux /proc only).
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self._server, self._thread = start_http_server(port, host, registry)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
