"""`[mqtt] brokers`: parsing, the config's errors, and the rotation/backoff policy (pure)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from syncd.cli.status import render
from syncd.config import ConfigError, load_config
from syncd.core.brokers import Broker, BrokerSyntaxError, Rotation, parse_broker, parse_brokers
from syncd.net.link import LinkError, _check_granted
from tests.daemon.test_config import GOOD, write
from tests.support import cluster
from tests.support.cluster import Daemon, free_port, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

SEVERAL = GOOD.replace('host = "broker.local"\nport = 1883\n',
                       'brokers = [\n  "mqtt-1.internal:1883",\n  "[::1]:1884",\n'
                       '  "10.0.0.3",\n]\n')


@pytest.mark.parametrize(("text", "broker", "label"), [
    ("mqtt-1.internal:8883", Broker("mqtt-1.internal", 8883), "mqtt-1.internal:8883"),
    ("10.0.0.3", Broker("10.0.0.3", 1883), "10.0.0.3:1883"),
    ("[::1]:1884", Broker("::1", 1884), "[::1]:1884"),
    ("[fe80::1%eth0]", Broker("fe80::1%eth0", 1883), "[fe80::1%eth0]:1883"),
    (" host:1 ", Broker("host", 1), "host:1"),
])
def test_parse_one_broker(text: str, broker: Broker, label: str) -> None:
    assert parse_broker(text, 1883) == broker
    assert str(broker) == label


@pytest.mark.parametrize(("text", "message"), [
    ("::1:1883", "IPv6 address goes in brackets"),
    ("host:0", "port must be between 1 and 65535"),
    ("host:70000", "port must be between 1 and 65535"),
    ("host:port", "is not HOST:PORT"),
    ("mqtt://host:1883", "is not HOST:PORT"),
    ("", "is not HOST:PORT"),
    ("[::1]:", "is not HOST:PORT"),
])
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(BrokerSyntaxError, match=message):
        parse_broker(text, 1883)


def test_parse_list_refuses_empty_and_duplicates() -> None:
    with pytest.raises(BrokerSyntaxError, match="is empty"):
        parse_brokers([], 1883)
    with pytest.raises(BrokerSyntaxError, match="a:1883 is listed twice"):
        parse_brokers(["a", "a:1883"], 1883)


def test_config_with_a_list_of_brokers(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, SEVERAL))
    assert c.mqtt.endpoints == (Broker("mqtt-1.internal", 1883), Broker("::1", 1884),
                                Broker("10.0.0.3", 1883))
    assert (c.mqtt.host, c.mqtt.port) == ("mqtt-1.internal", 1883)  # the first one
    tls = load_config(write(tmp_path, SEVERAL + "tls = true\n"))
    assert tls.mqtt.endpoints[2] == Broker("10.0.0.3", 8883)  # TLS's port unless told
    single = load_config(write(tmp_path, GOOD))
    assert single.mqtt.endpoints == (Broker("broker.local", 1883),)


@pytest.mark.parametrize(("text", "message"), [
    (GOOD.replace("port = 1883\n", 'port = 1883\nbrokers = ["a:1"]\n'),
     r"syncd.toml:9: mqtt.brokers: cannot be combined with host on line 7 and port on line 8"),
    (SEVERAL.replace('host = "broker.local"', "") + 'host = "x"\n',
     r"syncd.toml:7: mqtt.brokers: cannot be combined with host on line 13"),
    (SEVERAL.replace('"[::1]:1884"', '"::1:1884"'),
     r"syncd.toml:7: mqtt.brokers: '::1:1884' is not HOST:PORT \(an IPv6 address goes in "
     r"brackets"),
    (SEVERAL.replace('"10.0.0.3",', '"mqtt-1.internal",'),
     r"syncd.toml:7: mqtt.brokers: mqtt-1.internal:1883 is listed twice"),
    (GOOD.replace('host = "broker.local"\nport = 1883\n', "brokers = []\n"),
     r"syncd.toml:7: mqtt.brokers: is empty"),
    (GOOD.replace('host = "broker.local"\nport = 1883\n', 'brokers = "a:1883"\n'),
     r'syncd.toml:7: mqtt.brokers: must be a list of "host:port" strings'),
    (GOOD.replace('host = "broker.local"\nport = 1883\n', "brokers = [1883]\n"),
     r'syncd.toml:7: mqtt.brokers: must be a list of "host:port" strings'),
    (GOOD + "subscribe_qos = 2\n", r"syncd.toml:10: mqtt.subscribe_qos: must be between 0 and 1"),
])
def test_config_errors_name_key_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


A, B, C = Broker("a", 1), Broker("b", 1), Broker("c", 1)


def test_rotation_moves_along_the_list_quickly_then_backs_off_per_round() -> None:
    r = Rotation([A, B, C], 0.5, 8.0, random.Random(1))
    assert r.current == A
    seen, delays = [], []
    for _ in range(12):  # four failed rounds
        delays.append(r.failed())
        seen.append(r.current)
    assert seen == [B, C, A] * 4  # round robin
    for round_ in range(4):
        inside, end = delays[3 * round_: 3 * round_ + 2], delays[3 * round_ + 2]
        assert all(0 <= d <= 0.5 for d in inside)  # next broker at once (a little jitter)
        assert 0.5 <= end <= min(8.0, 0.5 * 2**round_)  # full jitter, doubling per round
    assert r.failed_rounds == 4


def test_rotation_backoff_is_capped_and_jittered() -> None:
    r = Rotation([A, B], 0.1, 2.0, random.Random(7))
    ends = [max(r.failed(), r.failed()) for _ in range(40)]
    assert max(ends) <= 2.0
    late = ends[10:]
    assert len({round(d, 6) for d in late}) > 20  # jitter: not one value
    assert max(late) > 1.5  # the cap is reached


def test_a_success_ends_the_outage() -> None:
    r = Rotation([A, B, C], 0.5, 30.0, random.Random(3))
    for _ in range(9):
        r.failed()
    assert r.failed_rounds == 3
    r.connected()
    assert r.current == A and r.failed_rounds == 0
    # The connection to A is lost: B and C are tried at once, then the first backoff again.
    assert r.failed() <= 0.5 and r.current == B
    assert r.failed() <= 0.5 and r.current == C
    assert 0.5 <= r.failed() <= 0.5 and r.current == A


def test_one_broker_keeps_the_old_backoff() -> None:
    r = Rotation([A], 0.5, 4.0, random.Random(5))
    delays = [r.failed() for _ in range(6)]
    assert r.current == A
    assert delays[0] == 0.5
    for n, d in enumerate(delays):
        assert 0.5 <= d <= min(4.0, 0.5 * 2**n)


# --- end to end: real daemons, two independent Mosquittos and a dead address ----------------


def test_daemons_skip_a_dead_broker_and_move_when_theirs_dies(tmp_path: Path) -> None:
    first, second = cluster.Broker(tmp_path / "m1"), cluster.Broker(tmp_path / "m2")
    first.start()
    second.start()
    dead = f"127.0.0.1:{free_port()}"
    listed = [dead, f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"]
    a, b = (Daemon(tmp_path, n, None, brokers=listed) for n in "ab")
    try:
        for d in (a, b):
            d.start()
            assert d.status()["broker"] == listed[1]  # the dead one was skipped
            assert d.status()["brokers"] == listed
        append(a.path(KEY), ishiki_lines(20))
        wait_equal(content(a.path(KEY)), b)
        first.stop()
        for d in (a, b):
            wait_until(lambda d=d: (s := d.status())["connected"] and s["broker"] == listed[2],
                       10, f"{d.node} to move to the third broker")
        append(a.path(KEY), ishiki_lines(20))
        wait_equal(content(a.path(KEY)), b)
        status = a.status()
        assert status["broker_switches"] == 1
        assert render(status).startswith(f"node a  broker {listed[2]} (connected, 3 of 3 "
                                         "listed)")
        assert f"switched broker: connected to {listed[2]} (3 of 3), was {listed[1]}" in (
            a.read_log())
        assert f"broker {dead} unreachable or lost" in a.read_log()
        assert f"broker {listed[1]} unreachable or lost" in a.read_log()
    finally:
        for d in (a, b):
            d.kill()
        first.stop()
        second.stop()


def test_a_refused_subscription_is_a_failed_connection_not_a_deaf_one() -> None:
    """Mosquitto grants even subscriptions its ACL denies; NATS refuses some (SUBACK 0x80)."""
    _check_granted("t/node/+", (1,))
    _check_granted("t/node/+", [ReasonCode(PacketTypes.SUBACK, identifier=0)])
    with pytest.raises(LinkError, match=r"subscription to t/pos/\+ refused \(SUBACK "
                                                r"0x80\)"):
        _check_granted("t/pos/+", (0x80,))
    with pytest.raises(LinkError, match="0x87"):
        _check_granted("t/pos/+", [ReasonCode(PacketTypes.SUBACK, identifier=0x87)])
