"""`syncd forget NODE`: clear a retired host's retained messages from the broker.

Retiring a host is a config change: remove its line from `[peers]` on every host and run
`syncd reload` there. From then on its frames are refused, and every host drops it from
status, metrics and divergences (nothing it says counts, so nothing it left can mislead).
This command does the broker's half: it learns which retained topics NODE left (its presence
and one position per file, in either topic form, plain or keyed: `[mqtt] hide_names`) by
subscribing to them and clears each with an empty retained payload, so that the broker stops
handing them to every host that connects. It refuses while this host's config still lists
NODE.

The shipped ACL lets a node write only its own topics: run this with the broker's admin login
(`--username`/`--password-file`, the ACL's `syncd-admin` user), from any host with the config.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from pathlib import Path

import aiomqtt
import click

from syncd.cli.common import config_option, load_or_exit
from syncd.config import Config, ConfigError
from syncd.core import frames
from syncd.core.errors import SyncdError
from syncd.core.names import is_valid_name
from syncd.net import tls
from syncd.ops.brokercheck import classify_connect_error

EXIT_DONE = 0
EXIT_REFUSED = 1
EXIT_UNUSABLE = 2


class Refused(SyncdError):
    """Nothing was changed; the message says why."""


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
    """Clear `node`'s retained topics; return (positions cleared, whether a presence was)."""
    m = config.mqtt
    p = m.topic_prefix
    presence_topic = frames.presence_topic(p, node)
    # Plain positions (P/p/<node>/<key>/<file>) and keyed ones (hide_names: P/p/<node>/~k…).
    positions = [f"{p}/p/{frames.level(node)}/+/+", f"{p}/p/{frames.level(node)}/+"]
    nonce = secrets.token_hex(4)
    sentinel = f"{p}/a/{frames.level(config.node)}/syncd-forget/{nonce}"
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
        retained = await _retained(client, [presence_topic, *positions], sentinel, wait)
        had_presence = retained.pop(presence_topic, None) is not None
        if not had_presence and not retained and not force:
            raise Refused(f"the broker holds no presence or position of {node} under {p}/: "
                          "check the name (--force clears anyway)")
        for topic in [presence_topic, *sorted(retained)]:
            await client.publish(topic, b"", qos=1, retain=True, timeout=wait)
        left = await _retained(client, [presence_topic, *positions], sentinel, wait)
        if left:
            raise Refused(f"{len(left)} retained messages of {node} are still there after "
                          "clearing them: this login may not write other nodes' topics (the "
                          "ACL's admin user may); run it again with that login")
        return len(retained), had_presence
    finally:
        with contextlib.suppress(aiomqtt.MqttError):
            await client.__aexit__(None, None, None)


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
    """Clear NODE's retained presence and positions from the broker, once NODE is retired.

    Retire NODE first: remove its line from [peers] on every host and run `syncd reload`
    there (its frames are refused from then on, and every host drops it from status and
    metrics). Refused while this config still lists NODE.

    \b
    Exit status:
      0  NODE is retired
      1  refused, nothing changed (NODE still in [peers] or unknown, broker unreachable or
         the login lacks the rights)
      2  the config or password file is not usable
    """
    config = load_or_exit(config_path)
    if not is_valid_name(node):
        click.echo(f"syncd forget: {node!r} is not a node name", err=True)
        sys.exit(EXIT_UNUSABLE)
    if node == config.node:
        click.echo(f"syncd forget: {node} is this host; run it from another host", err=True)
        sys.exit(EXIT_REFUSED)
    if node in config.peers:
        click.echo(f"syncd forget: {node} is still listed in [peers] of {config_path}: remove "
                   "its line on every host and run `syncd reload` there first; nothing changed",
                   err=True)
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
    except (Refused, aiomqtt.MqttError) as e:
        click.echo(f"syncd forget: {e}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(f"{node}: {'presence' if had_presence else 'no presence'} and {cleared} retained "
               "positions cleared from the broker.")
