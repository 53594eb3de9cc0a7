"""systemd: sd_notify against a real datagram socket, the unit file's sandbox score."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from syncd.ops.systemd import EXTEND_START_USEC, Notifier, keep_informed, summary
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines

UNIT = Path(__file__).parents[2] / "systemd" / "syncd.service"


class NotifySocket:
    """What systemd would receive: every datagram sent to $NOTIFY_SOCKET, in order."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setblocking(False)
        self.messages: list[dict[str, str]] = []

    def drain(self) -> list[dict[str, str]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return self.messages
            self.messages.append(dict(line.split("=", 1) for line in data.decode().split("\n")))

    def first(self, name: str, value: str | None = None) -> int | None:
        """Index of the first message with NAME (=value), after draining."""
        for i, m in enumerate(self.drain()):
            if name in m and (value is None or m[name] == value):
                return i
        return None

    def close(self) -> None:
        self.sock.close()


def test_notifier_speaks_to_abstract_and_path_sockets(tmp_path: Path) -> None:
    for address in (f"@syncd-test-{id(tmp_path)}", str(tmp_path / "notify")):
        listener = NotifySocket(address)
        n = Notifier.from_env({"NOTIFY_SOCKET": address})
        assert n.ready("1 file, 0 diverged, 0 behind, broker connected")
        assert n.watchdog()
        assert n.stopping()
        n.close()
        got = wait_until(lambda listener=listener: len(listener.drain()) == 3 and listener.messages)
        assert got == [
            {"READY": "1", "STATUS": "1 file, 0 diverged, 0 behind, broker connected"},
            {"WATCHDOG": "1"},
            {"STOPPING": "1", "STATUS": "stopping"},
        ]
        listener.close()


def test_notifier_outside_systemd_and_watchdog_meant_for_another_process() -> None:
    assert not Notifier.from_env({}).enabled
    assert not Notifier.from_env({}).ready("x")
    assert Notifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}
                             ).watchdog_interval == 15.0
    other = Notifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000",
                               "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None
    # Nobody listening: a notification is lost, never an exception.
    assert not Notifier.from_env({"NOTIFY_SOCKET": "@syncd-test-nobody-listens"}).watchdog()


def test_status_line() -> None:
    files = [{"state": s} for s in ("in_sync", "in_sync", "behind", "diverged", "reset",
                                     "paused")]
    assert summary({"files": files, "connected": True, "broker": "b:1883"}) == (
        "6 files, 1 diverged, 1 behind, 1 reset, 1 paused, broker b:1883 connected")
    assert summary({"files": files[:1], "connected": False, "broker": "b:1883"}) == (
        "1 file, 0 diverged, 0 behind, broker b:1883 DISCONNECTED")


def test_start_timeout_is_extended_while_files_are_checked_and_only_before_ready(
    tmp_path: Path,
) -> None:
    listener = NotifySocket(str(tmp_path / "notify"))
    notifier = Notifier(str(tmp_path / "notify"), watchdog_usec=20_000)  # a tick every 10 ms
    # One state per tick; at tick 6 the daemon says READY, then a late file is checked.
    script = ["verifying"] * 3 + ["in_sync"] * 3 + ["verifying"] * 3
    ticks = iter(range(len(script) + 1))
    done = asyncio.Event()

    def status() -> dict[str, Any]:
        listener.drain()  # a datagram socket queues only a few messages
        tick = next(ticks)
        if tick == 6:
            notifier.ready("ready")
        if tick == len(script) - 1:
            done.set()
        return {"files": [{"state": script[min(tick, len(script) - 1)]}], "connected": True,
                "broker": "b:1883"}

    async def scenario() -> None:
        informer = asyncio.create_task(keep_informed(notifier, status))
        await done.wait()
        informer.cancel()

    asyncio.run(scenario())
    notifier.close()
    extend = {"EXTEND_TIMEOUT_USEC": str(EXTEND_START_USEC)}
    verifying = {"STATUS": "1 file, 0 diverged, 0 behind, 1 verifying, broker b:1883 "
                           "connected"}
    in_sync = {"STATUS": "1 file, 0 diverged, 0 behind, broker b:1883 connected"}
    dog = {"WATCHDOG": "1"}
    assert listener.drain() == [
        dog, extend, verifying, dog, extend, dog, extend,
        dog, in_sync, dog, dog,
        dog, {"READY": "1", "STATUS": "ready"}, verifying, dog, dog,
    ]
    listener.close()


def test_run_notifies_ready_only_once_connected_then_status_watchdog_stopping(
    tmp_path: Path,
) -> None:
    listener = NotifySocket(str(tmp_path / "notify"))
    broker = Broker(tmp_path / "broker")  # not started yet: syncd must wait for it
    daemon = Daemon(tmp_path, "a", broker, env={"NOTIFY_SOCKET": str(tmp_path / "notify"),
                                                "WATCHDOG_USEC": "200000"})
    path = daemon.path("bot-1")
    path.parent.mkdir(parents=True)
    path.write_bytes(ishiki_lines(3))
    try:
        daemon.start(wait=False)
        wait_until(lambda: listener.first("STATUS", "1 file, 0 diverged, 0 behind, broker "
                                          f"127.0.0.1:{broker.port} DISCONNECTED") is not None,
                   10, "a status line saying the broker is not connected")
        assert listener.first("READY") is None
        broker.start()
        wait_until(lambda: listener.first("READY", "1") is not None, 10, "READY=1")
        ready = listener.first("READY", "1")
        assert ready is not None
        assert listener.messages[ready]["STATUS"] == ("1 file, 0 diverged, 0 behind, "
                                                      f"broker 127.0.0.1:{broker.port} "
                                                      "connected")
        assert daemon.status()["connected"]
        wait_until(lambda: sum("WATCHDOG" in m for m in listener.drain()) >= 3, 5,
                   "watchdog pings")
        daemon.stop()
        stopping = listener.first("STOPPING", "1")
        assert stopping is not None and stopping > ready
    finally:
        daemon.kill()
        broker.stop()
        listener.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_unit_sandbox_rates_ok() -> None:
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNIT)],
                         capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", out.stdout)
    assert found, out.stdout + out.stderr
    assert float(found.group(1)) <= 1.5, out.stdout
    assert found.group(2) == "OK"


def test_unit_essentials() -> None:
    unit = UNIT.read_text()
    for line in ("Type=notify", "WatchdogSec=30s", "Restart=on-failure",
                 "ExecReload=/usr/bin/syncd reload --config /etc/syncd/syncd.toml",
                 "User=syncd", "ProtectSystem=strict",
                 "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service",
                 "LimitNOFILE=65536\n"):
        assert line in unit
    # syncd reads /proc/sys/fs/inotify and /proc/sys/user: ProcSubset=pid would hide them.
    assert "\nProcSubset=" not in unit


def test_sigterm_while_waiting_for_the_broker_stops_at_once(tmp_path: Path) -> None:
    listener = NotifySocket(str(tmp_path / "notify"))
    broker = Broker(tmp_path / "broker")  # never started
    daemon = Daemon(tmp_path, "a", broker, env={"NOTIFY_SOCKET": str(tmp_path / "notify")})
    try:
        daemon.start(wait=False)
        wait_until(lambda: "unreachable" in daemon.read_log(), 10, "a failed connection")
        assert daemon.proc is not None
        proc = daemon.proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert listener.first("STOPPING", "1") is not None
        assert listener.first("READY") is None
    finally:
        daemon.kill()
        listener.close()
