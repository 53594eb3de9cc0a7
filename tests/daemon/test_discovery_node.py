"""Discovery in a real Host (in this process) against a real broker and real files.

Nested instances, odd names and several roots are found at start, by the watcher's hints and
by the sweep alone (watch = false), and what cannot be replicated is named: log, status,
`syncd status`, `syncd check-config`. That the replicas then replicate between hosts needs the
wire format that encodes names in topics: see test_keys_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from syncd.config import load_config
from syncd.daemon.host import Host
from syncd.disk.keyfile import write_identity
from syncd.ops.controlserver import ControlServer
from tests.support.cluster import Broker, node_identity
from tests.support.ishiki import ishiki_lines

LONG = "大" * 40  # 120 bytes of UTF-8
AT_START = ["main", "onebot_123/group_456", "cross_大厅",
            "matrix_@bot_example.org_!room_example.org/x+y#z", f"onebot_123 456/{LONG}"]
LATER = ["onebot_123/group_789", "UPPER.lower", f"{LONG}/{LONG}", "a/b/c/d"]
BAD = os.fsdecode(b"bad\xff")  # a directory name that is not UTF-8


def write_config(tmp: Path, broker: Broker, runtimes: str, watch: bool) -> Path:
    write_identity(tmp / "identity.key", node_identity("a"))
    config = tmp / "syncd.toml"
    # With the watcher on, the sweep is made too slow to find anything within a test: what is
    # found was found by a hint.
    config.write_text(
        f'node = "a"\nruntimes_dir = {runtimes}\nstate_dir = "state"\n'
        'identity_file = "identity.key"\n'
        f"watch = {'true' if watch else 'false'}\n"
        f"sweep_interval = {3600 if watch else 0.1}\n"
        f'[mqtt]\nport = {broker.port}\ntopic_prefix = "test/syncd"\n'
        f'[peers]\nb = "{node_identity("b").public}"\n')
    return config


def put(folder: Path, lines: int = 2) -> int:
    """Append Ishiki lines to folder/events.jsonl the way the writer does; the new size."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "events.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, ishiki_lines(lines))
    finally:
        os.close(fd)
    return path.stat().st_size


@contextlib.asynccontextmanager
async def running(config: Path) -> AsyncIterator[Host]:
    node = Host(load_config(config))
    node.services.append(ControlServer(node))
    ready = asyncio.Event()
    task = asyncio.create_task(node.run(ready.set))
    waiting = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiting], timeout=20, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done():
        task.result()  # raises what stopped it
    assert ready.is_set(), "the node did not become ready within 20 s"
    try:
        yield node
    finally:
        node.stop()
        await asyncio.wait_for(task, 20)


async def eventually(check: Callable[[], Any], what: str, seconds: float = 10) -> Any:
    """Poll `check` on the loop until it returns something truthy; fail naming `what`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not (value := check()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def loaded(node: Host, sizes: dict[str, int]) -> bool:
    """Every key in `sizes` has a loaded replica that holds that many bytes (and no others)."""
    files = {f["key"]: f for f in node.status()["files"]}
    return set(files) == set(sizes) and all(
        files[k]["state"] == "alone" and files[k]["size"] == size for k, size in sizes.items())


@pytest.mark.parametrize("watch", [True, False], ids=["watcher", "sweep"])
def test_nested_and_odd_instances_are_found_at_start_and_while_running(
    tmp_path: Path, broker: Broker, watch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    rt = tmp_path / "runtimes"
    sizes = {key: put(rt / key) for key in AT_START}
    put(rt / "main" / "resources" / "artifacts")  # inside an instance: never an instance
    put(rt / BAD)
    config = write_config(tmp_path, broker, f'"{rt}"', watch)

    async def scenario() -> None:
        async with running(config) as node:
            await eventually(lambda: loaded(node, sizes), f"the replicas of {AT_START}")
            for key in LATER:  # created while syncd runs
                sizes[key] = put(rt / key)
            (rt / "onebot_123" / "empty").mkdir()
            await eventually(lambda: loaded(node, sizes), f"the replicas of {LATER}")
            assert node.status()["skipped"] == [{
                "key": "bad\\xff", "path": f"{rt}/bad\\xff",
                "reason": "component 'bad\\xff': not valid UTF-8"}]

    with caplog.at_level(logging.ERROR, "syncd.node"):
        asyncio.run(scenario())
    assert (f"{rt}/bad\\xff: key bad\\xff is not replicated: component 'bad\\xff': not valid "
            "UTF-8") in caplog.messages
    records = tmp_path / "state" / "files"
    assert (records / "onebot_123%2Fgroup_789" / "events.jsonl.json").is_file()
    assert (records / "cross_%E5%A4%A7%E5%8E%85" / "events.jsonl.json").is_file()


@pytest.mark.parametrize("watch", [True, False], ids=["watcher", "sweep"])
def test_profiles_under_a_glob_are_roots_with_prefixed_keys(
    tmp_path: Path, broker: Broker, watch: bool
) -> None:
    profiles = tmp_path / "profiles"
    sizes = {"alice/onebot_123/group_456": put(profiles / "alice/runtimes/onebot_123/group_456")}
    config = write_config(tmp_path, broker, f'"{profiles}/*/runtimes"', watch)

    async def scenario() -> None:
        async with running(config) as node:
            await eventually(lambda: loaded(node, sizes), "alice's instance")
            sizes["alice/main"] = put(profiles / "alice/runtimes/main")
            (profiles / "bob").mkdir()  # a new profile: its runtimes come a moment later
            (profiles / "bob" / "runtimes").mkdir()
            sizes["bob/main"] = put(profiles / "bob/runtimes/main")
            sizes["bob/onebot_9/group_1"] = put(profiles / "bob/runtimes/onebot_9/group_1")
            await eventually(lambda: loaded(node, sizes), "bob's instances")
            assert node.config.key_dir("bob/main") == profiles / "bob" / "runtimes" / "main"

    asyncio.run(scenario())


def test_status_and_check_config_name_what_is_not_replicated(
    tmp_path: Path, broker: Broker
) -> None:
    rt = tmp_path / "runtimes"
    put(rt / "onebot_123" / "group_456")
    put(rt / BAD / "chan")
    put(rt / "a/b/c/d/e")  # too deep: check-config names it, the daemon never looks there
    (rt / "linked").symlink_to(rt / "onebot_123")
    config = write_config(tmp_path, broker, f'"{rt}"', watch=False)

    def syncd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "syncd", *args, "--config", str(config)],
                              capture_output=True, text=True, timeout=60)

    check = syncd("check-config")
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines() == [
        f"config OK: node a, 1 key found under {rt}, up to 4 levels deep",
        "3 directories skipped, not replicated:",
        f"  {rt}/a/b/c/d/e (key a/b/c/d/e): 5 levels below its root (instances are found at "
        "most 4 levels deep)",
        f"  {rt}/bad\\xff/chan (key bad\\xff/chan): component 'bad\\xff': not valid UTF-8",
        f"  {rt}/linked (key linked): a symbolic link: not followed (an instance must be a "
        "directory of its own below the root)",
    ]

    async def scenario() -> subprocess.CompletedProcess[str]:
        async with running(config) as node:
            await eventually(lambda: len(node.status()["skipped"]) == 2, "two skipped")
            return await asyncio.to_thread(syncd, "status")

    status = asyncio.run(scenario())
    assert status.returncode == 1  # a directory that cannot be replicated is a problem
    lines = status.stdout.splitlines()
    assert lines[2].split()[:4] == ["KEY", "FILE", "SIZE", "STATE"]
    assert lines[3].split()[:2] == ["onebot_123/group_456", "events.jsonl"]
    assert [line.split()[:5] for line in lines[4:6]] == [
        ["bad\\xff/chan", "-", "-", "error", "no"],
        ["linked", "-", "-", "error", "no"],
    ]
    assert (f"bad\\xff/chan: ERROR: not replicated ({rt}/bad\\xff/chan): component 'bad\\xff': "
            "not valid UTF-8") in lines
    assert lines[-1].endswith("; 2 directories NOT REPLICATED (error, see above)")


def test_a_peers_key_cannot_lead_through_a_link_or_below_the_depth_bound(
    tmp_path: Path, broker: Broker
) -> None:
    rt = tmp_path / "runtimes"
    outside = tmp_path / "outside"
    outside.mkdir()
    rt.mkdir()
    (rt / "linked").symlink_to(outside)
    config = write_config(tmp_path, broker, f'"{rt}"', watch=False)

    async def scenario() -> None:
        async with running(config) as node:
            # What the node does with the key of a peer's frame (or of `syncd adopt`).
            assert node.instances.task("linked/chan", "events.jsonl") is None
            assert node.instances.task("a/b/c/d/e", "events.jsonl") is None
            assert node.instances.task("ok/chan", "events.jsonl") is not None
            refused = {s["key"]: s for s in node.status()["skipped"]}
            assert refused["linked/chan"] == {
                "key": "linked/chan", "path": None,
                "reason": f"{rt}/linked is a symbolic link (not followed)"}
            assert refused["a/b/c/d/e"]["reason"] == "5 levels below its root (at most 4)"
            assert "ok/chan" not in refused

    asyncio.run(scenario())
    assert list(outside.iterdir()) == []
