"""RabbitMQ's MQTT plugin, a broker known not to carry syncd: why, and that check-config says so."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import nats, rabbitmq
from tests.support.cluster import Daemon

pytestmark = pytest.mark.skipif(
    not rabbitmq.installed(),
    reason="rabbitmq-server (with its MQTT plugin) is not installed; tests/run.sh does not "
           "install it (a broker syncd does not support): apt-get install rabbitmq-server")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rabbitmq.RabbitMQ]:
    with rabbitmq.RabbitMQ(tmp_path_factory.mktemp("rabbitmq")) as b:
        yield b


def wildcard_delivers(port: int, topic_filter: str, topic: str) -> bool:
    """Whether a fresh subscription to `topic_filter` is sent the message retained on `topic`."""
    arrived = threading.Event()
    c = nats.client(port)
    try:
        c.on_message = lambda c, u, m: m.retain and m.topic == topic and arrived.set()
        c.subscribe(topic_filter, qos=1)
        return arrived.wait(2.0)  # a retained message comes right after the SUBACK, or never
    finally:
        c.disconnect()
        c.loop_stop()


def test_rabbitmq_keeps_retained_messages_but_not_for_wildcard_subscriptions(
    broker: rabbitmq.RabbitMQ,
) -> None:
    topic = "test/syncd/p/a/k/f"
    nats.publish(broker.mqtt_port, topic, b"position", retain=True)
    assert nats.retained(broker.mqtt_port, topic, 5.0, qos=1) == b"position"
    # What syncd subscribes to for a peer's positions (and P/n/+ for presence).
    assert not wildcard_delivers(broker.mqtt_port, "test/syncd/p/a/+/+", topic)
    nats.publish(broker.mqtt_port, topic, b"", retain=True)


def test_check_config_refuses_rabbitmq_and_says_why(tmp_path: Path,
                                                    broker: rabbitmq.RabbitMQ) -> None:
    d = Daemon(tmp_path, "a", None, brokers=[broker.endpoint])
    run = subprocess.run([sys.executable, "-m", "syncd", "check-config", "--broker",
                          "--timeout", "2", "--config", str(d.config)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "syncd: broker check failed: retained:" in run.stderr
    assert "sent it only to a subscription naming that topic, not to test/syncd/p/" in run.stderr
    assert "this broker cannot carry syncd (docs/brokers.md)" in run.stderr
