"""`[mqtt] hide_names` end to end (issue #26): positions under keyed topic levels, so that the
broker, and any login on it subscribed to `#`, sees no instance key nor file name in any
topic; switching it on or off clears what the other form left retained."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from syncd.core import frames
from syncd.core.topicnames import names_secret
from tests.daemon.test_encryption import Sniffer
from tests.support.cluster import Broker, Daemon, node_identity, wait_until
from tests.support.files import append, content, wait_equal
from tests.support.ishiki import ishiki_lines

P = "test/syncd"
KEY, OTHER, FILE = "zebra-bot", "yak_herd/bot 7", "events.jsonl"
HIDE = "hide_names = true\n"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(node: str, broker: Broker, mqtt_extra: str = HIDE) -> Daemon:
        d = Daemon(tmp_path, node, broker, mqtt_extra=mqtt_extra)
        made.append(d)
        d.start()
        return d

    yield make
    for d in made:
        d.kill()


def retained(broker: Broker, topic_filter: str) -> dict[str, bytes]:
    """The retained messages under `topic_filter` now, as a host connecting now gets them
    (those before a probe of our own, which the broker sends after them)."""
    found: dict[str, bytes] = {}
    probe = f"test/probe/{secrets.token_hex(4)}"
    done = threading.Event()

    def on_message(_c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == probe:
            done.set()
        elif msg.retain and msg.payload:
            found[msg.topic] = bytes(msg.payload)

    def on_connect(c: mqtt.Client, *_: object) -> None:
        c.subscribe([(topic_filter, 1), (probe, 1)])

    def on_subscribe(c: mqtt.Client, *_: object) -> None:
        c.publish(probe, b"x", qos=1)

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"look-{secrets.token_hex(4)}")
    client.on_message, client.on_connect, client.on_subscribe = on_message, on_connect, \
        on_subscribe
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        assert done.wait(10), "the broker did not echo the probe"
    finally:
        client.loop_stop()
        client.disconnect()
    return found


def keyed(node: str, key: str = KEY, file: str = FILE) -> str:
    return frames.keyed_position_topic(P, node, names_secret(node_identity(node).key), key,
                                       file)


def took_every_keyed_position(d: Daemon) -> None:
    """No frame refused for its topic, seal or signature, or as malformed. (Under a heavy
    load, a restart may make a host refuse an earlier run's position, freshness.py: that is
    no matter of topic forms.)"""
    refused = [line for line in d.read_log().splitlines() if "rejected frame" in line]
    assert all("earlier run" in line or "replayed" in line for line in refused), refused
    assert d.status()["rejected_frames"] <= 3, refused


def test_with_hidden_names_no_topic_names_a_key_or_file_and_hosts_catch_up(
    broker: Broker, make: Callable[..., Daemon]
) -> None:
    sniffer = Sniffer(broker)
    try:
        wait_until(lambda: sniffer.client.is_connected(), 10, "the sniffer to connect")
        a, b, c = (make(n, broker) for n in "abc")
        append(a.path(KEY), ishiki_lines(20))
        append(a.path(OTHER), ishiki_lines(5))
        wait_equal(content(a.path(KEY)), b, c, key=KEY)
        wait_equal(content(a.path(OTHER)), b, c, key=OTHER)
        # A standby away while the writer writes catches up once back.
        b.stop()
        append(a.path(KEY), ishiki_lines(7))
        b.start()
        wait_equal(content(a.path(KEY)), b, c, key=KEY)
        # The writer restarted: a new run, the same keyed levels (the secret is its
        # identity's), so each file's retained position replaced itself.
        a.stop()
        a.start()
        append(a.path(KEY), ishiki_lines(3))
        wait_equal(content(a.path(KEY)), b, c, key=KEY)
        wait_until(lambda: set(retained(broker, f"{P}/p/a/+")) == {keyed("a"),
                                                                  keyed("a", OTHER)},
                   10, "a's two retained positions, under its keyed levels")
        assert retained(broker, f"{P}/p/+/+/+") == {}  # no host left a plain one
        seen = sniffer.seen()
    finally:
        sniffer.close()
    topics = {t for t, _ in seen}
    assert keyed("a") in topics and any(t.startswith(f"{P}/a/") for t in topics)
    names = [KEY, OTHER, FILE, "zebra", "yak", "events", *(frames.level(n) for n in (
        KEY, OTHER, FILE)), frames.level(OTHER)[:12]]
    leaks = sorted({(t, n) for t in topics for n in names if n in t})
    assert not leaks, f"topics naming a key or file: {leaks[:5]}"
    for d in (a, b, c):
        took_every_keyed_position(d)


def test_switching_hide_names_clears_the_other_forms_retained_positions(
    broker: Broker, make: Callable[..., Daemon]
) -> None:
    a, b = make("a", broker, mqtt_extra=""), make("b", broker, mqtt_extra="")
    append(a.path(KEY), ishiki_lines(10))
    append(a.path(OTHER), ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b, key=KEY)
    plain = {frames.position_topic(P, "a", k, FILE) for k in (KEY, OTHER)}
    wait_until(lambda: set(retained(broker, f"{P}/p/a/+/+")) == plain, 10,
               "a's plain retained positions")
    # On: the keyed positions replace the plain ones, which a clears at connect.
    a.stop()
    a.edit_config("reconnect_max = 0.5\n", "reconnect_max = 0.5\n" + HIDE)
    a.start()
    append(a.path(KEY), ishiki_lines(4))
    wait_equal(content(a.path(KEY)), b, key=KEY)
    wait_until(lambda: set(retained(broker, f"{P}/p/a/#")) == {keyed("a"), keyed("a", OTHER)},
               10, "only a's keyed retained positions")
    # A key no longer replicated (reload): its keyed position, which nobody else could find,
    # is cleared by a itself.
    a.edit_config("sweep_interval = 0.2\n", f'sweep_interval = 0.2\nexclude = ["{OTHER}"]\n')
    a.reload()
    wait_until(lambda: set(retained(broker, f"{P}/p/a/#")) == {keyed("a")}, 10,
               "the excluded key's keyed position cleared")
    # Off again: the plain one back, the keyed one cleared.
    a.stop()
    a.edit_config(HIDE, "")
    a.start()
    append(a.path(KEY), ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b, key=KEY)
    wait_until(lambda: set(retained(broker, f"{P}/p/a/#")) == {
        frames.position_topic(P, "a", KEY, FILE)}, 10, "only a's plain retained position")
    for d in (a, b):
        took_every_keyed_position(d)
