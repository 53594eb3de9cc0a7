"""Network partitions for the end-to-end tests: hosts in network namespaces, links to cut.

    with Net("part") as net:                     # a namespace for the broker
        broker = net.broker(tmp_path / "broker")  # Mosquitto inside it
        a = net.host("a")                        # a namespace for host a, joined to the
                                                 # broker's by a veth pair
        d = Daemon(..., brokers=[a.broker_address(broker)], prefix=a.exec)
        a.cut(); a.heal()                        # ip link set down / up
        a.netem("delay 100ms loss 5%")           # tc netem, where the kernel has it
        a.throttle("2mbit")                      # tc tbf, everywhere

Every address lives inside a namespace this module creates (10.213.<n>.0/30 per link), so
nothing touches the machine's own interfaces, routes or loopback; closing the Net deletes the
namespaces and with them every veth. Needs root and iproute2 (`ip`, `tc`): `require()` skips
the test with the reason otherwise. `tc netem` needs the kernel's sch_netem, which some
kernels (containers) lack: `netem()` then raises NetemUnavailable, and tests skip on it.

A daemon inside a namespace is still reached from the test through its control socket (a
path in the file system: Unix sockets do not belong to network namespaces).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest

from tests.support.cluster import Broker, mosquitto_binary, wait_until

_SEQ = itertools.count(1)


class NetemUnavailable(RuntimeError):
    """The kernel has no sch_netem (tc says 'Specified qdisc kind is unknown')."""


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def require() -> None:
    """Skip the calling test, saying why, where namespaces cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (iproute2; tests/run.sh installs it)")
    probe = f"sdprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as e:
        pytest.skip(f"cannot create a network namespace here: {e}")
    ip("netns", "del", probe)


def netem_missing() -> str | None:
    """Why `tc netem` cannot be used here (None: it can): tried on a veth inside a throwaway
    namespace."""
    probe = f"sdnetem{os.getpid()}"
    ip("netns", "add", probe)
    try:
        ip("-n", probe, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        done = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "d0", "root", "netem",
                               "delay", "1ms"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"tc netem unavailable here (the kernel's sch_netem): {done.stderr.strip()}"
        return None
    finally:
        ip("netns", "del", probe)


@dataclass
class Host:
    net: Net
    name: str
    index: int
    ns: str = ""
    links_down: bool = False

    @property
    def exec(self) -> list[str]:
        """The prefix that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns]

    @property
    def address(self) -> str:
        return f"10.213.{self.index}.2"

    @property
    def broker_side(self) -> str:
        """The broker namespace's address on this host's link."""
        return f"10.213.{self.index}.1"

    def broker_address(self, broker: Broker) -> str:
        return f"{self.broker_side}:{broker.port}"

    def cut(self) -> None:
        """Take the link down (both ends): every packet between host and broker is lost."""
        ip("-n", self.ns, "link", "set", "eth0", "down")
        ip("-n", self.net.ns, "link", "set", f"h{self.index}", "down")
        self.links_down = True

    def heal(self) -> None:
        ip("-n", self.net.ns, "link", "set", f"h{self.index}", "up")
        ip("-n", self.ns, "link", "set", "eth0", "up")
        self.links_down = False
        wait_until(self.reachable, 10, f"{self.name}'s link to come back up")

    def reachable(self) -> bool:
        """Both ends of the link up and carrying (operstate UP)."""
        return ("state UP" in ip("-n", self.ns, "link", "show", "eth0")
                and "state UP" in ip("-n", self.net.ns, "link", "show", f"h{self.index}"))

    def throttle(self, rate: str) -> None:
        """Limit the link to `rate` (e.g. "2mbit") both ways with a token bucket (tc tbf: in
        every kernel, unlike netem); "" removes it."""
        for ns, dev in ((self.ns, "eth0"), (self.net.ns, f"h{self.index}")):
            if not rate:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True, check=False)
                continue
            done = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                                   "tbf", "rate", rate, "burst", "16kbit", "latency", "1s"],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"tc tbf {rate}: {done.stderr.strip()}")

    def netem(self, spec: str) -> None:
        """`tc netem` on both ends, e.g. "delay 100ms 20ms loss 5%"; "" removes it."""
        for ns, dev in ((self.ns, "eth0"), (self.net.ns, f"h{self.index}")):
            if not spec:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True, check=False)
                continue
            done = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                                   "netem", *spec.split()], capture_output=True, text=True,
                                  check=False)
            if "qdisc kind is unknown" in done.stderr:
                raise NetemUnavailable("this kernel has no sch_netem (tc netem): "
                                       f"{done.stderr.strip()}")
            if done.returncode != 0:
                raise RuntimeError(f"tc netem {spec}: {done.stderr.strip()}")


@dataclass
class Net:
    """A namespace holding the broker, and one namespace per host linked to it."""

    tag: str
    ns: str = ""
    hosts: dict[str, Host] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Unique per process and per Net: several test runs may share the machine.
        self._base = f"sd{os.getpid()}-{next(_SEQ)}-{self.tag}"[:40]
        self.ns = self._add_ns("brk")

    def _add_ns(self, suffix: str) -> str:
        name = f"{self._base}-{suffix}"
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        h = Host(self, name, index)
        h.ns = self._add_ns(name)
        # The pair is made inside the host's namespace, its other end moved straight into the
        # broker's: no interface ever appears in the machine's own namespace.
        ip("-n", h.ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"h{index}",
           "netns", self.ns)
        ip("-n", h.ns, "addr", "add", f"{h.address}/30", "dev", "eth0")
        ip("-n", self.ns, "addr", "add", f"{h.broker_side}/30", "dev", f"h{index}")
        ip("-n", h.ns, "link", "set", "eth0", "up")
        ip("-n", self.ns, "link", "set", f"h{index}", "up")
        wait_until(h.reachable, 10, f"{name}'s link to come up")
        self.hosts[name] = h
        return h

    def broker(self, workdir: Path, extra: str = "") -> Broker:
        """A Mosquitto inside the broker namespace, on every address of that namespace only."""
        b = NsBroker(self, workdir, extra)
        b.start()
        return b

    def __enter__(self) -> Net:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for name in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self._namespaces.clear()


class NsBroker(Broker):
    def __init__(self, net: Net, workdir: Path, extra: str = "") -> None:
        self.net = net
        # Every address of the broker's namespace: the links' broker ends and its loopback.
        super().__init__(workdir, config=lambda port: (
            f"listener {port}\nallow_anonymous true\npersistence false\n"
            f"set_tcp_nodelay true\n{extra}"))

    def start(self) -> None:
        log_path = self.dir / "mosquitto.log"
        log = log_path.open("ab")
        start = log_path.stat().st_size
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.net.ns, mosquitto_binary(),
                                      "-c", str(self.conf)], stdout=log,
                                     stderr=subprocess.STDOUT)

        def running() -> bool:
            assert self.proc is not None
            text = log_path.read_bytes()[start:].decode(errors="replace")
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {text}")
            return " running" in text

        wait_until(running, 10, "mosquitto to run in its namespace")
