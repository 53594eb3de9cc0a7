"""The MQTT link: one broker connection, kept up for the life of the daemon.

Contract (what happens when the broker goes away):
- `run()` connects, subscribes, and calls `on_connected` each time a connection is made, then
  hands every message to `on_message`. When the connection drops, or cannot be made, it moves
  to the next broker of `[mqtt] brokers` and retries forever, backing off with full jitter
  after each round in which every broker failed (the policy is brokers.py's), logging once per
  change of state of each broker, not once per attempt.
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
import socket
from collections.abc import Awaitable, Callable

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

from syncd import frames, tls
from syncd.brokers import Broker, Rotation
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
        self._rotation = Rotation(m.endpoints, m.reconnect_min, m.reconnect_max)
        self.switches = 0  # connections made to another broker than the one before
        self._last_broker: Broker | None = None  # the broker of the last connection made
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
            self._rotation.current.host,
            self._rotation.current.port,
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

    @property
    def broker(self) -> str:
        """The broker in use (connected, or being tried): host:port."""
        return str(self._rotation.current)

    @property
    def brokers(self) -> list[str]:
        return [str(b) for b in self._rotation.brokers]

    async def run(self) -> None:
        m = self._config.mqtt
        failing: dict[Broker, str] = {}  # broker -> last failure logged, during an outage
        attempts = 0
        while True:
            self.conn += 1
            conn = self.conn
            client = self._make_client(conn)
            broker = self._rotation.current
            try:
                async with client:
                    self._client = client
                    for topic in frames.subscriptions(m.topic_prefix, self._config.node):
                        granted = await client.subscribe(topic, qos=m.subscribe_qos)
                        _check_granted(topic, granted)
                    await client.publish(
                        self._presence_topic,
                        self._seal(self._presence_topic, True, conn),
                        qos=1, retain=True,
                    )
                    self._connected_to(broker, attempts)
                    failing.clear()
                    attempts = 0
                    self.connected.set()
                    await self._on_connected()
                    # From now on each message is handled as paho reads it, on the loop: going
                    # through aiomqtt's queue costs a task and several loop turns per message,
                    # and behind a slow fdatasync that queue grew to 100s of ms of lag. (aiomqtt
                    # has no public hook for it; #12 moves the link to paho itself.)
                    while not client._queue.empty():
                        message = client._queue.get_nowait()
                        self._handle(message.topic.value, message.payload)
                    client._client.on_message = (
                        lambda _c, _u, m: self._handle(m.topic, m.payload))
                    await asyncio.shield(client._disconnected)  # a cancel must not cancel it
            except aiomqtt.MqttError as e:
                self.connected.clear()
                self._client = None
                attempts += 1
                self.reconnects += 1
                rounds = self._rotation.failed_rounds
                delay = self._rotation.failed()
                self._log_failure(broker, str(e) or type(e).__name__, failing, delay,
                                  rounds == 0 and self._rotation.failed_rounds == 1)
                await asyncio.sleep(delay)
            finally:
                self.connected.clear()
                self._client = None

    def _connected_to(self, broker: Broker, attempts: int) -> None:
        self._rotation.connected()
        place = (f" ({self._rotation.position} of {len(self._rotation.brokers)})"
                 if len(self._rotation.brokers) > 1 else "")
        if self._last_broker is not None and broker != self._last_broker:
            self.switches += 1
            log.warning("switched broker: connected to %s%s, was %s", broker, place,
                        self._last_broker)
        elif attempts:
            log.info("connected to broker %s%s after %d failed attempts", broker, place,
                     attempts)
        else:
            log.info("connected to broker %s%s as %s", broker, place, self._config.client_id)
        self._last_broker = broker

    def _log_failure(self, broker: Broker, reason: str, failing: dict[Broker, str],
                     delay: float, first_round_failed: bool) -> None:
        """Once per change of state of each broker, not once per attempt."""
        m = self._config.mqtt
        several = len(self._rotation.brokers) > 1
        nxt = self._rotation.current
        then = (f"; trying {nxt} next" if several else "; retrying") + \
            f" (backoff {m.reconnect_min:.3g}s..{m.reconnect_max:.3g}s" + \
            (" after each round of the list)" if several else ")")
        last = failing.get(broker)
        failing[broker] = reason
        if last is None and _refused_credentials(reason):
            log.error("broker %s refused our credentials (%s): check [mqtt] username and "
                      "password_file, and the broker's password file and ACL%s",
                      broker, reason, then)
        elif last is None:
            log.warning("broker %s unreachable or lost (%s)%s", broker, reason, then)
        elif reason != last:
            log.warning("broker %s still unavailable: %s", broker, reason)
        else:
            log.debug("broker %s: attempt failed: %s; next attempt on %s in %.3gs", broker,
                      reason, nxt, delay)
        if first_round_failed and several:
            log.warning("no broker reachable (%d tried: %s); backing off between rounds",
                        len(self._rotation.brokers), ", ".join(self.brokers))

    def _handle(self, topic: str, payload: object) -> None:
        if isinstance(payload, bytes | bytearray):
            try:
                self._on_message(topic, bytes(payload))
            except Exception:
                # One bad message must not take the link down.
                log.exception("error handling message on %s", topic)

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


def _check_granted(topic: str, granted: tuple[int, ...] | list[ReasonCode]) -> None:
    """A refused subscription leaves us deaf while 'connected': count it as a failed connection
    (the next broker is tried), never as a success."""
    codes = [g if isinstance(g, int) else g.value for g in granted]
    if any(c >= 0x80 for c in codes):
        raise aiomqtt.MqttError(f"subscription to {topic} refused (SUBACK 0x{max(codes):02x}): "
                                "check the broker's ACL (syncd check-config --broker)")


def _refused_credentials(reason: str) -> bool:
    text = reason.lower()
    return any(w in text for w in ("not authori", "bad user name or password", "bad username"))
