"""The MQTT link: one broker connection, kept up for the life of the daemon.

Contract (what happens when the broker goes away):
- `run()` connects, subscribes, and calls `on_connected` each time a connection is made, then
  hands every message to `on_message`. When the connection drops, or cannot be made, it moves
  to the next broker of `[mqtt] brokers` and retries forever, backing off with full jitter
  after each round in which every broker failed (the policy is core/brokers.py's), logging once per
  change of state of each broker, not once per attempt.
- `publish()` never blocks and never raises: while disconnected, or while more than
  `[mqtt] max_queued_bytes` wait to be written and acknowledged, it drops the message and
  returns False. Nothing relies on the broker to queue or deliver: positions are retained and
  re-announced on every connect, and missing bytes are requested again (anti-entropy).
- Sessions are clean: the broker keeps nothing for us between connections, so nothing stale
  is replayed and a broker restart without persistence loses nothing we need.
- QoS 1, but for live batches (daemon/outbound.py says why); the will marks this node offline
  when the connection dies uncleanly.

It drives paho-mqtt's client from the event loop itself (`Session`): the socket's reader and
writer callbacks call paho's loop_read/loop_write, a publish is written to the socket at once,
and each message is handled as paho reads it. (aiomqtt, which the CLI tools use, costs a task,
a queue and several loop turns per message, and its publish bookkeeping walks every pending
call: at thousands of messages a second that was more than the rest of syncd.)

It knows nothing about files.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import socket
import ssl
import termios
import time
from collections.abc import Awaitable, Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from syncd.config import Config
from syncd.core import frames
from syncd.core.brokers import Broker, Rotation
from syncd.core.errors import SyncdError
from syncd.net import tls
from syncd.net.pahoio import MAX_PACKET, BufferedClient, qos0_publish

log = logging.getLogger("syncd.link")

CONNECT_TIMEOUT = 10.0  # seconds for TCP, TLS and CONNACK; then the next broker is tried
SUBSCRIBE_TIMEOUT = 10.0
# Delayed ACKs of ours meet Nagle on a broker without set_tcp_nodelay: its next small message
# waits for our ACK, up to 40 ms. Linux forgets TCP_QUICKACK, so it is set after every read.
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)
TOPIC_HEADS = 1024  # topics whose encoded form is kept (cleared past that)
READS_PER_WAKE = 64  # MQTT packets read per wake-up at most: a burst costs one loop turn
# Seconds of handling per wake-up at most: a peer's burst of heavy frames (manifests of
# thousands of entries cost 0.2-0.5 s each) must let the loop turn, or nothing else runs.
READ_BUDGET = 0.05


class LinkError(SyncdError):
    """The connection could not be made or was lost: the reason, as the log shows it."""


class Session:
    """One connection to one broker, driven from the event loop."""

    def __init__(self, config: Config, broker: Broker, will: tuple[str, bytes],
                 on_message: Callable[[str, bytes], None], max_queued: int) -> None:
        m = config.mqtt
        self._loop = asyncio.get_running_loop()
        self._broker = broker
        self._keepalive = m.keepalive
        self._on_message = on_message
        self._max_queued = max_queued
        self.queued = 0  # bytes handed to paho and not yet acknowledged by the broker
        self._sizes: dict[int, tuple[int, str]] = {}  # mid -> bytes and addressee, until PUBACK
        # Of `queued`, the bytes of frames addressed to one peer (answers: daemon/answers.py).
        self.queued_to: dict[str, int] = {}
        self.on_acked: Callable[[str], None] = _ignore  # an addressee's frame was acknowledged
        self._heads: dict[str, bytes] = {}  # topic -> its length and bytes (_write_now)
        self.dropped = 0  # publishes refused because the queue was full
        self._connected: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[str] = self._loop.create_future()  # -> why
        self._subscribing: dict[int, asyncio.Future[list[ReasonCode]]] = {}
        self._acked: dict[int, asyncio.Future[None]] = {}
        self._sock: Any = None
        self._writing = False
        self._reading = False  # inside paho's loop_read (and so inside its callbacks)
        self._abandoned = False  # open() gave up while the thread was still connecting
        self._misc: asyncio.TimerHandle | None = None
        c = BufferedClient(CallbackAPIVersion.VERSION2, client_id=config.client_id,
                        protocol=paho.MQTTv311, clean_session=True, reconnect_on_failure=False)
        mqtt_log = logging.getLogger("syncd.mqtt")
        if mqtt_log.isEnabledFor(logging.DEBUG):
            # paho logs every packet; its failures reach us as return codes and callbacks.
            c.enable_logger(mqtt_log)
        if m.username is not None:
            c.username_pw_set(m.username, config.password())
        context = tls.client_context(m)
        if context is not None:
            c.tls_set_context(context)
        c.will_set(will[0], will[1], qos=1, retain=True)
        c.max_inflight_messages_set(100)
        c.on_connect = self._connack
        c.on_disconnect = self._lost
        c.on_subscribe = self._suback
        c.on_publish = self._puback
        c.on_message = lambda _c, _u, msg: on_message(msg.topic, bytes(msg.payload))
        c.on_qos0 = on_message  # a live frame read whole: no message object (pahoio.py)
        c.on_socket_close = lambda _c, _u, _s: self._unwatch()
        self._client = c

    async def open(self) -> None:
        """TCP, TLS (in a thread: they block) and CONNACK; raises LinkError."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that comes as its
        # future completes, and a SIGTERM during a reconnect then left the daemon running,
        # connected, with its shutdown waiting for this task for good.
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await self._loop.run_in_executor(None, self._connect)
        except (TimeoutError, OSError, ssl.SSLError, ValueError) as e:
            self.abort()
            raise LinkError(_reason(e) or "connection timed out") from None
        self._sock = self._client.socket()
        if isinstance(self._sock, socket.socket):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._loop.add_reader(self._sock.fileno(), self._readable)
        self._pump()  # CONNECT may still be queued
        self._misc = self._loop.call_later(1.0, self._tick)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await asyncio.shield(self._connected)
        except TimeoutError:
            self.abort()
            raise LinkError("no CONNACK from the broker") from None
        except LinkError:
            self.abort()
            raise

    def _connect(self) -> None:
        # paho writes CONNECT here, in the thread: no socket callback is registered yet.
        self._client.connect(self._broker.host, self._broker.port, self._keepalive)
        if self._abandoned:
            _close(self._client.socket())

    async def subscribe(self, topics: list[str], qos: int) -> None:
        """All in one SUBSCRIBE (one round trip, however many peers): the SUBACK grants or
        refuses each filter."""
        if not topics:
            return
        rc, mid = self._client.subscribe([(topic, qos) for topic in topics])
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise LinkError(f"subscribe to {', '.join(topics)}: {paho.error_string(rc)}")
        done = self._subscribing[mid] = self._loop.create_future()
        self._pump()
        granted = await self._wait(done, SUBSCRIBE_TIMEOUT,
                                   f"no SUBACK for {', '.join(topics)}")
        if len(granted) != len(topics):
            raise LinkError(f"SUBACK with {len(granted)} codes for {len(topics)} filters")
        for topic, code in zip(topics, granted, strict=True):
            _check_granted(topic, [code])

    def unsubscribe(self, topics: list[str]) -> None:
        """Without waiting for the UNSUBACK: what still comes meanwhile is refused anyway."""
        for topic in topics:
            self._client.unsubscribe(topic)
        self._pump()

    async def publish_acked(self, topic: str, payload: bytes, within: float) -> None:
        """Publish retained and wait for the PUBACK (presence: it must be there)."""
        info = self._client.publish(topic, payload, qos=1, retain=True)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise LinkError(f"publish to {topic}: {paho.error_string(info.rc)}")
        done = self._acked[info.mid] = self._loop.create_future()
        if info.is_published():
            done.set_result(None)
        self._pump()
        await self._wait(done, within, f"no PUBACK for {topic}")

    def publish(self, topic: str, payload: bytes, retain: bool, qos: int, to: str = "") -> bool:
        size = len(payload)
        if self.queued + size > self._max_queued and self.queued:
            self.dropped += 1
            return False
        if qos == 0 and self._write_now(topic, payload, retain):
            return True
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            log.debug("publish to %s dropped: %s", topic, paho.error_string(info.rc))
            return False
        if not info.is_published():
            self._sizes[info.mid] = (size, to)
            self.queued += size
            if to:
                self.queued_to[to] = self.queued_to.get(to, 0) + size
        self._pump()
        return True

    def _write_now(self, topic: str, payload: bytes, retain: bool) -> bool:
        """A QoS 0 PUBLISH (a live batch) written to the socket here, not through paho's
        queue: paho builds a message info and a queue entry per publish, and once it is
        written calls on_publish with a new reason code and properties, most of a live
        frame's cost on this side. Only when paho holds nothing unwritten (order is kept);
        what the socket does not take now goes to the end of paho's queue, written next by
        the writer callback. False: not connected, or paho has bytes queued (it publishes)."""
        c = self._client
        if self._sock is None or c._out_packet or not c.is_connected():
            return False
        head = self._heads.get(topic)
        if head is None:
            name = topic.encode("utf-8")
            if not name:
                raise ValueError("Invalid topic.")
            c._raise_for_invalid_topic(name)  # as paho's publish would refuse it
            if len(self._heads) >= TOPIC_HEADS:
                self._heads.clear()
            head = self._heads[topic] = len(name).to_bytes(2, "big") + name
        if len(head) + len(payload) > MAX_PACKET:
            return False  # paho refuses it
        packet = qos0_publish(head, payload, retain)
        try:
            sent = self._sock.send(packet)
        except (OSError, ssl.SSLError):
            sent = 0  # would block, or the connection went: paho's write finds out
        if sent < len(packet):
            c._out_packet.append({"command": paho.PUBLISH, "mid": 0, "qos": 0, "pos": sent,
                                  "to_process": len(packet) - sent, "packet": packet,
                                  "info": paho.MQTTMessageInfo(0)})
            self._pump()
        return True

    async def _wait(self, fut: asyncio.Future[Any], within: float, what: str) -> Any:
        done, _ = await asyncio.wait([fut, self.closed], timeout=within,
                                     return_when=asyncio.FIRST_COMPLETED)
        if fut in done:
            return fut.result()
        if self.closed.done():
            raise LinkError(self.closed.result())
        raise LinkError(what)

    def close(self) -> None:
        """DISCONNECT cleanly (the will is not sent), then let go of the socket."""
        if self._sock is not None and not self.closed.done():
            self._client.disconnect()
            self._pump()
        self.abort()

    def abort(self) -> None:
        """Let go of the connection at once; this session is not used again."""
        self._abandoned = True
        if self._misc is not None:
            self._misc.cancel()
            self._misc = None
        self._unwatch()
        _close(self._client.socket())
        if not self.closed.done():
            self.closed.set_result("closed")

    # --- paho, driven from the loop -------------------------------------------------------

    def _readable(self) -> None:
        c = self._client
        self._reading = True
        until = time.monotonic() + READ_BUDGET
        try:
            for n in range(READS_PER_WAKE):
                # paho reads one packet per call, or a few: go on while bytes wait (in our
                # read buffer, or an SSL socket's decoded bytes: the next select() reports
                # neither).
                if c.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS or self._sock is None:
                    break
                if not (c.buffered() or (c.may_hold_more() and _unread(self._sock))
                        or getattr(self._sock, "pending", _nothing)()):
                    break
                if n == READS_PER_WAKE - 1 or time.monotonic() >= until:
                    # Go on at the next turn: what is buffered would not wake the selector.
                    asyncio.get_running_loop().call_soon(self._read_more)
                    break
        finally:
            self._reading = False
        if _QUICKACK is not None and self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        self._pump()

    def _read_more(self) -> None:
        if self._sock is not None and not self._reading:
            self._readable()

    def _pump(self) -> None:
        """Write what paho holds; watch for writability only while something is left."""
        c = self._client
        if self._sock is None or self._reading:
            # Never from inside paho's read: it runs our callbacks holding a lock that is not
            # reentrant, and a QoS 0 publish written whole takes it again (on_publish): the
            # daemon would hang for good. What they publish is written when the read is over.
            return
        if c.want_write():
            c.loop_write()
        if self._sock is None:
            return  # the write found the connection gone
        if c.want_write():
            if not self._writing:
                self._writing = True
                self._loop.add_writer(self._sock.fileno(), self._pump)
        elif self._writing:
            self._writing = False
            self._loop.remove_writer(self._sock.fileno())

    def _tick(self) -> None:
        self._client.loop_misc()  # keepalive: PINGREQ, and a broker that stopped answering
        self._pump()
        if self._sock is not None and not self.closed.done():
            self._misc = self._loop.call_later(1.0, self._tick)

    def _unwatch(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
                if self._writing:
                    self._loop.remove_writer(sock.fileno())
        self._writing = False

    # --- paho's callbacks ------------------------------------------------------------------

    def _connack(self, _c: Any, _u: Any, _flags: Any, rc: ReasonCode, _p: Any = None) -> None:
        if not self._connected.done():
            if rc.is_failure:
                self._connected.set_exception(LinkError(f"[code:{rc.value}] {rc}"))
            else:
                self._connected.set_result(None)

    def _lost(self, _c: Any, _u: Any, _flags: Any, rc: ReasonCode, _p: Any = None) -> None:
        if not self._connected.done():
            self._connected.set_exception(LinkError(f"connection lost before CONNACK: {rc}"))
        if not self.closed.done():
            self.closed.set_result(f"connection lost: {rc}" if rc.is_failure else "closed")
        self._unwatch()

    def _suback(self, _c: Any, _u: Any, mid: int, codes: list[ReasonCode], _p: Any) -> None:
        fut = self._subscribing.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(codes)

    def _puback(self, _c: Any, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
        size, to = self._sizes.pop(mid, (0, ""))
        self.queued -= size
        fut = self._acked.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
        if to:
            left = self.queued_to[to] - size
            if left > 0:
                self.queued_to[to] = left
            else:
                del self.queued_to[to]
            self.on_acked(to)


class Link:
    def __init__(
        self,
        config: Config,
        on_message: Callable[[str, bytes], None],
        on_connected: Callable[[], Awaitable[None]],
        seal: Callable[[str, bool, int], bytes],
        subscriptions: Callable[[], list[str]],
    ) -> None:
        self._config = config
        self._subscriptions = subscriptions  # the topics to listen to now (peers may change)
        self._subscribed: list[str] = []  # those of the current session
        self._seal = seal  # (topic, online, connection number) -> signed presence frame
        self._on_message = on_message
        # A frame addressed to a peer was acknowledged, or its session ended (answers.py).
        self.on_acked: Callable[[str], None] = _ignore
        self._on_connected = on_connected
        self._session: Session | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0
        # Counts this run's connections: presence is ordered by it (core/freshness.py).
        self.conn = 0
        m = config.mqtt
        self._rotation = Rotation(m.endpoints, m.reconnect_min, m.reconnect_max)
        self.switches = 0  # connections made to another broker than the one before
        self._last_broker: Broker | None = None  # the broker of the last connection made
        self._presence_topic = frames.presence_topic(m.topic_prefix, config.node)
        self._dropped = 0  # publishes dropped on a full outgoing queue, ended sessions
        # Messages read while the connection is being set up (retained positions arrive as
        # soon as we subscribe): handled once it is up, when what they make us send can go.
        self._held: list[tuple[str, bytes]] | None = None

    @property
    def broker(self) -> str:
        """The broker in use (connected, or being tried): host:port."""
        return str(self._rotation.current)

    @property
    def brokers(self) -> list[str]:
        return [str(b) for b in self._rotation.brokers]

    @property
    def queued(self) -> int:
        """Bytes published and not yet acknowledged by the broker."""
        return self._session.queued if self._session is not None else 0

    def queued_to(self, peer: str) -> int:
        """Of those, the bytes of frames addressed to `peer`."""
        return self._session.queued_to.get(peer, 0) if self._session is not None else 0

    def _acked_to(self, peer: str) -> None:
        self.on_acked(peer)

    @property
    def dropped(self) -> int:
        """Publishes dropped because max_queued_bytes were waiting, since start."""
        return self._dropped + (self._session.dropped if self._session is not None else 0)

    async def run(self) -> None:
        m = self._config.mqtt
        failing: dict[Broker, str] = {}  # broker -> last failure logged, during an outage
        attempts = 0
        while True:
            self.conn += 1
            conn = self.conn
            broker = self._rotation.current
            # The will describes the end of connection `conn`: it supersedes that
            # connection's online presence, and nothing later (core/freshness.py).
            will = (self._presence_topic, self._seal(self._presence_topic, False, conn))
            session = Session(self._config, broker, will, self._handle, m.max_queued_bytes)
            session.on_acked = self._acked_to
            self._held = []
            try:
                await session.open()
                self._session = session
                self._subscribed = self._subscriptions()
                await session.subscribe(self._subscribed, m.subscribe_qos)
                await session.publish_acked(
                    self._presence_topic, self._seal(self._presence_topic, True, conn),
                    CONNECT_TIMEOUT)
                self._connected_to(broker, attempts)
                failing.clear()
                attempts = 0
                self.connected.set()
                if self._subscriptions() != self._subscribed:
                    await self.resubscribe()  # a reload changed [peers] while we subscribed
                await self._on_connected()
                held, self._held = self._held or [], None
                for topic, payload in held:
                    self._handle(topic, payload)
                why = await asyncio.shield(session.closed)  # a cancel must not cancel it
                raise LinkError(why)
            except LinkError as e:
                self._ended(session)
                attempts += 1
                self.reconnects += 1
                rounds = self._rotation.failed_rounds
                delay = self._rotation.failed()
                self._log_failure(broker, str(e), failing, delay,
                                  rounds == 0 and self._rotation.failed_rounds == 1)
                await asyncio.sleep(delay)
            finally:
                self._ended(session)

    def _ended(self, session: Session) -> None:
        self.connected.clear()
        self._held = None
        if self._session is session:
            self._session = None
            self._dropped += session.dropped
        session.abort()
        for peer in list(session.queued_to):
            self.on_acked(peer)  # nothing of that session is held any more

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

    def _handle(self, topic: str, payload: bytes) -> None:
        if self._held is not None:
            self._held.append((topic, payload))
            return
        try:
            self._on_message(topic, payload)
        except Exception:
            # One bad message must not take the link down.
            log.exception("error handling message on %s", topic)

    async def resubscribe(self) -> None:
        """Listen to what `subscriptions()` says now (peers added or removed by a reload): the
        retained positions of an added peer arrive at once. Not connected: the next connection
        subscribes to the new list anyway."""
        session = self._session
        if session is None or not self.connected.is_set():
            return
        wanted = self._subscriptions()
        added = [t for t in wanted if t not in self._subscribed]
        removed = [t for t in self._subscribed if t not in wanted]
        self._subscribed = wanted
        if added:
            # Everyone's presence again, first: an added peer's retained presence carries the
            # run key its sealed positions need (the node drops the others' repeats unread).
            added = [f"{self._config.mqtt.topic_prefix}/n/+", *added]
        session.unsubscribe(removed)
        try:
            await session.subscribe(added, self._config.mqtt.subscribe_qos)
        except LinkError as e:
            # Deaf to the new peers while "connected" is no state to stay in: the next
            # connection subscribes to the whole list, or fails and says so.
            log.warning("subscribing to the peers a reload added failed (%s); reconnecting", e)
            session.abort()

    def publish(self, topic: str, payload: bytes, retain: bool = False, qos: int = 1,
                to: str = "") -> bool:
        """Hand a publish to the connection, in call order, without waiting for it.

        We never wait for a PUBACK: nothing depends on one message arriving (anti-entropy
        repairs losses). paho keeps QoS 1 in order and queues past its in-flight window; the
        session refuses more than max_queued_bytes unacknowledged (a slow broker must not
        grow our memory without limit). `to`: the peer it is addressed to (queued_to).
        """
        session = self._session
        if session is None or not self.connected.is_set():
            return False
        return session.publish(topic, payload, retain, qos, to)

    async def close(self) -> None:
        """Say goodbye cleanly (presence offline, retained) if connected."""
        session = self._session
        if session is not None and self.connected.is_set():
            with contextlib.suppress(LinkError):
                await session.publish_acked(
                    self._presence_topic,
                    self._seal(self._presence_topic, False, self.conn), within=2)
            session.close()


def _check_granted(topic: str, granted: tuple[int, ...] | list[ReasonCode]) -> None:
    """A refused subscription leaves us deaf while 'connected': count it as a failed connection
    (the next broker is tried), never as a success."""
    codes = [g if isinstance(g, int) else g.value for g in granted]
    if any(c >= 0x80 for c in codes):
        raise LinkError(f"subscription to {topic} refused (SUBACK 0x{max(codes):02x}): "
                                "check the broker's ACL (syncd check-config --broker)")


def _unread(sock: Any) -> int:
    """Bytes received and not read yet (FIONREAD)."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    except (OSError, ValueError):
        return 0
    return buf[0]


def _ignore(_peer: str) -> None:
    pass


def _nothing() -> int:
    return 0


def _close(sock: Any) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


def _reason(e: BaseException) -> str:
    return str(e) or type(e).__name__  # "[Errno 111] Connection refused", as operators grep


def _refused_credentials(reason: str) -> bool:
    text = reason.lower()
    return any(w in text for w in ("not authori", "bad user name or password", "bad username"))
