"""`syncd check-config --broker`: does this broker carry syncd's traffic for this node?

A broker can accept the connection and still lose everything: an ACL that silently drops a
node's publishes (Mosquitto does not tell the client), retained messages switched off, a packet
limit below syncd's largest frame (the broker drops the connection when one arrives). Each of
these looks like "connected, nobody hears us". So the check does what the daemon does, on
probe topics of this node's own, and reads it back:

1. connect with the configured credentials and TLS (own client id: a running daemon stays up);
2. subscribe to what the daemon subscribes to (a refused subscription is named);
3. publish a small live probe and read it back (lost: the ACL drops our publishes or reads);
4. publish one probe as large as syncd's largest frame (lost or disconnected: packet limit);
5. publish a retained probe, subscribe afresh through a wildcard filter (as syncd reads
   presence and positions) and expect it back as retained, then clear it.

The probes live deeper than any syncd topic (`P/a/<node>/syncd-check/<nonce>/…`), so no
daemon subscribes to them and nothing shows in any host's status; the shipped ACL's
`P/a/<node>/#` and `P/p/<node>/#` cover them. Each problem raises BrokerProblem with a
cause (a word for scripts) and a sentence for people. With `[mqtt] brokers`, every broker of
the list is checked (`check_all`): each one must carry the traffic, since syncd may use any.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from dataclasses import dataclass

import aiomqtt

from syncd.config import Config
from syncd.core import frames, sealed
from syncd.core.brokers import Broker
from syncd.core.errors import SyncdError
from syncd.net import tls

# The largest frame syncd publishes: a batch of chunk_bytes, or one item of chunk_bytes behind
# the preamble, header length and headers (a few hundred bytes for one item), and, sealed
# (wire version 6), a 48-byte key wrap per recipient and the body's tag.
FRAME_OVERHEAD = frames.HEADER_START + 4096


@dataclass
class BrokerProblem(SyncdError):
    cause: str  # unreachable, credentials, tls, subscribe, acl, packet_limit, retained
    detail: str

    def __str__(self) -> str:
        return self.detail


def largest_frame(config: Config) -> int:
    """The larger of a frame for every listed peer at once, wrapped for each of them, and an
    answer to a fetch (fill_bytes, for one recipient)."""
    recipients = len(set(config.peers) - {config.node})
    return FRAME_OVERHEAD + max(config.chunk_bytes + sealed.overhead(recipients),
                                config.fill_bytes + sealed.overhead(1))


def largest_bound(config: Config) -> tuple[str, int]:
    """The setting that bounds the largest frame, and its value."""
    recipients = len(set(config.peers) - {config.node})
    if config.fill_bytes + sealed.overhead(1) > config.chunk_bytes + sealed.overhead(recipients):
        return "fill_bytes", config.fill_bytes
    return "chunk_bytes", config.chunk_bytes


def classify_connect_error(error: BaseException) -> str:
    """Which of unreachable / credentials / tls a failed connection attempt was."""
    text = str(error).lower()
    chain: BaseException | None = error
    while chain is not None:
        if isinstance(chain, ssl.SSLError):
            return "tls"
        chain = chain.__cause__ or chain.__context__
    if "certificate" in text or "ssl" in text or "tls" in text:
        return "tls"
    if any(w in text for w in ("not authori", "bad user name", "bad username", "code:4]",
                               "code:5]", "code:134", "code:135")):
        return "credentials"
    return "unreachable"


async def check_all(config: Config, wait: float = 5.0
                    ) -> list[tuple[Broker, list[str] | BrokerProblem]]:
    """Check every broker of `[mqtt] brokers`, one after the other: what passed, or why not."""
    results: list[tuple[Broker, list[str] | BrokerProblem]] = []
    for endpoint in config.mqtt.endpoints:
        try:
            results.append((endpoint, await check(config, wait, endpoint)))
        except BrokerProblem as e:
            results.append((endpoint, e))
    return results


async def check(config: Config, wait: float = 5.0, endpoint: Broker | None = None
                ) -> list[str]:
    """Run every check on one broker (the first listed unless told); return what passed (one
    line each) or raise BrokerProblem.

    `wait`: seconds for the connection and for each probe to come back.
    """
    m = config.mqtt
    endpoint = endpoint or m.endpoints[0]
    broker = str(endpoint)
    nonce = secrets.token_hex(4)
    # Below this node's own batch and position topics (what the ACL lets it write), one level
    # deeper than peers subscribe, so that no running daemon receives the probes.
    base = f"{m.topic_prefix}/%s/{frames.level(config.node)}/syncd-check/{nonce}"
    live_topic, retained_topic = base % "a" + "/live", base % "p" + "/retained"
    client = aiomqtt.Client(
        endpoint.host, endpoint.port, identifier=f"{config.client_id}-check-{nonce}",
        username=m.username, password=config.password(), tls_context=tls.client_context(m),
        clean_session=True, keepalive=m.keepalive, timeout=wait,
    )
    passed: list[str] = []
    try:
        await client.__aenter__()
    except aiomqtt.MqttError as e:
        cause = classify_connect_error(e)
        hint = {
            "tls": "check tls_ca_file (the CA that signed the broker's certificate) and that "
                   "the certificate names [mqtt] host",
            "credentials": "check [mqtt] username and password_file, and the broker's "
                           "password file",
            "unreachable": "is the broker running, are host and port right (TLS is usually "
                           "8883, plain 1883), is a firewall in the way? Plain MQTT spoken "
                           "to a TLS listener also ends here",
        }[cause]
        raise BrokerProblem(cause, f"broker {broker}: cannot connect ({e}): {hint}") from None
    try:
        passed.append(f"connected to {broker} as {m.username or '(anonymous)'}"
                      f"{' over TLS' if m.tls else ''}")
        refused = []
        for topic in frames.subscriptions(m.topic_prefix, config.node, config.peers,
                                          m.hide_names):
            granted = await client.subscribe(topic, qos=1)
            codes = [g if isinstance(g, int) else g.value for g in granted]
            if any(c >= 0x80 for c in codes):
                refused.append(topic)
            await client.unsubscribe(topic)
        if refused:
            raise BrokerProblem("subscribe", f"broker {broker} refused the subscriptions "
                                f"{', '.join(refused)}: the ACL must let user "
                                f"{m.username or '(anonymous)'} read them "
                                "(config/mosquitto.acl)")
        passed.append("subscriptions granted")
        await client.subscribe(f"{base % 'a'}/#", qos=1)
        got = await _round_trip(client, live_topic, b"syncd-check", wait)
        if got is None:
            raise BrokerProblem("acl", (
                f"a probe published on {live_topic} never came back within {wait:g}s: the "
                f"broker accepts the connection but drops this node's publishes (an ACL: user "
                f"{m.username or '(anonymous)'} needs write on {m.topic_prefix}/a/"
                f"{frames.level(config.node)}/# and read on {m.topic_prefix}/a/#, see "
                "config/mosquitto.acl; Mosquitto logs 'Denied PUBLISH' with log_type debug)"))
        passed.append("live probe published and read back")
        size = largest_frame(config)
        bound, data = largest_bound(config)
        try:
            got = await _round_trip(client, live_topic, b"x" * size, wait)
        except aiomqtt.MqttError:
            got = None
        if got is None:
            raise BrokerProblem("packet_limit", (
                f"a probe of {size} bytes ({bound} {data} + "
                f"{size - data} of headers and key wraps) was refused or "
                "dropped: the broker's packet limit is below syncd's largest frame; raise "
                "max_packet_size (Mosquitto) above "
                f"{size + 8192} or lower {bound}"))
        passed.append(f"largest frame ({size} bytes) accepted")
        # Read back through a wildcard filter, as syncd reads presence and positions
        # (P/n/+, P/p/<peer>/+/+): a broker may keep retained messages and hand them only to
        # a subscription naming the exact topic (RabbitMQ's MQTT plugin does), which would
        # leave every host blind to its peers' state while this check passed.
        wildcard = base % "p" + "/+"
        exact: bytes | None = None
        try:
            await client.publish(retained_topic, b"syncd-check", qos=1, retain=True,
                                 timeout=wait)
            await client.subscribe(wildcard, qos=1)
            kept = await _receive(client, retained_topic, wait, retained=True)
            if kept is None:
                await client.unsubscribe(wildcard)
                await client.subscribe(retained_topic, qos=1)
                exact = await _receive(client, retained_topic, wait, retained=True)
            await client.publish(retained_topic, b"", qos=1, retain=True, timeout=wait)
        except aiomqtt.MqttError:
            kept = None  # Mosquitto with retain_available false drops the connection
        if kept is None and exact is not None:
            raise BrokerProblem("retained", (
                f"a retained probe on {retained_topic} was kept, but the broker sent it only "
                f"to a subscription naming that topic, not to {wildcard}: syncd reads presence "
                "and positions through wildcard filters, so no host would learn its peers' "
                "state (RabbitMQ's MQTT plugin behaves so): this broker cannot carry syncd "
                "(docs/brokers.md)"))
        if kept is None:
            raise BrokerProblem("retained", (
                f"a retained probe on {retained_topic} was not kept: syncd needs retained "
                "messages (presence and positions); Mosquitto: retain_available true"))
        passed.append("retained probe kept (and cleared)")
        return passed
    finally:
        with contextlib.suppress(Exception):
            await client.__aexit__(None, None, None)


async def _round_trip(client: aiomqtt.Client, topic: str, payload: bytes,
                      wait: float) -> bytes | None:
    await client.publish(topic, payload, qos=1, timeout=wait)
    got = await _receive(client, topic, wait)
    return got if got == payload else None


async def _receive(client: aiomqtt.Client, topic: str, wait: float,
                   retained: bool = False) -> bytes | None:
    """The next message on `topic` (retained only, if asked), or None after `wait` s."""

    async def first() -> bytes:
        async for message in client.messages:
            if message.topic.value == topic and (message.retain or not retained):
                payload = message.payload
                if isinstance(payload, bytes | bytearray):
                    return bytes(payload)
        raise aiomqtt.MqttError("disconnected")

    try:
        return await asyncio.wait_for(first(), wait)
    except TimeoutError:
        return None
