"""`syncd forget NODE`: retire a host for good, on the broker and on every other host.

Refuses while NODE is online. Otherwise it learns which retained topics NODE left on the
broker (its presence and one position per file) by subscribing to them, replaces the presence
with an authenticated retirement notice (retained, so that hosts started later learn it too)
and clears every position with an empty retained payload. Each running host drops NODE from
status, metrics and divergences at once and records it in `state_dir` (see retire.py).

The shipped ACL lets a node write only its own topics: run this with the broker's admin login
(`--username`/`--password-file`, the ACL's `syncd-admin` user), from any host with the config
and cluster secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import click

from syncd import frames, tls
from syncd.brokercheck import classify_connect_error
from syncd.cli.common import config_option, load_or_exit
from syncd.config import Config, ConfigError
from syncd.errors import SyncdError
from syncd.names import is_valid_name
from syncd.secret import SecretError, load_secret

EXIT_DONE = 0
EXIT_REFUSED = 1
EXIT_UNUSABLE = 2


class Refused(SyncdError):
    """Nothing was changed; the message says why."""


@dataclass
class Found:
    presence: frames.Presence | None
    presence_ts: int
    positions: list[str]  # retained position topics


async def _retained(client: aiomqtt.Client, filters: list[str], sentinel: str,
                    wait: float) -> dict[str, bytes]:
    """Every retained message under `filters`: the broker sends them in answer to the
    subscription, before it forwards our own later publish on `sentinel`."""
    for f in [*filters, sentinel]:
        await client.subscribe(f, qos=1)
    await client.publish(sentinel, b"", qos=1, timeout=wait)
    found: dict[str, bytes] = {}

    async def collect() -> None:
        async for message in client.messages:
            if message.topic.value == sentinel:
                return
            payload = message.payload
            if message.retain and isinstance(payload, bytes | bytearray) and payload:
                found[message.topic.value] = bytes(payload)

    try:
        await asyncio.wait_for(collect(), wait)
    except TimeoutError:
        raise Refused(f"the broker did not echo a probe within {wait:g}s; this login may not "
                      f"read and write {sentinel.rsplit('/', 3)[0]}/… (use the ACL's admin "
                      "user: --username, --password-file)") from None
    for f in [*filters, sentinel]:
        await client.unsubscribe(f)
    return found


async def forget(config: Config, node: str, username: str | None, password: str | None,
                 force: bool, wait: float) -> tuple[int, bool]:
    """Retire `node`; return (positions cleared, whether a presence was found)."""
    m = config.mqtt
    secret = load_secret(config.secret_file)
    p = m.topic_prefix
    presence_topic = frames.topic_for(p, frames.Topic(frames.Kind.NODE, node))
    nonce = secrets.token_hex(4)
    sentinel = f"{p}/live/{node}/syncd-forget/{nonce}/done"
    failures = []
    for endpoint in m.endpoints:  # the first of `[mqtt] brokers` that answers
        client = aiomqtt.Client(
            endpoint.host, endpoint.port, identifier=f"{config.client_id}-forget-{nonce}",
            username=username, password=password, tls_context=tls.client_context(m),
            clean_session=True, keepalive=m.keepalive, timeout=wait,
        )
        try:
            await client.__aenter__()
            break
        except aiomqtt.MqttError as e:
            failures.append(f"{endpoint} ({classify_connect_error(e)}: {e})")
    else:
        raise Refused(f"cannot connect to broker {'; nor to '.join(failures)}")
    try:
        retained = await _retained(client, [presence_topic, f"{p}/pos/{node}/+/+"], sentinel,
                                   wait)
        found = _read(retained, presence_topic, secret)
        if found.presence is not None and found.presence.online:
            raise Refused(f"{node} is online: stop syncd there first (a host that runs is not "
                          "retired); nothing changed")
        if found.presence is None and not found.positions and not force:
            raise Refused(f"the broker holds no presence or position of {node} under {p}/: "
                          "check the name (--force retires it anyway, e.g. after a broker "
                          "lost its retained messages)")
        # Stamped after its last presence, so that every host takes it as newer (freshness.py)
        ts = max(time.time_ns() // 1_000_000, found.presence_ts + 1)
        notice = frames.encode(frames.Presence(False, retired=True),
                               frames.Stamp(secrets.token_hex(8), 0, ts), secret,
                               presence_topic)
        await client.publish(presence_topic, notice, qos=1, retain=True, timeout=wait)
        for topic in found.positions:
            await client.publish(topic, b"", qos=1, retain=True, timeout=wait)
        left = await _retained(client, [f"{p}/pos/{node}/+/+"], sentinel, wait)
        if left:
            raise Refused(f"the retirement notice is published, but {len(left)} positions of "
                          f"{node} are still retained after clearing them: this login may not "
                          "write other nodes' topics (the ACL's admin user may); run it again "
                          "with that login")
        return len(found.positions), found.presence is not None
    finally:
        with contextlib.suppress(aiomqtt.MqttError):
            await client.__aexit__(None, None, None)


def _read(retained: dict[str, bytes], presence_topic: str, secret: bytes) -> Found:
    presence, ts = None, 0
    raw = retained.pop(presence_topic, None)
    if raw is not None:
        try:
            stamp, body = frames.decode(frames.Kind.NODE, raw, 0, secret, presence_topic)
        except frames.FrameError as e:
            raise Refused(f"the retained presence on {presence_topic} is not authentic "
                          f"({e}): is this the cluster's secret_file?") from None
        assert isinstance(body, frames.Presence)
        presence, ts = body, stamp.ts
        if body.retired:
            presence = None  # retired before: clear whatever positions came back since
    return Found(presence, ts, sorted(retained))


@click.command("forget")
@click.argument("node")
@config_option
@click.option("--username", help="Broker login for the clear (default: [mqtt] username); the "
                                 "shipped ACL gives user syncd-admin the rights it needs.")
@click.option("--password-file", type=click.Path(path_type=Path, dir_okay=False),
              help="File whose first line is that login's password (default: [mqtt] "
                   "password_file).")
@click.option("--force", is_flag=True, help="Retire NODE even if the broker holds nothing of it.")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 300),
              help="Seconds to wait for the broker at each step.")
def command(node: str, config_path: Path, username: str | None, password_file: Path | None,
            force: bool, timeout: float) -> None:
    """Retire NODE for good: every host drops it from status and metrics.

    Refused while NODE is online. Clears NODE's retained presence and positions from the
    broker (leaving an authenticated retirement notice), so that hosts started later do not
    see it either. A retired node that starts syncd again is accepted again.

    \b
    Exit status:
      0  NODE is retired
      1  refused, nothing changed (NODE online or unknown, broker unreachable or the login
         lacks the rights)
      2  the config, secret or password file is not usable
    """
    config = load_or_exit(config_path)
    if not is_valid_name(node):
        click.echo(f"syncd forget: {node!r} is not a node name", err=True)
        sys.exit(EXIT_UNUSABLE)
    if node == config.node:
        click.echo(f"syncd forget: {node} is this host; run it from another host", err=True)
        sys.exit(EXIT_REFUSED)
    try:
        password = (password_file.read_text().splitlines() or [""])[0] if password_file \
            else config.password()
    except (OSError, ConfigError) as e:
        click.echo(f"syncd forget: cannot read the password: {e}", err=True)
        sys.exit(EXIT_UNUSABLE)
    try:
        cleared, had_presence = asyncio.run(forget(
            config, node, username if username is not None else config.mqtt.username,
            password, force, timeout))
    except SecretError as e:
        click.echo(f"syncd forget: {e}", err=True)
        sys.exit(EXIT_UNUSABLE)
    except (Refused, aiomqtt.MqttError) as e:
        click.echo(f"syncd forget: {e}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(f"{node} retired: {'presence' if had_presence else 'no presence'} replaced by a "
               f"retirement notice, {cleared} retained positions cleared. Running hosts drop "
               "it now, hosts started later when they connect.")
