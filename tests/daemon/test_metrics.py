"""Prometheus endpoint: metric families from a status snapshot, and a real scrape."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from syncd import __version__
from syncd.ops.metrics import StatusCollector
from tests.support.cluster import Broker, Daemon, free_port, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def exposition(snapshot: Callable[[], dict[str, Any]]) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(snapshot))
    return parse(generate_latest(registry).decode())


def test_families_from_a_status_snapshot() -> None:
    peer = {"size": 100, "state": "ahead", "frozen": None, "online": True, "lag_bytes": 20}
    status = {
        "connected": True, "rejected_frames": 3, "reconnects": 2, "broker": "[::1]:1884",
        "brokers": ["mqtt-1:1883", "[::1]:1884"], "broker_switches": 1,
        "peers": {"b": {"online": True}, "c": {"online": False}},
        "files": [
            {"key": "bot-1", "file": "events.jsonl", "size": 120, "state": "ahead",
             "ready": True, "peers": {"b": peer}, "diverged": {}, "shipped_bytes": 120,
             "shipped_frames": 4, "applied_bytes": 0, "applied_frames": 0, "served_bytes": 7,
             "served_frames": 1},
            {"key": "bot-2", "file": "events.jsonl", "size": 50, "state": "diverged",
             "ready": False, "peers": {"c": {**peer, "size": 90, "lag_bytes": 0}},
             "diverged": {"c": {}}},
        ],
        "skipped": [{"key": "bad\\xff", "path": "/rt/bad\\xff", "reason": "not valid UTF-8"}],
        "resources": [{"key": "bot-1", "conflicts": [], "files": 2, "skipped_paths_count": 3}],
        "unsafe_paths": {"total": 4, "by_kind": {"symlink": 3, "unreadable": 1}},
    }
    s = exposition(lambda: status)
    one = (("file", "events.jsonl"), ("key", "bot-1"))
    two = (("file", "events.jsonl"), ("key", "bot-2"))
    assert s[("syncd_broker_connected", ())] == 1
    assert s[("syncd_broker_reconnects_total", ())] == 2
    assert s[("syncd_broker_info", (("broker", "[::1]:1884"),))] == 1
    assert [k for k in s if k[0] == "syncd_broker_info"] == [
        ("syncd_broker_info", (("broker", "[::1]:1884"),))]  # only the one in use
    assert s[("syncd_broker_switches_total", ())] == 1
    assert s[("syncd_rejected_frames_total", ())] == 3
    assert s[("syncd_peer_online", (("peer", "c"),))] == 0
    assert s[("syncd_files", (("state", "diverged"),))] == 1
    assert s[("syncd_files", (("state", "in_sync"),))] == 0
    assert s[("syncd_diverged_files", ())] == 1
    assert s[("syncd_unreplicated_directories", ())] == 1
    assert s[("syncd_resource_skipped_paths", (("key", "bot-1"),))] == 3
    assert s[("syncd_unsafe_paths_total", (("kind", "symlink"),))] == 3
    assert s[("syncd_unsafe_paths_total", (("kind", "unreadable"),))] == 1
    assert s[("syncd_shipped_bytes_total", one)] == 120
    assert s[("syncd_shipped_frames_total", one)] == 4
    assert s[("syncd_served_bytes_total", one)] == 7
    assert s[("syncd_peer_lag_bytes", (*one, ("peer", "b")))] == 20
    assert s[("syncd_file_ready", two)] == 0
    assert s[("syncd_behind_bytes", two)] == 0  # c holds more, but another history
    assert ("syncd_shipped_bytes_total", two) not in s  # no counters: no sample
    assert not [k for k in s if k[0].startswith("syncd_inotify")]  # an older snapshot


def test_inotify_gauges_from_a_status_snapshot() -> None:
    status = {"connected": True, "rejected_frames": 0, "peers": {}, "files": [],
              "inotify": {"enabled": True, "watches": 8192, "watches_needed": 12034,
                          "max_user_watches": 8192, "max_user_instances": None,
                          "warnings": ["fs.inotify.max_user_watches is 8192, ..."]},
              "open_files": {"open": 12, "limit": 65536, "hard_limit": 524288}}
    s = exposition(lambda: status)
    assert s[("syncd_inotify_watches", ())] == 8192
    assert s[("syncd_inotify_watches_needed", ())] == 12034
    assert s[("syncd_inotify_max_user_watches", ())] == 8192
    assert ("syncd_inotify_max_user_instances", ()) not in s  # unknown: no sample


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def test_scrape_a_running_daemon(tmp_path: Path, broker: Broker,
                                 make_daemon: Callable[..., Daemon]) -> None:
    port, port_b = free_port(), free_port()
    a = make_daemon("a", broker, extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    b = make_daemon("b", broker, extra=f'[metrics]\nlisten = "127.0.0.1:{port_b}"\n')
    append(a.path("bot-1"), ishiki_lines(40))
    wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
    labels = (("file", "events.jsonl"), ("key", "bot-1"))
    size = a.path("bot-1").stat().st_size

    def caught_up() -> Samples | None:
        s = scrape(port)
        return s if s[("syncd_peer_lag_bytes", (*labels, ("peer", "b")))] == 0 else None

    s = wait_until(caught_up, 10, "b's lag to reach 0 in a's metrics")
    assert s[("syncd_broker_connected", ())] == 1
    assert s[("syncd_broker_info", (("broker", f"127.0.0.1:{broker.port}"),))] == 1
    assert s[("syncd_broker_switches_total", ())] == 0
    assert s[("syncd_peer_online", (("peer", "b"),))] == 1
    # Live or on request, depending on whether b was listening when the bytes appeared.
    sent = s[("syncd_shipped_bytes_total", labels)] + s[("syncd_served_bytes_total", labels)]
    assert sent >= size
    assert s[("syncd_shipped_frames_total", labels)] + s[("syncd_served_frames_total", labels)]
    assert s[("syncd_file_size_bytes", labels)] == size
    assert s[("syncd_files", (("state", "in_sync"),))] == 1
    assert s[("syncd_rejected_frames_total", ())] == 0
    assert s[("syncd_peer_lag_seconds", (*labels, ("peer", "b")))] == 0
    assert s[("syncd_frames_total", (("direction", "sent"), ("kind", "pos")))] >= 1
    assert s[("syncd_rejected_frames_by_reason_total", (("reason", "auth"),))] == 0
    build = [k for k in s if k[0] == "syncd_build_info"]
    assert len(build) == 1 and ("version", __version__) in build[0][1]
    assert s[("process_resident_memory_bytes", ())] > 0
    # The standby saw live frames become durable: append → durable latency, per writer.
    append(a.path("bot-1"), ishiki_lines(5))
    wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
    sb = wait_until(lambda: (x := scrape(port_b))[
        ("syncd_append_to_durable_seconds_count", (("peer", "a"),))] >= 1 and x,
        10, "b to observe a's live frames becoming durable")
    assert sb[("syncd_append_to_durable_seconds_bucket", (("le", "+Inf"), ("peer", "a")))] >= 1
    assert sb[("syncd_frame_bytes_total", (("direction", "received"), ("kind", "live")))] > 0
    # b goes away: a's new bytes are missing there for longer and longer.
    b.stop()
    append(a.path("bot-1"), ishiki_lines(3))
    lagging = (*labels, ("peer", "b"))
    first = wait_until(lambda: (x := scrape(port))[("syncd_peer_lag_bytes", lagging)] > 0 and x,
                       10, "a to see b lag")
    wait_until(lambda: scrape(port)[("syncd_peer_lag_seconds", lagging)] >= (
        first[("syncd_peer_lag_seconds", lagging)] + 0.3), 10, "b's lag in seconds to grow")


def test_metrics_port_taken_stops_the_start(tmp_path: Path, broker: Broker) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = Daemon(tmp_path, "a", broker, extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        run = subprocess.run([sys.executable, "-m", "syncd", "run", "--config", str(d.config)],
                             capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert f"metrics.listen 127.0.0.1:{port}: Address already in use" in run.stderr
