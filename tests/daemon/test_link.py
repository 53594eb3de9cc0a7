"""The MQTT link against a real Mosquitto: a stalled broker cannot grow the writer's memory
(publishes past [mqtt] max_queued_bytes are dropped and counted), and what was dropped
reaches the standby once the broker moves again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from syncd.config import parse_config
from syncd.net.link import Link, Session
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, wait_equal
from tests.support.ishiki import ishiki_lines

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


def test_a_frame_published_while_a_message_is_handled_leaves_and_the_loop_runs_on(
    tmp_path: Path, broker: Broker
) -> None:
    """Chaos found a writer hung for good: paho runs on_message holding a lock that is not
    reentrant, and a QoS 0 publish made there (positions re-announced when a peer comes
    online) was written at once, whole, and took the lock again. Publishes made while a
    message is handled leave when the read is over."""
    config = parse_config({"node": "a", "runtimes_dir": str(tmp_path), "state_dir":
                           str(tmp_path), "mqtt": {"host": "127.0.0.1", "port": broker.port,
                                                   "topic_prefix": "t"}}, tmp_path / "c.toml")
    # Both on topics the link subscribes to: the echo comes back to it.
    ping, echo = "t/a/ping", "t/a/echo"

    async def main() -> list[str]:
        seen: list[str] = []
        echoed = asyncio.Event()

        def on_message(topic: str, payload: bytes) -> None:
            seen.append(topic)
            if topic == ping:
                assert link.publish(echo, b"pong" * 100, qos=0)
            elif topic == echo:
                echoed.set()

        async def on_connected() -> None:
            link.publish(ping, b"ping", qos=1)

        link = Link(config, on_message, on_connected, lambda topic, online, conn: b"presence",
                    lambda: ["t/a/+"])
        running = asyncio.create_task(link.run())
        try:
            await asyncio.wait_for(echoed.wait(), 20)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await link.close()
        return seen

    # In a thread of its own: a hung loop fails the test instead of hanging the suite.
    result: list[list[str]] = []
    worker = threading.Thread(target=lambda: result.append(asyncio.run(main())), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the event loop hung handling a message"
    assert result and result[0].count(ping) == 1 and result[0].count(echo) == 1


def test_a_cancel_that_comes_as_the_connection_is_made_is_not_lost(
    tmp_path: Path, broker: Broker
) -> None:
    """Chaos found a daemon that ignored SIGTERM for good: the signal came during a reconnect,
    and asyncio.wait_for (Python 3.11) returns its future's result when a cancel arrives
    together with it, so the link went on connecting while the shutdown waited for it.
    Here the thread that opens the connection asks for the cancel just before it returns."""
    config = parse_config({"node": "a", "runtimes_dir": str(tmp_path), "state_dir":
                           str(tmp_path), "mqtt": {"host": "127.0.0.1", "port": broker.port,
                                                   "topic_prefix": "t"}}, tmp_path / "c.toml")

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        session = Session(config, config.mqtt.endpoints[0], ("t/n/a", b"offline"),
                          lambda topic, payload: None, LIMIT)
        opening: asyncio.Task[None] | None = None

        class CancelAsItReturns(ThreadPoolExecutor):
            def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
                def run() -> Any:
                    result = fn(*args, **kwargs)
                    assert opening is not None
                    loop.call_soon_threadsafe(opening.cancel)  # queued before the result
                    return result
                return super().submit(run)

        loop.set_default_executor(CancelAsItReturns(1))
        opening = asyncio.create_task(session.open())
        try:
            await opening
        except asyncio.CancelledError:
            return True
        finally:
            session.abort()
        return False

    assert asyncio.run(main()), "the cancel was swallowed: the session opened anyway"
