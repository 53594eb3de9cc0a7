"""Real parts for the end-to-end tests: Mosquitto brokers on free ports and syncd processes."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from syncd.core.identity import Identity, identity_from_seed
from syncd.disk.keyfile import write_identity
from syncd.ops.control import ControlError, query


def node_identity(node: str, generation: str = "") -> Identity:
    """A deterministic signing key per node name (and `generation`, for a rotated key)."""
    return identity_from_seed(hashlib.sha256(f"syncd-test:{node}:{generation}".encode())
                              .digest())


# Ports handed out by free_port in this process: a port is free until its server binds it,
# and the kernel may hand the same one out twice meanwhile (a NATS member got one port as its
# client and its cluster port, and exited).
_HANDED_OUT: set[int] = set()
# Below the kernel's ephemeral range (32768-60999 by default), where no outgoing connection
# can take a port between free_port() and the bind of the server it is for.
_PORTS = range(20000, 32000)
_RANDOM = random.Random()  # its own: a test that seeds `random` must not pick our ports


def free_port() -> int:
    """A loopback TCP port nobody listens on, never the same twice in one process."""
    while True:
        port = _RANDOM.choice(_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.01) -> Any:
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(found).exists():
        raise RuntimeError("mosquitto is not installed (tests/run.sh installs it)")
    return found


class Broker:
    """A private Mosquitto on a free loopback port; can be stopped and started again."""

    def __init__(self, workdir: Path, max_queued_messages: int = 1000,
                 extra: str = "", config: Callable[[int], str] | None = None) -> None:
        """`config(port)`, when given, is the whole mosquitto.conf, listening on `port`."""
        self.port = free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(config(self.port) if config else
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            f"max_queued_messages {max_queued_messages}\n"
            "persistence false\n"
            "set_tcp_nodelay true\n"
            f"{extra}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "mosquitto.log").open("ab")
        self.proc = subprocess.Popen([mosquitto_binary(), "-c", str(self.conf)], stdout=log,
                                     stderr=subprocess.STDOUT)

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {(self.dir / 'mosquitto.log').read_text()}")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until(listening, 10, "mosquitto to listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _where(broker: Broker | None, brokers: Sequence[str]) -> str:
    if brokers:
        return f"brokers = [{', '.join(json.dumps(b) for b in brokers)}]\n"
    assert broker is not None
    return f'host = "127.0.0.1"\nport = {broker.port}\n'


class Daemon:
    """One `syncd run` process with its own runtimes and state directories.

    [peers] lists the usual test node names and every daemon made under the same `root`,
    each with its deterministic test key, as an operator would list every host; a daemon made
    with `listed=False` is in nobody's [peers] but its own.
    """

    USUAL_NODES = ("a", "b", "c", "d", "e", "x", "host-a", "host-b", "host-c")

    _clusters: ClassVar[dict[Path, list[Daemon]]] = {}

    TEST_TUNING = "sweep_interval = 0.2\nrequest_timeout = 1.0\n"

    def __init__(self, root: Path, node: str, broker: Broker | None, extra: str = "",
                 tuning: str = TEST_TUNING, log_level: str = "debug",
                 env: dict[str, str] | None = None, listed: bool = True,
                 mqtt_extra: str = "", args: Sequence[str] = (),
                 brokers: Sequence[str] = (), prefix: Sequence[str] = ()) -> None:
        """`brokers`: ["host:port", ...] for `[mqtt] brokers`, instead of `broker`'s port;
        `prefix`: a command that runs `syncd run` (e.g. `ip netns exec NS`)."""
        self.node = node
        self.prefix = list(prefix)
        self.connect_timeout = 15.0  # start(): seconds to wait for the broker connection
        self.log_level = log_level
        self.args = list(args)  # more `syncd run` options
        self.env = env or {}
        self.root = root / node
        self.runtimes = self.root / "runtimes"
        self.state = self.root / "state"
        self.runtimes.mkdir(parents=True, exist_ok=True)
        self.identity_file = self.root / "identity.key"
        self.identity = node_identity(node)
        write_identity(self.identity_file, self.identity)
        self.listed = listed
        self.config = self.root / "syncd.toml"
        self._config_text = (
            f'node = "{node}"\n'
            f'runtimes_dir = "{self.runtimes}"\n'
            f'state_dir = "{self.state}"\n'
            f'identity_file = "{self.identity_file}"\n'
            f"{tuning}"
            f"{extra}\n"
            "[mqtt]\n"
            f"{_where(broker, brokers)}"
            'topic_prefix = "test/syncd"\n'
            "reconnect_min = 0.05\n"
            "reconnect_max = 0.5\n"
            f"{mqtt_extra}"
        )
        siblings = self._clusters.setdefault(root, [])
        siblings[:] = [d for d in siblings if d.node != node]
        siblings.append(self)
        for each in siblings:
            each.write_config()
        self.log = self.root / "syncd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def peers(self) -> dict[str, str]:
        """[peers] as written: every listed daemon of this cluster, and this one."""
        cluster = self._clusters[self.root.parent]
        unlisted = {d.node for d in cluster if not d.listed and d is not self}
        peers = {n: node_identity(n).public for n in self.USUAL_NODES if n not in unlisted}
        peers.update((d.node, d.identity.public) for d in cluster if d.listed or d is self)
        return peers

    def write_config(self, peers: dict[str, str] | None = None) -> None:
        """(Re)write the config; `peers` replaces the [peers] table (default: the cluster)."""
        lines = "".join(f'"{n}" = "{k}"\n' for n, k in (peers or self.peers()).items())
        # Keep edits a test made to the file itself: only the [peers] table is rewritten.
        text = self.config.read_text() if self.config.exists() else self._config_text
        text = text.split("\n[peers]\n")[0]
        self.config.write_text(text + "\n[peers]\n" + lines)

    def edit_config(self, old: str, new: str) -> None:
        """Replace `old` by `new` in the config (siblings made later rewrite [peers] only)."""
        text = self.config.read_text()
        assert old in text, old
        self.config.write_text(text.replace(old, new))

    def path(self, key: str, file: str = "events.jsonl") -> Path:
        return self.runtimes / key / file

    def start(self, wait: bool = True) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "syncd", "run", "--config", str(self.config),
             "--log-level", self.log_level, *self.args],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        if wait:
            wait_until(lambda: self.status()["connected"], self.connect_timeout,
                       f"{self.node} to connect")

    def status(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.node} exited with {self.proc.returncode}:\n"
                                 f"{self.log.read_text()[-3000:]}")
        try:
            return query(self.state / "syncd.sock", "status", timeout=5)["status"]
        except ControlError:
            return {"connected": False, "files": [], "peers": {}}

    def file_status(self, key: str, file: str = "events.jsonl") -> dict[str, Any]:
        for f in self.status()["files"]:
            if f["key"] == key and f["file"] == file:
                return f
        return {}

    def stop(self) -> None:
        """SIGTERM and wait; a daemon still running 15 s later is made to print every thread's
        stack to its log (SIGUSR1, syncd/ops/stall.py), killed, and the wait fails."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(1)
                self.kill()
                raise AssertionError(f"{self.node} did not stop within 15 s of SIGTERM; its "
                                     f"stacks are at the end of {self.log}") from None
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def reload(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")
