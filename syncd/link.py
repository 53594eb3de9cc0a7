"""The MQTT link: one broker connection, kept up for the life of the daemon.

Contract (what happens when the broker goes away):
- `run()` connects, subscribes, and calls `on_connected` each time a connection is made, then
  hands every message to `on_message`. When the connection drops it retries forever with
  exponential backoff and jitter, logging once per change of state, not once per attempt.
- `publish()` never blocks and never raises: while disconnected it drops the message and
  returns False. Nothing relies on the broker to queue or deliver: positions are retained and
  re-announced on every connect, and missing bytes are requested again (anti-entropy).
- Sessions are clean: the broker keeps nothing for us between connections, so nothing stale
  is replayed and a broker restart without persistence loses nothing we need.
- QoS 1 everywhere; the will marks this node offline when the connection dies uncleanly.

It knows nothing about files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Awaitable, Callable

import aiomqtt

from syncd import frames, tls
from syncd.config import Config

log = logging.getLogger("syncd.link")


class Link:
    def __init__(
        self,
        config: Config,
        on_message: Callable[[str, bytes], None],
        on_connected: Callable[[], Awaitable[None]],
        seal: Callable[[str, bool, int], bytes],
    ) -> None:
        self._config = config
        self._seal = seal  # (topic, online, connection number) -> signed presence frame
        self._on_message = on_message
        self._on_connected = on_connected
        self._client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.conn = 0  # counts this run's connections: presence is ordered by it (freshness.py)
        m = config.mqtt
        self.broker = f"{m.host}:{m.port}"
        self._presence_topic = frames.presence_topic(m.topic_prefix, config.node)

    def _make_client(self, conn: int) -> aiomqtt.Client:
        m = self._config.mqtt
        # The will describes the end of connection `conn`: it supersedes that connection's
        # online presence, and nothing later (freshness.py).
        will = aiomqtt.Will(
            self._presence_topic, self._seal(self._presence_topic, False, conn),
            qos=1, retain=True,
        )
        return aiomqtt.Client(
            m.host,
            m.port,
            identifier=self._config.client_id,
            username=m.username,
            password=self._config.password(),
            tls_context=tls.client_context(m),
            will=will,
            clean_session=True,
            keepalive=m.keepalive,
            timeout=10,
            max_inflight_messages=100,
            # Without this, Nagle's algorithm meets the broker's delayed ACKs and small
            # frames wait ~40 ms under load.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            logger=logging.getLogger("syncd.mqtt"),
        )

    async def run(self) -> None:
        m = self._config.mqtt
        delay = m.reconnect_min
        failing_since: str | None = None
        attempts = 0
        while True:
            self.conn += 1
            conn = self.conn
            client = self._make_client(conn)
            try:
                async with client:
                    self._client = client
                    for topic in frames.subscriptions(m.topic_prefix, self._config.node):
                        await client.subscribe(topic, qos=1)
                    await client.publish(
                        self._presence_topic,
                        self._seal(self._presence_topic, True, conn),
                        qos=1, retain=True,
                    )
                    if failing_since is not None:
                        log.info("connected to broker %s after %d failed attempts",
                                 self.broker, attempts)
                    else:
                        log.info("connected to broker %s as %s", self.broker,
                                 self._config.client_id)
                    failing_since, attempts, delay = None, 0, m.reconnect_min
                    self.connected.set()
                    await self._on_connected()
                    async for message in client.messages:
                        payload = message.payload
                        if isinstance(payload, bytes | bytearray):
                            try:
                                self._on_message(message.topic.value, bytes(payload))
                            except Exception:
                                # One bad message must not take the link down.
                                log.exception("error handling message on %s",
                                              message.topic.value)
            except aiomqtt.MqttError as e:
                self.connected.clear()
                self._client = None
                attempts += 1
                reason = str(e) or type(e).__name__
                if failing_since is None and _refused_credentials(reason):
                    failing_since = reason
                    log.error("broker %s refused our credentials (%s): check [mqtt] username "
                              "and password_file, and the broker's password file and ACL; "
                              "retrying with backoff", self.broker, reason)
                elif failing_since is None:
                    failing_since = reason
                    log.warning("broker %s unreachable or lost (%s); retrying with backoff "
                                "(%.3gs..%.3gs)", self.broker, reason, m.reconnect_min,
                                m.reconnect_max)
                elif reason != failing_since:
                    failing_since = reason
                    log.warning("broker %s still unavailable: %s", self.broker, reason)
                else:
                    log.debug("broker %s: attempt %d failed: %s", self.broker, attempts, reason)
                self.reconnects += 1
                # Full jitter keeps a fleet of hosts from reconnecting in lockstep.
                await asyncio.sleep(random.uniform(m.reconnect_min, delay))
                delay = min(m.reconnect_max, delay * 2)
            finally:
                self.connected.clear()
                self._client = None

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> bool:
        """Hand a QoS 1 publish to the connection, in call order, without waiting for it.

        We never wait for a PUBACK: nothing depends on one message arriving (anti-entropy
        repairs losses), and aiomqtt's per-publish bookkeeping walks every pending call, which
        at thousands of publishes a second costs more than the rest of syncd. So the frame
        goes straight to paho (aiomqtt's own client underneath), which keeps QoS 1 in order
        and queues past its in-flight window.
        """
        client = self._client
        if client is None:
            return False
        info = client._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc != 0:
            log.debug("publish to %s dropped: rc %s", topic, info.rc)
            return False
        return True

    async def close(self) -> None:
        """Say goodbye cleanly (presence offline, retained) if connected."""
        client = self._client
        if client is not None:
            with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
                await client.publish(
                    self._presence_topic,
                    self._seal(self._presence_topic, False, self.conn),
                    qos=1, retain=True, timeout=2,
                )


def _refused_credentials(reason: str) -> bool:
    text = reason.lower()
    return any(w in text for w in ("not authori", "bad user name or password", "bad username"))
