"""TLS to the broker, and the example broker config (TLS, per-node users, ACL) end to end."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from syncd.config import ConfigError, MqttConfig
from syncd.net.tls import client_context
from tests.support.certs import CA, Issued
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines, write_log

EXAMPLES = Path(__file__).parents[2] / "config"
PREFIX = "test/syncd"  # tests.support.cluster.Daemon's topic_prefix


@dataclass
class SecureBroker:
    broker: Broker
    ca: CA
    passwords: dict[str, Path]


def example_broker_config(dir: Path, ca: CA, server: Issued, users: dict[str, str]
                          ) -> Broker:
    """A Broker running config/mosquitto.conf and .acl, with this test's files and port."""
    dir.mkdir(parents=True)
    passwd = dir / "syncd.passwd"
    for n, (user, password) in enumerate(users.items()):
        subprocess.run(["mosquitto_passwd", *(["-c"] if n == 0 else []), "-b", str(passwd),
                        user, password], check=True, capture_output=True)
    acl = dir / "syncd.acl"
    acl.write_text(re.sub(r"^(pattern \w+|topic \w+) syncd/", rf"\1 {PREFIX}/",
                          (EXAMPLES / "mosquitto.acl").read_text(), flags=re.M))
    (dir / "persist").mkdir()
    ours = {
        "/etc/mosquitto/certs/ca.crt": str(ca.files.cert),
        "/etc/mosquitto/certs/broker.crt": str(server.cert),
        "/etc/mosquitto/certs/broker.key": str(server.key),
        "/etc/mosquitto/syncd.passwd": str(passwd),
        "/etc/mosquitto/syncd.acl": str(acl),
        "/var/lib/mosquitto/": f"{dir / 'persist'}/",
    }

    def config(port: int) -> str:
        lines = (EXAMPLES / "mosquitto.conf").read_text().splitlines()
        for theirs, mine in {**ours, "listener 8883": f"listener {port} 127.0.0.1"}.items():
            at = [i for i, line in enumerate(lines)
                  if not line.startswith("#") and theirs in line]
            assert len(at) == 1, theirs
            lines[at[0]] = lines[at[0]].replace(theirs, mine)
        # Stay root: the test's files live in a directory only root may enter.
        return "\n".join([*lines, "user root", ""])

    return Broker(dir, config=config)


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    ca = CA(tmp_path / "pki")
    users = {"a": "password-a", "b": "password-b"}
    broker = example_broker_config(tmp_path / "broker", ca, ca.issue("broker", server=True),
                                   users)
    passwords = {}
    for user, password in users.items():
        passwords[user] = tmp_path / f"{user}.password"
        passwords[user].write_text(password + "\n")
    broker.start()
    yield SecureBroker(broker, ca, passwords)
    broker.stop()


def tls_daemon(root: Path, node: str, s: SecureBroker) -> Daemon:
    return Daemon(root, node, s.broker, mqtt_extra=(
        f'username = "{node}"\npassword_file = "{s.passwords[node]}"\n'
        f'tls_ca_file = "{s.ca.files.cert}"\n'))


def test_replication_through_tls_password_and_acl(tmp_path: Path, secure: SecureBroker
                                                 ) -> None:
    a, b = tls_daemon(tmp_path, "a", secure), tls_daemon(tmp_path, "b", secure)
    try:
        a.start()
        b.start()
        append(a.path("bot-1"), ishiki_lines(20))
        append(b.path("bot-2"), ishiki_lines(5))
        wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
        wait_equal(b.path("bot-2").read_bytes(), a, key="bot-2")
        wait_until(lambda: a.file_status("bot-1")["state"] == "in_sync", 10, "in_sync")
    finally:
        a.kill()
        b.kill()


def test_a_catch_up_in_full_size_answers_fits_the_shipped_packet_limit(
        tmp_path: Path, secure: SecureBroker) -> None:
    # A standby that starts behind by several MB gets them in answers of fill_bytes (1000
    # KiB by default): each, with its header and key wrap, below max_packet_size (1 MiB).
    a, b = tls_daemon(tmp_path, "a", secure), tls_daemon(tmp_path, "b", secure)
    try:
        src = a.path("bot-1")
        write_log(src, 6_000_000)
        a.start()
        b.start()
        wait_equal(src.read_bytes(), b, key="bot-1")
        st = a.file_status("bot-1")
        assert st["served_bytes"] / st["served_frames"] > 500_000, st  # not 256 KiB frames
    finally:
        a.kill()
        b.kill()


async def _client(s: SecureBroker, user: str | None, password: str | None,
                  ca: Path | None = None) -> aiomqtt.Client:
    m = MqttConfig(tls=True, tls_ca_file=ca or s.ca.files.cert)
    return aiomqtt.Client("127.0.0.1", s.broker.port, username=user, password=password,
                          tls_context=client_context(m), timeout=5)


def test_acl_lets_a_node_publish_only_as_itself(secure: SecureBroker) -> None:
    async def scenario() -> list[str]:
        got: list[str] = []
        async with await _client(secure, "b", "password-b") as b_reader, \
                await _client(secure, "a", "password-a") as a_writer:
            await b_reader.subscribe(f"{PREFIX}/p/#", qos=1)
            await b_reader.subscribe(f"{PREFIX}/t/b/#", qos=1)
            # Forged: a speaking as b, or answering as b. Then one a may send.
            await a_writer.publish(f"{PREFIX}/p/b/bot-1/events", b"forged", qos=1)
            await a_writer.publish(f"{PREFIX}/t/b/b", b"forged", qos=1)
            await a_writer.publish(f"{PREFIX}/t/b/a", b"real", qos=1)
            # One publisher's messages arrive in order: once "real" is in, so is anything
            # sent before it that the broker let through.
            async with asyncio.timeout(5):
                async for message in b_reader.messages:
                    got.append(message.topic.value)
                    if message.payload == b"real":
                        return got
        return got

    assert asyncio.run(scenario()) == [f"{PREFIX}/t/b/a"]


def test_broker_refuses_anonymous_wrong_password_and_unknown_ca(tmp_path: Path,
                                                                secure: SecureBroker) -> None:
    other_ca = CA(tmp_path / "other-pki", "not the broker's CA")

    async def connect(user: str | None, password: str | None, ca: Path | None = None) -> str:
        try:
            async with await _client(secure, user, password, ca):
                return "connected"
        except aiomqtt.MqttError as e:
            return str(e)

    assert asyncio.run(connect("a", "password-a")) == "connected"
    assert "authoriz" in asyncio.run(connect(None, None)).lower()
    assert "authoriz" in asyncio.run(connect("a", "password-b")).lower()
    assert "certificate verify failed" in asyncio.run(connect("a", "password-a",
                                                               other_ca.files.cert))


def test_client_context_names_the_key_that_is_wrong(tmp_path: Path) -> None:
    assert client_context(MqttConfig()) is None
    ca = CA(tmp_path / "pki")
    node = ca.issue("a", server=False)
    context = client_context(MqttConfig(tls=True, tls_ca_file=ca.files.cert,
                                        tls_cert_file=node.cert, tls_key_file=node.key))
    assert context is not None and context.check_hostname
    with pytest.raises(ConfigError, match=r"mqtt\.tls_ca_file: cannot load .*missing"):
        client_context(MqttConfig(tls=True, tls_ca_file=tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"mqtt\.tls_cert_file/tls_key_file"):
        client_context(MqttConfig(tls=True, tls_cert_file=node.cert, tls_key_file=ca.files.key))
