"""The MQTT link against a real Mosquitto: a stalled broker cannot grow the writer's memory
(publishes past [mqtt] max_queued_bytes are dropped and counted), and what was dropped
reaches the standby once the broker moves again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.cluster import Broker, Daemon, wait_until
from tests.conftest import ishiki_lines
from tests.test_replication import KEY, append, wait_equal

LIMIT = 1 << 20  # the smallest max_queued_bytes allowed


def test_a_stalled_broker_bounds_the_outgoing_queue_and_nothing_is_lost(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    broker.start()
    mqtt = f"max_queued_bytes = {LIMIT}\n"
    a = Daemon(tmp_path, "a", broker, mqtt_extra=mqtt)
    b = Daemon(tmp_path, "b", broker, mqtt_extra=mqtt)
    try:
        a.start()
        b.start()
        first = ishiki_lines(20)
        append(a.path(KEY), first)
        wait_equal(first, a, b)
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGSTOP)  # the broker reads and acknowledges nothing
        try:
            line = ishiki_lines(1)
            chunk = line * (64 * 1024 // len(line) + 1)  # ~64 KiB per write
            written = 0
            while a.status()["publishes_dropped"] == 0:
                assert written < 64 * LIMIT, "nothing dropped: the outgoing queue is unbounded"
                append(a.path(KEY), chunk)
                written += len(chunk)
            queued = a.status()["queued_bytes"]
            assert 0 < queued <= LIMIT + 2 * len(chunk) + 4096, queued
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        # Dropped frames are fetched again: the standby ends with every byte.
        wait_equal(a.path(KEY).read_bytes(), a, b, timeout=30)
        wait_until(lambda: a.status()["queued_bytes"] == 0, 10, "a's queue to drain")
        assert "publishes_dropped" in a.status()
    finally:
        a.stop()
        b.stop()
        broker.stop()
