"""End to end: nested instances, odd names and two profiles' roots, between three real hosts.

Discovery alone is tested in test_discovery_node.py. Replicating these keys also needs topics
that carry an encoding of key and file names (wire format v3: frames.level).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from tests.daemon.test_nats import nats_daemons
from tests.support import nats
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines

LONG = "大" * 40  # 120 bytes of UTF-8
# (profile, path below its runtimes root): what Ishiki creates, all of it while syncd runs.
INSTANCES = [
    ("alice", "onebot_123/group_456"),
    ("alice", "main"),
    ("alice", "cross_大厅"),
    ("alice", "matrix_@bot_example.org_!room_example.org"),
    ("alice", "x+y#z"),
    ("alice", "onebot_123 456"),
    ("alice", "UPPER.lower"),
    ("alice", f"onebot_123/{LONG}"),
    ("bob", "main"),  # a second profile, created while syncd runs
    ("bob", "onebot_9/group_1"),
]


def with_profiles(d: Daemon) -> Daemon:
    """Point the daemon at <root>/profiles/*/runtimes instead of one runtimes directory."""
    (d.root / "profiles").mkdir()
    d.edit_config(f'runtimes_dir = "{d.runtimes}"',
                  f'runtimes_dir = "{d.root}/profiles/*/runtimes"')
    return d


def memory(d: Daemon, profile: str, rel: str) -> Path:
    return d.root / "profiles" / profile / "runtimes" / rel / "events.jsonl"


def append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)  # one write(2), like the reference writer's appendFile
    finally:
        os.close(fd)


def digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def test_nested_and_odd_keys_of_two_profiles_are_byte_identical_on_three_hosts(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    hosts = [with_profiles(make_daemon(n, broker, start=False)) for n in ("a", "b", "c")]
    for d in hosts:
        d.start()
    replicate_every_instance(hosts)


def test_the_same_on_nats_each_host_on_another_cluster_member(tmp_path: Path,
                                                             nats_server: str) -> None:
    """NATS refuses '.', ' ' and wildcards in topics: the encoded levels carry these names."""
    with nats.NatsCluster(tmp_path / "nats", binary=nats_server) as cluster:
        hosts = [with_profiles(d) for d in nats_daemons(tmp_path, cluster)]
        try:
            for d in hosts:
                d.start()
            replicate_every_instance(hosts)
        finally:
            for d in hosts:
                d.kill()


def replicate_every_instance(hosts: list[Daemon]) -> None:
    a, b, _ = hosts
    # alice's bot runs on a, bob's on b: each instance has one writer.
    writer = {"alice": a, "bob": b}
    for profile, rel in INSTANCES:
        append(memory(writer[profile], profile, rel), ishiki_lines(3))

    def identical() -> bool:
        return all(
            digest(memory(writer[p], p, r)) is not None
            and digest(memory(writer[p], p, r)) == digest(memory(d, p, r))
            for p, r in INSTANCES for d in hosts)

    wait_until(identical, 30, "every instance byte-identical on a, b and c")
    expected = {f"{p}/{r}" for p, r in INSTANCES}

    def all_in_sync() -> bool:
        return all({f["key"] for f in d.status()["files"] if f["state"] == "in_sync"}
                   == expected for d in hosts)

    wait_until(all_in_sync, 15, "every host to list every key in_sync")
