"""Network partitions: a syncd host cut off from the broker, then healed (support/netns.py)."""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines

# A silent broker is given up after one to two keepalives, and the broker marks a silent host
# offline (its will) after 1.5: 2 s keeps each cut to a few seconds.
FAST = "keepalive = 2\n"


@pytest.fixture
def net(tmp_path: Path) -> Iterator[tuple[netns.Net, Broker]]:
    netns.require()
    with netns.Net("part") as n:
        broker = n.broker(tmp_path / "broker")
        try:
            yield n, broker
        finally:
            broker.stop()


def hosts(tmp_path: Path, net: netns.Net, broker: Broker, *names: str) -> list[Daemon]:
    made = []
    for name in names:
        h = net.host(name)
        d = Daemon(tmp_path, name, None, brokers=[h.broker_address(broker)], mqtt_extra=FAST,
                   prefix=h.exec)
        d.start()
        made.append(d)
    return made


def status_cli(d: Daemon) -> str:
    """What `syncd status` prints for people on that host."""
    return subprocess.run([sys.executable, "-m", "syncd", "status", "--config", str(d.config)],
                          capture_output=True, text=True, check=False, timeout=30).stdout


def peer(d: Daemon, name: str) -> dict[str, object]:
    found: dict[str, object] = d.file_status(KEY).get("peers", {}).get(name, {})
    return found


def test_a_cut_standby_is_shown_disconnected_and_behind_then_catches_up(
    tmp_path: Path, net: tuple[netns.Net, Broker]
) -> None:
    n, broker = net
    a, b = hosts(tmp_path, n, broker, "a", "b")
    try:
        append(a.path(KEY), ishiki_lines(20))
        wait_equal(content(a.path(KEY)), b)
        n.hosts["b"].cut()
        append(a.path(KEY), ishiki_lines(30))  # written while b cannot hear
        wait_until(lambda: not b.status()["connected"], 10, "b to say it is disconnected")
        assert "(DISCONNECTED)" in status_cli(b).splitlines()[0]
        assert b.status()["broker"] == n.hosts["b"].broker_address(broker)
        wait_until(lambda: not a.status()["peers"]["b"]["online"], 10, "a to see b offline")
        lag = wait_until(lambda: (p := peer(a, "b")) and p["lag_bytes"] and p, 10,
                         "a to show b behind")
        assert not lag["online"]
        assert content(b.path(KEY)) != content(a.path(KEY))  # nothing crossed the cut
        n.hosts["b"].heal()
        wait_equal(content(a.path(KEY)), b)
        wait_state(b, "in_sync")
        wait_until(lambda: (p := peer(a, "b")) and p["online"] and p["lag_bytes"] == 0, 10,
                   "a to see b online and caught up")
    finally:
        for d in (a, b):
            d.kill()


def test_a_cut_writer_keeps_writing_and_every_copy_converges_after_the_heal(
    tmp_path: Path, net: tuple[netns.Net, Broker]
) -> None:
    n, broker = net
    a, b, c = hosts(tmp_path, n, broker, "a", "b", "c")
    try:
        append(a.path(KEY), ishiki_lines(10))
        wait_equal(content(a.path(KEY)), b, c)
        n.hosts["a"].cut()
        for _ in range(20):
            append(a.path(KEY), ishiki_lines(3))  # the bot goes on writing on a
        wait_until(lambda: not a.status()["connected"], 10, "a to say it is disconnected")
        for d in (b, c):
            wait_until(lambda d=d: not d.status()["peers"]["a"]["online"], 10,
                       f"{d.node} to see a offline")
            wait_state(d, "in_sync")  # with what it heard: a's new bytes are unknown to it
        head = status_cli(a).splitlines()[0]
        assert head.startswith(f"node a  broker {n.hosts['a'].broker_address(broker)} "
                               "(DISCONNECTED)"), head
        n.hosts["a"].heal()
        wait_equal(content(a.path(KEY)), b, c)
        for d in (a, b, c):
            wait_state(d, "in_sync")
    finally:
        for d in (a, b, c):
            d.kill()


def test_a_slow_lossy_link_still_converges(
    tmp_path: Path, net: tuple[netns.Net, Broker]
) -> None:
    n, broker = net
    why = netns.netem_missing()
    if why:
        pytest.skip(why)
    a, b = hosts(tmp_path, n, broker, "a", "b")
    try:
        n.hosts["b"].netem("delay 50ms 10ms loss 5%")
        for _ in range(10):
            append(a.path(KEY), ishiki_lines(20))
        wait_equal(content(a.path(KEY)), b, timeout=30)
        n.hosts["b"].netem("")
    finally:
        for d in (a, b):
            d.kill()


def test_a_throttled_link_delays_but_loses_nothing(
    tmp_path: Path, net: tuple[netns.Net, Broker]
) -> None:
    n, broker = net
    a, b = hosts(tmp_path, n, broker, "a", "b")
    try:
        n.hosts["b"].throttle("2mbit")  # ~250 KB/s: the backlog below takes about 2 s
        for _ in range(6):
            append(a.path(KEY), ishiki_lines(200))  # ~80 KB each
        total = len(content(a.path(KEY)))
        lag = wait_until(lambda: (p := peer(a, "b")) and p["lag_bytes"] and p, 10,
                         "a to see b lag behind the throttled link")
        assert 0 < int(str(lag["lag_bytes"])) <= total
        wait_equal(content(a.path(KEY)), b, timeout=30)
        wait_state(b, "in_sync")
        n.hosts["b"].throttle("")
    finally:
        for d in (a, b):
            d.kill()


class Written:
    """What the writer had written by when: (time its write(2) returned, the file's size
    then) pairs, kept by the writing thread. The writer's file, not its syncd's status: a
    byte the bot wrote counts from that moment, before the writer's syncd has read it."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = [(0.0, 0)]

    def append(self, path: Path, data: bytes) -> None:
        append(path, data)
        self.samples.append((time.time(), path.stat().st_size))

    def by(self, t: float) -> int:
        """The most the writer is known to have written by time t."""
        i = bisect.bisect_right(self.samples, (t, float("inf"))) - 1
        return self.samples[i][1]


def test_no_false_ready_under_partitions_with_a_small_broker_queue(tmp_path: Path) -> None:
    """A standby cut off while the writer writes throughout, through a broker whose queue
    drops what it cannot hold (max_queued_messages 10): cuts shorter than the broker's
    keepalive (the connection survives, and the broker dropped frames meanwhile: positions
    among them) and longer ones (reconnections). Whenever the standby says READY, it holds
    every byte the writer had made durable a second before."""
    netns.require()
    with netns.Net("fresh") as n:
        broker = n.broker(tmp_path / "broker", extra="max_queued_messages 10\n")
        a = b = None
        stop = threading.Event()
        try:
            a, b = hosts(tmp_path, n, broker, "a", "b")
            turn = "e061c676-0701-4e5c-b2c8-565cf9462c91"  # ishiki_lines' turn: started here
            start = {"id": "s", "type": "event", "data": {"type": "turn.start", "turnId": turn},
                     "timestamp": 1793531049900, "turnId": turn}
            append(a.path(KEY), json.dumps(start).encode() + b"\n" + ishiki_lines(5))
            wait_equal(content(a.path(KEY)), b)

            written = Written()

            def write() -> None:  # ~300 KB/s: the broker's queue overflows during a cut
                while not stop.is_set():
                    written.append(a.path(KEY), ishiki_lines(10))
                    stop.wait(0.01)

            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            yes, false_yes = 0, []

            def sample(seconds: float) -> None:
                nonlocal yes
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    asked = time.time()
                    f = b.file_status(KEY) if b is not None else {}
                    if f.get("ready") is True:
                        yes += 1
                        need = written.by(asked - 1.0)
                        if int(f["size"]) < need:
                            false_yes.append((asked, int(f["size"]), need))
                    time.sleep(0.02)

            sample(2)
            for cut in (0.7, 1.5, 2.5, 5.0):  # the broker gives a silent client 3 s
                n.hosts["b"].cut()
                sample(cut)
                n.hosts["b"].heal()
                sample(3)
            stop.set()
            writer.join()
            # The writer stops: the standby catches up and says READY, with every byte.
            try:
                wait_until(lambda: b is not None and b.file_status(KEY).get("ready") is True
                           and content(b.path(KEY)) == content(a.path(KEY)), 30,
                           "b ready with every byte once the writer stopped")
            except AssertionError:
                raise AssertionError(f"b: {b.file_status(KEY) if b else None}; a's copy "
                                     f"{len(content(a.path(KEY)))}, b's "
                                     f"{len(content(b.path(KEY))) if b else 0}; "
                                     f"b peers {b.status()['peers'] if b else None}") from None
            print(f"READY yes {yes} times, false yes {len(false_yes)}; the writer's "
                  f"restatements: {a.status()['restatements']}")
            assert false_yes == [], f"{len(false_yes)} false yes of {yes}: {false_yes[:5]}"
            assert yes > 0
        finally:
            stop.set()
            for d in (a, b):
                if d is not None:
                    d.kill()
            broker.stop()
