"""A private RabbitMQ node with its MQTT plugin: a broker that is known NOT to carry syncd.

RabbitMQ's MQTT plugin keeps retained messages, but (3.10, Debian 12's) hands them only to a
subscription that names the exact topic, never to one with a wildcard, and keeps them per node
of a cluster. syncd reads presence and positions through wildcard filters (`P/n/+`,
`P/p/<peer>/+/+`), so on RabbitMQ a host never learns its peers' state. The tests show the
broker's behaviour with a raw client and that `syncd check-config --broker` says so.

The node is started from Debian's package (`rabbitmq-server`) as a process of the test's own:
its own node name, ports, data, log and Erlang cookie under the test's directory, and its own
epmd on a free port (never the machine's), stopped with the node. tests/run.sh does not
install RabbitMQ (it is not a broker syncd supports); the tests skip where it is absent.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType

from tests.support.cluster import free_port, wait_until
from tests.support.nats import mqtt_accepts

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def installed() -> bool:
    return SERVER.exists() and bool(glob.glob("/usr/lib/rabbitmq/lib/*/plugins/rabbitmq_mqtt*"))


def _epmd() -> str:
    found = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))
    if not found:
        raise RuntimeError("epmd not found (it comes with rabbitmq-server's erlang)")
    return found[-1]


class RabbitMQ:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mqtt_port = free_port()
        self.epmd_port = free_port()
        amqp_port, dist_port = free_port(), free_port()
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{amqp_port}\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
            "mqtt.allow_anonymous = true\n"
            "loopback_users = none\n")
        (self.dir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir),
            "LANG": "C.UTF-8", "RABBITMQ_NODENAME": f"syncd-test-{self.mqtt_port}@localhost",
            "RABBITMQ_NODE_PORT": str(amqp_port), "RABBITMQ_DIST_PORT": str(dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.mqtt_port}"

    def __enter__(self) -> RabbitMQ:
        out = (self.dir / "server.out").open("ab")
        self.proc = subprocess.Popen([str(SERVER)], stdout=out, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError("rabbitmq-server exited: " + (self.dir / "server.out")
                                   .read_text(errors="replace")[-2000:])
            return mqtt_accepts(self.mqtt_port)

        try:
            wait_until(up, 90, "RabbitMQ to accept MQTT connections", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # the node and its helpers
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # any helper that outlived it
            self.proc = None
        # The node started its own epmd (daemonised, outside the group): stop that one only.
        subprocess.run([_epmd(), "-port", str(self.epmd_port), "-kill"], capture_output=True,
                       timeout=10, check=False)
