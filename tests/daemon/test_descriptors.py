"""Nothing the local bot plants under an instance makes syncd read, serve or write outside it,
or stop (issue #23, cases 1 and 7), with real daemons, a real Mosquitto and real files.

The bot owns its instance's directories: it may make `resources/` a symbolic link to syncd's
own files, swap `resources/artifacts` for one while syncd hashes a big file (it can see that
with inotify), grow a tree 1100 levels deep or make a directory syncd cannot read. The
private key of host a must never reach host b; the instance, and `syncd run` at a restart,
must go on.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syncd.disk import inotify
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, wait_equal
from tests.support.ishiki import ishiki_lines
from tests.support.ishiki_writer import put_artifact, shake_line

INCLUDE_ALL = '[resources]\ninclude = ["*"]\n'
IN_OPEN = 0x00000020


def files_holding(top: Path, secret: bytes) -> list[Path]:
    """Every regular file below `top` whose bytes contain `secret` (no link followed)."""
    found = []
    for folder, _, names in os.walk(top):
        for n in names:
            p = Path(folder) / n
            if p.is_symlink() or not p.is_file():
                continue
            try:
                if secret in p.read_bytes():
                    found.append(p)
            except OSError:
                continue
    return found


def leaked(a: Daemon, b: Daemon) -> list[Path]:
    """Files of host b that hold host a's private key."""
    secret = a.identity_file.read_bytes()
    return files_holding(b.runtimes, secret) + files_holding(b.state, secret)


def resources_of(d: Daemon, key: str = KEY) -> dict[str, object]:
    for r in d.status().get("resources", []):
        if r["key"] == key:
            return dict(r)
    return {}


def unsafe(d: Daemon) -> dict[str, object]:
    found: dict[str, object] = d.status().get("unsafe_paths", {})
    return found


def refused(d: Daemon, path: Path, kind: str) -> bool:
    recent = unsafe(d).get("recent", [])
    assert isinstance(recent, list)
    return any(u["path"] == str(path) and u["kind"] == kind for u in recent)


def test_a_resources_directory_linked_to_syncds_own_files_hands_out_none_of_them(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 1 without a race: with `include = ["*"]`, `resources -> <the directory that holds
    syncd's>` made syncd hash, announce and serve a/identity.key, and b install it."""
    a = make_daemon("a", broker, start=False, extra=INCLUDE_ALL)
    b = make_daemon("b", broker, extra=INCLUDE_ALL)
    append(a.path(KEY), ishiki_lines(3))
    linked = a.runtimes / KEY / "resources"
    assert a.identity_file == tmp_path / "a" / "identity.key"
    linked.symlink_to(tmp_path)  # a/identity.key, a/syncd.toml, a/state/, ...
    a.start()
    wait_equal(a.path(KEY).read_bytes(), b)
    wait_until(lambda: leaked(a, b) or refused(a, linked, "symlink"), 20,
               f"a to refuse {linked} (or b to get a's key)")
    # A file of another instance, written now, reaches b: the hosts did exchange resources.
    control = put_artifact(a.runtimes / "bot-2", "shake", "s1.log", b"bot-2's own output\n")
    append(a.path("bot-2"), shake_line("s1", control))
    got = b.runtimes / "bot-2" / "resources" / "artifacts" / "shake" / "s1.log"
    wait_until(lambda: got.is_file() and got.read_bytes() == b"bot-2's own output\n", 20,
               "bot-2's artifact on b")
    assert leaked(a, b) == []
    res = resources_of(a)
    assert res["files"] == 0 and res["skipped_paths"] == [
        {"path": ".", "kind": "symlink", "reason": f"{linked} is a symbolic link; syncd follows "
         "no symbolic links (nothing read or written)"}]
    by_kind = unsafe(a)["by_kind"]
    assert isinstance(by_kind, dict) and by_kind["symlink"] >= 1
    assert a.read_log().count(f"{linked}: {linked} is a symbolic link") == 1  # logged once


def test_artifacts_swapped_for_a_link_while_a_big_file_is_hashed_hands_out_nothing(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Case 1 with the race: the bot swaps resources/artifacts for a link to the directory
    above syncd's own the moment syncd opens its big file (inotify tells it). The files that
    come after it in the scan (artifacts/a/identity.key, a decoy of the bot's) were hashed by
    name through the link, announced with the key's digest and served: b installed the key."""
    a = make_daemon("a", broker, start=False, extra="[resources]\nmax_file_bytes = 1073741824\n",
                    tuning="sweep_interval = 5\nrequest_timeout = 1.0\nwatch = false\n")
    b = make_daemon("b", broker)  # its max_file_bytes (32 MiB) refuses the big file
    inst = a.runtimes / KEY
    append(a.path(KEY), ishiki_lines(3))
    artifacts = inst / "resources" / "artifacts"
    artifacts.mkdir(parents=True)
    big = artifacts / "0big"  # first in the scan's order
    with big.open("wb") as f:
        f.truncate(256 << 20)  # sparse: a quarter of a second of hashing, no disk
    (artifacts / "a").mkdir()
    (artifacts / "a" / "identity.key").write_bytes(b"the bot's decoy\n")
    assert a.identity_file == tmp_path / "a" / "identity.key"  # what the link will name
    swapped = threading.Event()
    watch = inotify.init()
    inotify.add_watch(watch, os.fsencode(big), IN_OPEN)

    def bot() -> None:
        ready, _, _ = select.select([watch], [], [], 60)
        if ready:  # syncd opened the big file: it hashes it now
            os.rename(artifacts, artifacts.with_name("artifacts.real"))
            artifacts.symlink_to(tmp_path)  # artifacts/a/identity.key is a's key now
            swapped.set()

    planter = threading.Thread(target=bot, daemon=True)
    planter.start()
    try:
        a.start()
        assert swapped.wait(30), "syncd never opened the big file"
        wait_equal(a.path(KEY).read_bytes(), b)
        wait_until(lambda: leaked(a, b) or refused(a, artifacts, "symlink"), 30,
                   f"a to refuse {artifacts} (or b to get a's key)")
        # a's next scan finds the link and drops what was below it; b fetches nothing more.
        wait_until(lambda: resources_of(a).get("files") == 0, 20, "a to drop artifacts/")
        wait_until(lambda: resources_of(b).get("fetching", []) == [], 20, "b to stop fetching")
        assert leaked(a, b) == []
        shown = resources_of(a)["skipped_paths"]
        assert isinstance(shown, list)
        assert {"path": "artifacts", "kind": "symlink",
                "reason": "a symbolic link: not followed, not replicated"} in shown
    finally:
        os.close(watch)
        planter.join(5)


@pytest.fixture
def daemons_here(tmp_path: Path) -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for d in made:
        d.kill()


def deep_tree(top: Path, levels: int) -> Path:
    """`top`/d/d/.../d, `levels` deep, with a file at the bottom (made level by level:
    os.makedirs recurses once per level)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        out = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"the bottom of a bot-made tree\n")
        os.close(out)
    finally:
        os.close(fd)
    return top


def test_a_deep_tree_and_an_unreadable_directory_stop_neither_the_instance_nor_a_restart(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon],
    daemons_here: list[Daemon]
) -> None:
    """Case 7: a tree 1100 levels deep and a directory of the bot's that syncd cannot read
    (umask 077) under the instance. The recursive walks stopped the instance's resources
    (RecursionError, PermissionError) and, at a restart, `syncd run` (exit 1)."""
    # syncd runs as a user that cannot read the bot's private directory: as root here, without
    # the capabilities that read every directory.
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to run syncd without CAP_DAC_OVERRIDE")
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if root else []
    a = Daemon(tmp_path, "a", broker, prefix=prefix)
    daemons_here.append(a)
    b = make_daemon("b", broker)
    a.start()
    inst = a.runtimes / KEY
    first = put_artifact(inst, "shake", "s0.log", b"before the bot's trees\n")
    append(a.path(KEY), ishiki_lines(3) + shake_line("s0", first))
    wait_equal(a.path(KEY).read_bytes(), b)
    on_b = b.runtimes / KEY / "resources" / "artifacts" / "shake"
    wait_until(lambda: (on_b / "s0.log").is_file(), 20, "s0.log on b")

    private = inst / "resources" / "artifacts" / "private"
    try:
        deep_tree(inst / "resources" / "artifacts" / "deep", 1100)
        deep_tree(inst / "workspace" / "deep", 1100)  # watched, never replicated
        private.mkdir()
        (private / "notes").write_bytes(b"the bot's own notes\n")
        if root:
            os.chown(private, 65534, 65534)
            private.chmod(0o700)
        else:
            private.chmod(0o000)
        ref = put_artifact(inst, "shake", "s1.log", b"after the bot's trees\n")
        append(a.path(KEY), shake_line("s1", ref))
        wait_until(lambda: (on_b / "s1.log").is_file(), 20, "s1.log on b (a's scan went on)")

        def shown() -> set[tuple[str, str]]:
            skipped = resources_of(a).get("skipped_paths", [])
            assert isinstance(skipped, list)
            return {(p["path"], p["kind"]) for p in skipped}

        deep_at = "artifacts/deep" + "/d" * 31  # level 33: past [resources] max_depth = 32
        wait_until(lambda: {(deep_at, "too deep"), ("artifacts/private", "unreadable")}
                   <= shown(), 20, f"a to show the deep and the unreadable directory ({shown()})")
        wait_until(lambda: a.file_status(KEY)["state"] == "in_sync", 20, "a's log in sync")

        a.stop()  # `syncd run` walks (and watches) every directory again at start
        a.start()
        again = put_artifact(inst, "shake", "s2.log", b"after a restart\n")
        append(a.path(KEY), shake_line("s2", again))
        wait_until(lambda: (on_b / "s2.log").is_file(), 20, "s2.log on b after a's restart")
        wait_equal(a.path(KEY).read_bytes(), b)
        assert not (b.runtimes / KEY / "resources" / "artifacts" / "private").exists()
        assert not (b.runtimes / KEY / "resources" / "artifacts" / "deep").exists()
    finally:
        if private.exists():
            private.chmod(0o700)
        # rm is iterative; shutil.rmtree would recurse 1100 levels.
        subprocess.run(["rm", "-rf", str(inst / "resources" / "artifacts" / "deep"),
                        str(inst / "workspace")], check=False)
