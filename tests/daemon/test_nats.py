"""NATS as a second reference broker: the harness itself (raw paho-mqtt), then syncd on it."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import nats
from tests.support.chaos import Writer
from tests.support.cluster import Daemon, wait_until
from tests.support.files import KEY, append, content
from tests.support.ishiki import ishiki_lines, write_log


@pytest.fixture
def cluster(tmp_path: Path, nats_server: str) -> Iterator[nats.NatsCluster]:
    with nats.NatsCluster(tmp_path / "nats", binary=nats_server) as c:
        yield c


def test_retained_messages_are_served_by_every_member_and_survive_losing_one(
    cluster: nats.NatsCluster,
) -> None:
    one, two, three = (m.mqtt_port for m in cluster.members)
    nats.publish(one, "test/syncd/pos/a/k/f", b"first", retain=True)
    # Member 3 learns it through the replicated $MQTT_rmsgs stream, not at once.
    wait_until(lambda: nats.retained(three, "test/syncd/pos/a/k/f", 0.5) == b"first", 10,
               "member 3 to serve the retained message published on member 1")
    cluster.kill(0)
    assert not cluster.members[0].running()
    with pytest.raises((ConnectionError, OSError)):
        nats.client(one)
    # The survivors elect new leaders for what member 1 led (~10 s), then catch up.
    wait_until(cluster.settled, 60, "the two survivors to lead every MQTT stream, both current",
               interval=0.2)
    # Both serve it.
    for port in (two, three):
        wait_until(lambda port=port: nats.retained(port, "test/syncd/pos/a/k/f", 0.5), 30,
                   f"the member on port {port} to serve the retained message")
        assert nats.retained(port, "test/syncd/pos/a/k/f") == b"first"
    # Two members of three still form a quorum: a retained message published now is kept.
    nats.publish(two, "test/syncd/pos/b/k/f", b"second", retain=True)
    # It may not be served until the lost member is back: on 2.15 each member learns retained
    # messages (its own clients' too) from a consumer of its own on $MQTT_rmsgs, which can
    # stall when that stream's leader moves. Once member 1 is back, all three serve it.
    cluster.start_member(0)
    for port in (one, two, three):
        wait_until(lambda port=port: nats.retained(port, "test/syncd/pos/b/k/f", 0.5)
                   == b"second", 30, f"the member on port {port} to serve what was retained "
                                     "on member 2 while member 1 was down")
    assert nats.retained(one, "test/syncd/pos/a/k/f") == b"first"


def test_live_messages_cross_members_and_nats_refuses_spaces_in_topics(
    cluster: nats.NatsCluster,
) -> None:
    one, _, three = (m.mqtt_port for m in cluster.members)
    got: list[tuple[str, bytes]] = []
    sub = nats.client(three)
    try:
        sub.on_message = lambda c, u, m: got.append((m.topic, m.payload))
        sub.subscribe("test/syncd/live/#", qos=1)
        wait_until(lambda: (nats.publish(one, "test/syncd/live/a/k/f", b"ping"), got)[1], 10,
                   "a live message published on member 1 to reach a subscriber on member 3")
        assert got[0] == ("test/syncd/live/a/k/f", b"ping")
        # NATS closes the connection of a client that publishes on a topic with a space, and
        # 2.9 one with a '.' too (newer servers carry '.' as '//' in the NATS subject): why
        # syncd's topic levels are encodings of names, not the names.
        refused = ["test/syncd/live/a/k/events jsonl"]
        dotted = "test/syncd/live/a/k/events.jsonl"
        if cluster.version < (2, 10):
            refused.append(dotted)
        else:
            nats.publish(one, dotted, b"dot")
            wait_until(lambda: (dotted, b"dot") in got, 10,
                       f"nats-server {cluster.version} to carry a topic with a '.'")
        for topic in refused:
            c = nats.client(one)
            try:
                c.publish(topic, b"x", qos=1)
                wait_until(lambda c=c: not c.is_connected(), 5,
                           f"NATS to close a connection that published on {topic!r}")
            finally:
                c.loop_stop()
    finally:
        sub.disconnect()
        sub.loop_stop()


# --- syncd on NATS ---------------------------------------------------------------------------
#
# NATS refuses a '.' in a topic; since wire format v3, syncd's topic levels are encodings of
# names (events.jsonl travels as ~mv3gk3tuomxgu43pnzwa), so it runs on NATS with real names.


def nats_daemons(root: Path, cluster: nats.NatsCluster, file: str = "events.jsonl"
                 ) -> list[Daemon]:
    """a, b, c, each listing every member, starting with a different one: a on member 1 ..."""
    ends = cluster.endpoints
    return [Daemon(root, node, None, brokers=ends[i:] + ends[:i],
                   extra=f'files = ["{file}"]\n', mqtt_extra="subscribe_qos = 0\n")
            for i, node in enumerate("abc")]


def same(file: str, writer: Daemon, *others: Daemon) -> bool:
    expected = content(writer.path(KEY, file))
    return all(content(d.path(KEY, file)) == expected for d in others)


def test_three_hosts_on_three_members_replicate_byte_identically(
    tmp_path: Path, cluster: nats.NatsCluster
) -> None:
    file = "events.jsonl"
    a, b, c = daemons = nats_daemons(tmp_path, cluster, file)
    try:
        for d in daemons:
            d.start(wait=False)
        for d, member in zip(daemons, cluster.endpoints, strict=True):
            wait_until(lambda d=d: d.status()["connected"], 30, f"{d.node} to connect")
            assert d.status()["broker"] == member  # each on its own member
        for n in (1, 5, 50):
            append(a.path(KEY, file), ishiki_lines(n))
        append(a.path(KEY, file), b'{"bytes":"\xff\xfe not utf-8"}\n')
        wait_until(lambda: same(file, a, b, c), 20, "b and c to hold a's bytes")
        digest = hashlib.sha256(content(a.path(KEY, file))).hexdigest()
        for d in (b, c):
            assert hashlib.sha256(content(d.path(KEY, file))).hexdigest() == digest
            wait_until(lambda d=d: d.file_status(KEY, file).get("state") == "in_sync", 10,
                       f"{d.node} in_sync")
        # And the other way: c writes, through member 3, and a and b get it.
        append(c.path(KEY, file), ishiki_lines(7))
        wait_until(lambda: same(file, c, a, b), 20, "a and b to hold c's bytes")
    finally:
        for d in daemons:
            d.kill()


def test_a_catch_up_in_full_size_answers_fits_nats_max_payload(
    tmp_path: Path, cluster: nats.NatsCluster
) -> None:
    # Answers of fill_bytes (1000 KiB by default), with header and key wrap, below NATS's
    # max_payload of 1 MB (1 MiB): a standby several MB behind gets them across members.
    file = "events.jsonl"
    a, b, _ = nats_daemons(tmp_path, cluster, file)
    try:
        src = a.path(KEY, file)
        write_log(src, 6_000_000)
        a.start()
        b.start()
        wait_until(lambda: same(file, a, b), 60, "b to catch up with a")
        st = a.file_status(KEY, file)
        assert st["served_bytes"] / st["served_frames"] > 500_000, st  # not 256 KiB frames
    finally:
        a.kill()
        b.kill()


def test_killing_the_writers_member_moves_it_to_another_with_nothing_lost(
    tmp_path: Path, cluster: nats.NatsCluster
) -> None:
    file = "events.jsonl"
    a, b, c = daemons = nats_daemons(tmp_path, cluster, file)
    writer = Writer(a.path(KEY, file), rate=50)
    lag = {"bytes": 0, "seconds": 0.0}
    watching = threading.Event()

    def watch() -> None:  # what the writer's status says of its peers, every 50 ms
        while watching.is_set():
            try:
                for p in a.file_status(KEY, file).get("peers", {}).values():
                    lag["bytes"] = max(lag["bytes"], p.get("lag_bytes", 0))
                    lag["seconds"] = max(lag["seconds"], p.get("lag_seconds", 0.0))
            except AssertionError:
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        for d in daemons:
            d.start(wait=False)
        for d in daemons:
            wait_until(lambda d=d: d.status()["connected"], 30, f"{d.node} to connect")
        assert a.status()["broker"] == cluster.endpoints[0]
        writer.start()
        writer.resume()
        wait_until(lambda: len(content(b.path(KEY, file))) > 5000, 20, "replication to run")
        watching.set()
        watcher.start()
        cluster.kill(0)  # the member the writer uses
        moved = wait_until(lambda: (s := a.status())["connected"] and
                           s["broker"] != cluster.endpoints[0] and s, 40,
                           "the writer to move to another member")
        assert moved["broker"] in cluster.endpoints[1:]
        assert moved["broker_switches"] == 1
        size_at_move = len(content(a.path(KEY, file)))
        wait_until(lambda: len(content(b.path(KEY, file))) > size_at_move, 30,
                   "b to receive bytes written after the move")
        writer.pause()
        wait_until(lambda: same(file, a, b, c), 30, "every copy to equal the writer's")
        watching.clear()
        watcher.join(5)
        for d in (b, c):
            wait_until(lambda d=d: d.file_status(KEY, file).get("state") == "in_sync", 10,
                       f"{d.node} in_sync")
        # The outage showed: peers lagged behind the writer while it had no broker ...
        assert lag["bytes"] > 0 and lag["seconds"] > 0, lag
        print(f"writer moved from {cluster.endpoints[0]} to {moved['broker']}; peak lag seen "
              f"by the writer: {lag['bytes']} B, {lag['seconds']:.2f} s")
        # ... and is gone now.
        wait_until(lambda: all(p["lag_bytes"] == 0 for p in
                               a.file_status(KEY, file)["peers"].values()), 10,
                   "the writer to see no lag")
        assert "switched broker: connected to" in a.read_log()
    finally:
        writer.stop()
        watching.clear()
        for d in daemons:
            d.kill()


def test_the_shipped_member_config_is_valid(tmp_path: Path, nats_server: str) -> None:
    """config/nats-cluster.conf, as nats-server reads it (TLS files left out: none here)."""
    shipped = Path(__file__).parents[2] / "config" / "nats-cluster.conf"
    text = shipped.read_text()
    start = text.index("  tls {\n    cert_file")
    text = text[:start] + text[text.index("  }\n", start) + 4:]
    conf = tmp_path / "member.conf"
    conf.write_text(text.replace("/var/lib/nats/jetstream", str(tmp_path / "js")))
    checked = subprocess.run([nats_server, "-c", str(conf), "-t"], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "stream_replicas: 3" in shipped.read_text()
    assert "max_ack_pending: 4000" in shipped.read_text()
