"""The resources shell on real files (no daemon): what it serves is what it announced, and
what it announces is durable first (issue #23, cases 1 and 8)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from syncd.core import frames
from syncd.core.frames import Kind
from syncd.core.resources import PeerItem, PeerManifest, ResourceMachine, Rules
from syncd.core.spot import Spot
from syncd.daemon import resourcefiles
from syncd.daemon.resourcefiles import ResourceFiles

NAME = "artifacts/t/x"


class Host:
    """Collects what the shell sends (and what it refuses) in order."""

    def __init__(self, trail: list[tuple[str, Any]] | None = None) -> None:
        self.trail = trail if trail is not None else []
        self.unsafe: list[tuple[str, str]] = []

    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None:
        self.trail.append(("send", (kind, payload, to)))

    def note_unsafe(self, path: str, kind: str, reason: str) -> None:
        self.unsafe.append((path, kind))

    async def answer_room(self, peer: str) -> None:
        pass

    def sent(self, kind: Kind) -> list[Any]:
        return [p for what, (k, p, _) in ((w, x) for w, x in self.trail if w == "send")
                if k is kind]


async def until(cond: Callable[[], Any], within: float = 5.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while not (value := cond()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
    return value


def shell(tmp_path: Path, host: Host) -> ResourceFiles:
    root = tmp_path / "rt"
    (root / "bot-1" / "resources" / "artifacts" / "t").mkdir(parents=True, exist_ok=True)
    machine = ResourceMachine("a", Rules(), None, chunk_bytes=4, window=64, timeout=1.0)
    machine.peers["b"] = PeerManifest(online=True)
    return ResourceFiles(host, "bot-1", Spot(root, ("bot-1", "resources")),
                         tmp_path / "state" / "resources.json", machine)


def announced(host: Host) -> dict[str, bytes]:
    out = {}
    for have in host.sent(Kind.RHAVE):
        for e in have.entries:
            out[e.name] = e.digest
    return out


def test_a_file_changed_after_it_was_announced_is_not_served_but_announced_anew(
    tmp_path: Path
) -> None:
    async def run() -> None:
        host = Host()
        r = shell(tmp_path, host)
        path = r.folder.path / NAME
        path.write_bytes(b"the first version")
        r.start()
        await until(lambda: r.loaded)
        first = hashlib.sha256(b"the first version").digest()
        assert announced(host) == {NAME: first}
        # The writer (or a bot) rewrites it in place: same size, other bytes.
        with path.open("r+b") as f:
            f.write(b"THE OTHER VERSION")
        r.deliver(PeerItem("b", frames.ResAsk(NAME, first, 0, 17)))
        refusal = await until(lambda: host.sent(Kind.RREFUSE))
        assert refusal == [frames.ResRefuse(NAME, first, None, "changed here since it was "
                                            "announced; looking again")]
        assert host.sent(Kind.RDATA) == []  # not one byte of what was not announced
        other = hashlib.sha256(b"THE OTHER VERSION").digest()
        await until(lambda: announced(host) == {NAME: other})  # re-hashed, re-announced
        assert r.serves_refused == 1
        r.deliver(PeerItem("b", frames.ResAsk(NAME, other, 0, 17)))
        await until(lambda: sum(len(c.data) for c in host.sent(Kind.RDATA)) == 17)
        assert b"".join(c.data for c in host.sent(Kind.RDATA)) == b"THE OTHER VERSION"
        await r.stop()

    asyncio.run(run())


def test_a_file_reached_through_a_swapped_directory_is_not_served(tmp_path: Path) -> None:
    async def run() -> None:
        host = Host()
        r = shell(tmp_path, host)
        (r.folder.path / NAME).write_bytes(b"the bot's decoy")
        secret = tmp_path / "secret" / "t"
        secret.mkdir(parents=True)
        (secret / "x").write_bytes(b"the bot's decoy")  # same bytes, even: not ours to send
        r.start()
        await until(lambda: r.loaded)
        digest = hashlib.sha256(b"the bot's decoy").digest()
        artifacts = r.folder.path / "artifacts"
        os.rename(artifacts, artifacts.with_name("moved"))
        artifacts.symlink_to(tmp_path / "secret")
        r.deliver(PeerItem("b", frames.ResAsk(NAME, digest, 0, 15)))
        await until(lambda: host.sent(Kind.RREFUSE))
        assert host.sent(Kind.RDATA) == []
        assert (str(artifacts), "symlink") in host.unsafe
        await r.stop()

    asyncio.run(run())


def test_a_new_file_is_durable_file_then_directory_before_it_is_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trail: list[tuple[str, Any]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        trail.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(resourcefiles.os, "fsync", fsync)

    async def run() -> None:
        host = Host(trail)
        r = shell(tmp_path, host)
        path = r.folder.path / NAME
        r.start()
        await until(lambda: r.loaded)
        path.write_bytes(b"published by rename, never synced by its writer")
        r.hint(str(path))
        await until(lambda: NAME in announced(host))
        await r.stop()

    asyncio.run(run())
    path = tmp_path / "rt" / "bot-1" / "resources" / NAME
    steps = [(w, x) for w, x in trail
             if w == "fsync" or (x[0] is Kind.RHAVE and any(e.name == NAME
                                                            for e in x[1].entries))]
    assert steps[:3] == [("fsync", str(path)), ("fsync", str(path.parent)),
                         steps[2]] and steps[2][0] == "send", steps


def test_files_below_a_directory_that_became_unreadable_are_kept_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run() -> None:
        host = Host()
        r = shell(tmp_path, host)
        (r.folder.path / NAME).write_bytes(b"held")
        (r.folder.path / "artifacts" / "u").mkdir()
        (r.folder.path / "artifacts" / "u" / "y").write_bytes(b"also held")
        r.start()
        await until(lambda: r.loaded)
        assert set(r.machine.local) == {NAME, "artifacts/u/y"}
        real = os.listdir
        locked = str(r.folder.path / "artifacts" / "u")

        def listdir(fd: int) -> list[str]:  # as for a mode 000 directory (root reads those)
            if os.readlink(f"/proc/self/fd/{fd}") == locked:
                raise PermissionError(13, "Permission denied")
            return real(fd)

        monkeypatch.setattr(resourcefiles.tree.os, "listdir", listdir)
        (r.folder.path / "artifacts" / "z").write_bytes(b"new")
        r.hint()
        await until(lambda: "artifacts/z" in r.machine.local)  # the scan went on
        assert "artifacts/u/y" in r.machine.local  # not taken for gone
        assert [p.to_json() for p in r.problems] == [
            {"path": "artifacts/u", "kind": "unreadable",
             "reason": "cannot list: Permission denied"}]
        assert (locked, "unreadable") in host.unsafe
        await r.stop()

    asyncio.run(run())
