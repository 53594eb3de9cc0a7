"""The HTTP listener of `[metrics] listen`: Prometheus metrics, the status page, its JSON.

- `/metrics`: metric families made from one snapshot of `Host.status()` (the same document
  `syncd status --json` prints) and of the node's telemetry (`core/telemetry.py`: traffic by kind,
  refusals by reason, append → durable latency); the process collector adds CPU, memory and
  open files.
- `/`: the status page (statuspage.py), for a person: every file, its state and READY with
  the reasons, lag per peer, divergences, conflicts, the broker and the peers.
- `/status.json`: the status document itself, as `syncd status --json` prints it.

Every request reads one shared snapshot (`SnapshotCache`), taken on the event loop at most
once a second whatever the number of requests: a page left open in a few browsers, and two
Prometheus servers scraping, cost the daemon one status per second at most. Off unless
configured; the example binds loopback only (no authentication).
"""

from __future__ import annotations

import asyncio
import ipaddress
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from syncd import __version__
from syncd.core.safe_text import safe
from syncd.core.telemetry import REJECT_REASONS
from syncd.ops import statuspage

if TYPE_CHECKING:
    from syncd.daemon.host import Host

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
    commit = status.get("group_commit", {})
    reads = CounterMetricFamily("syncd_local_reads", "commits of local changes started: one "
                                "read, ship and sync of one file each (group commit)")
    reads.add_metric([], commit.get("reads", 0))
    joined = CounterMetricFamily("syncd_local_changes_joined", "local change notices that "
                                 "joined the next commit of a file instead of one of their own")
    joined.add_metric([], commit.get("joined", 0))
    online = GaugeMetricFamily("syncd_peer_online", "1 while a peer is online", labels=["peer"])
    wire = GaugeMetricFamily("syncd_peer_wire_version", "the wire version of this host's "
                             "frames for a peer (the highest both speak; 0: none)",
                             labels=["peer"])
    for peer, p in status["peers"].items():
        online.add_metric([peer], 1 if p["online"] else 0)
        wire.add_metric([peer], p.get("wire_version") or 0)
    not_for_us = CounterMetricFamily(
        "syncd_sealed_not_for_us", "sealed frames this run of ours was not among the "
        "recipients of (around restarts and joins; not a rejection)")
    not_for_us.add_metric([], status.get("sealed_not_for_us", 0))
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
    skipped_paths = GaugeMetricFamily(
        "syncd_resource_skipped_paths", "entries under an instance's resources/ its last scan "
        "did not follow or read (links, devices, unreadable or too deep directories)",
        labels=["key"])
    for r in res:
        conflicts.add_metric([r["key"]], len(r["conflicts"]))
        res_files.add_metric([r["key"]], r["files"])
        skipped_paths.add_metric([r["key"]], r.get("skipped_paths_count", 0))
    unsafe = CounterMetricFamily(
        "syncd_unsafe_paths", "entries below the roots refused, never followed, by kind "
        "(each path counted once; syncd status lists the latest)", labels=["kind"])
    for kind, n in status.get("unsafe_paths", {}).get("by_kind", {}).items():
        unsafe.add_metric([kind], n)
    for f in status.get("files", []):
        missing.add_metric([f["key"], f["file"]], f.get("missing_resources", 0))
    limits = os_limits(status)
    build = GaugeMetricFamily("syncd_build_info", "always 1; the labels say what runs",
                              labels=["version", "python"])
    build.add_metric([__version__, platform.python_version()], 1)
    return [build, connected, reconnects, info, switches, queued, dropped, rejected, reads,
            joined, online, wire, not_for_us,
            by_state, diverged, unreplicated, size, ready, behind, lag, lag_s, requests,
            stopped, keys, held,
            conflicts, missing, res_files, skipped_paths, unsafe, *counters.values(), *limits,
            *traffic(status.get("telemetry", {}))]


def os_limits(status: Status) -> list[Metric]:
    """The kernel's limits met at scale (core/oslimits.py): inotify's, as status has them. The
    file descriptors are process_open_fds and process_max_fds (LimitNOFILE=)."""
    inotify = status.get("inotify")
    if inotify is None:
        return []
    held = GaugeMetricFamily("syncd_inotify_watches", "directories under an inotify watch")
    held.add_metric([], inotify["watches"])
    needed = GaugeMetricFamily(
        "syncd_inotify_watches_needed",
        "directories under the runtimes roots, one inotify watch each (0 with watch = false)")
    needed.add_metric([], inotify["watches_needed"])
    found: list[Metric] = [held, needed]
    for name, what in (("max_user_watches", "fs.inotify.max_user_watches in force"),
                       ("max_user_instances", "fs.inotify.max_user_instances in force")):
        if inotify.get(name) is not None:  # absent when /proc/sys cannot be read
            family = GaugeMetricFamily(f"syncd_inotify_{name}", what)
            family.add_metric([], inotify[name])
            found.append(family)
    return found


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


def snapshot_from(node: Host, loop: asyncio.AbstractEventLoop) -> Callable[[], Status]:
    """A snapshot function for the HTTP thread: the status is taken on the event loop, where
    the replicas live, never read from another thread while they change."""

    async def take() -> Status:
        status, _ = await node.status_sliced()  # a slice at a time: the loop is not held
        return {**status, "reconnects": node.link.reconnects,
                "telemetry": node.telemetry.snapshot()}

    def snapshot() -> Status:
        return asyncio.run_coroutine_threadsafe(take(), loop).result(timeout=10)

    return snapshot


SNAPSHOT_MAX_AGE = 1.0  # seconds a status snapshot serves every request before a new one


class SnapshotCache:
    """The latest snapshot, taken again only once it is `max_age` seconds old; what is made
    from it (the page, the JSON) is made once per snapshot too. Thread-safe: the HTTP server
    answers each request in a thread of its own, and one takes the snapshot while the others
    wait for it."""

    def __init__(self, take: Callable[[], Status], max_age: float = SNAPSHOT_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._take = take
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._at = 0.0
        self._value: Status | None = None
        self._wall = 0.0
        self._made: dict[str, bytes] = {}
        self.taken = 0  # snapshots taken so far (for the tests)

    def get(self) -> Status:
        return self._current()[0]

    def made(self, what: str, make: Callable[[Status, float], bytes]) -> bytes:
        """`make(snapshot, wall_time)` for the current snapshot, made once per snapshot."""
        with self._lock:
            value, wall = self._fresh()
            if what not in self._made:
                self._made[what] = make(value, wall)
            return self._made[what]

    def _current(self) -> tuple[Status, float]:
        with self._lock:
            return self._fresh()

    def _fresh(self) -> tuple[Status, float]:
        if self._value is None or self._clock() - self._at >= self._max_age:
            self._value = self._take()
            self._at, self._wall = self._clock(), time.time()
            self._made = {}
            self.taken += 1
        return self._value, self._wall


def status_json(status: Status, now: float) -> bytes:
    """/status.json: the status document as `syncd status --json` prints it (the telemetry
    the metrics add is left out: /metrics has it)."""
    return orjson.dumps({k: v for k, v in status.items() if k != "telemetry"},
                        option=orjson.OPT_INDENT_2)


def status_page(status: Status, now: float) -> bytes:
    return statuspage.page(status, now).encode()


_JSON_HEADERS = (
    ("Content-Type", "application/json"),
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
)
_TEXT_HEADERS = (("Content-Type", "text/plain; charset=utf-8"),
                 ("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store"))

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def own_names(listen_host: str) -> frozenset[str]:
    """The names a request's Host may give for this machine besides an IP address."""
    host = socket.gethostname().lower()  # no DNS lookup: a broken resolver cannot slow it
    return frozenset({"localhost", "localhost.localdomain", host, host.split(".")[0],
                      listen_host.lower().strip("[]")})


def host_allowed(host: str | None, names: frozenset[str]) -> bool:
    """Whether a request's Host header names this machine: an IP address, or one of `names`.

    The page and its JSON hold the lines where copies diverge (a bot's memory). A web page an
    operator visits could make the browser fetch them from a loopback address through a
    name of its own that it re-points to 127.0.0.1 (DNS rebinding); the browser then sends
    that name as Host, which is refused here. Browsers always send Host; a client that does
    not (HTTP/1.0) is not a browser."""
    if not host:
        return True
    name = host.strip()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name.lower().rstrip(".") in names


def routes(cache: SnapshotCache, metrics_app: WSGIApp,
           names: frozenset[str] = frozenset({"localhost"})) -> WSGIApp:
    """The WSGI application: /metrics, / and /status.json; every other path is 404. The page
    and the JSON answer only a Host that names this machine (`host_allowed`)."""
    pages: dict[str, tuple[Callable[[Status, float], bytes], tuple[tuple[str, str], ...]]] = {
        "/": (status_page, statuspage.HEADERS),
        "/status.json": (status_json, _JSON_HEADERS),
    }

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path not in pages:
            return _answer(start_response, "404 Not Found", _TEXT_HEADERS,
                           b"not found: / is the status page, /status.json its data, "
                           b"/metrics the Prometheus metrics\n")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed",
                           (*_TEXT_HEADERS, ("Allow", "GET, HEAD")), b"read-only\n")
        host = environ.get("HTTP_HOST")
        if not host_allowed(host, names):
            return _answer(start_response, "403 Forbidden", _TEXT_HEADERS, (
                f"refused: Host {safe(host)[:100]!r} is neither an IP address nor a name of "
                "this machine (a defence against DNS rebinding); use http://127.0.0.1:PORT/ "
                "or this machine's host name (docs/status-page.md)\n").encode())
        make, headers = pages[path]
        try:
            body = cache.made(path, make)
        except Exception as e:  # the loop did not answer in time, or is stopping
            return _answer(start_response, "503 Service Unavailable", _TEXT_HEADERS,
                           f"syncd did not answer: {type(e).__name__} {e}\n".encode())
        return _answer(start_response, "200 OK", headers, b"" if method == "HEAD" else body,
                       len(body))

    return app


def _answer(start_response: Callable[..., Any], status: str,
            headers: Iterable[tuple[str, str]], body: bytes,
            length: int | None = None) -> list[bytes]:
    start_response(status, [*headers, ("Content-Length", str(len(body) if length is None
                                                              else length))])
    return [body]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request still being answered does not hold up the stop
    request_queue_size = 64  # socketserver's 5 drops a burst of connections (1 s SYN retry)


class _Handler(WSGIRequestHandler):
    timeout = 10  # seconds a client may take to send its request: a stalled one frees its thread

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request on stderr would fill the journal: nothing is logged


class Endpoint:
    """The HTTP server of `[metrics] listen` (see the module docstring), in its own threads."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], Status]) -> None:
        self.cache = SnapshotCache(snapshot)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatusCollector(self.cache.get))
        # CPU, memory, open files and start time; Python's version (Linux /proc only).
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        class Server(_Server):
            address_family = family  # IPv4 or IPv6, as the host is written

        self._server: WSGIServer = make_server(
            host, port, routes(self.cache, make_wsgi_app(registry), own_names(host)), Server,
            _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="syncd-http")
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
