"""No symbolic link is followed under runtimes_dir: not to archive, read, append or verify.

A copy replaced by a link to a secret elsewhere must not become readable through syncd: not in
the archive (which the daemon's group reads), not on the wire, not in `syncd verify`'s output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syncd.disk import logfile
from syncd.disk.archive import archive_copy
from syncd.disk.logfile import NotRegularFile
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

SECRET = b"TOP SECRET: the bytes a symbolic link must not leak\n" * 20


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A directory on another filesystem than the tests' (tmpfs), so that archiving copies."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(
            tempfile.gettempdir()).st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="syncd-test-", dir="/dev/shm"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def archive_bytes(state_dir: Path) -> list[bytes]:
    """Every archived file's bytes, read without following links (a link archived is a leak
    too: reading it would give the target)."""
    out = []
    for p in (state_dir / "archive").rglob("*"):
        assert not p.is_symlink(), f"{p} is a symbolic link"
        if p.is_file():
            out.append(p.read_bytes())
    return out


def test_adopt_refuses_a_copy_replaced_by_a_link_and_archives_nothing_of_its_target(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon], other_fs: Path
) -> None:
    a = make_daemon("a", broker, start=False)
    # state_dir on another filesystem: archiving copies bytes instead of linking the name.
    a.edit_config(f'state_dir = "{a.state}"', f'state_dir = "{other_fs}"')
    a.state = other_fs
    a.start()
    b = make_daemon("b", broker)
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    link = a.path(KEY).with_name("new")
    link.symlink_to(secret)
    os.replace(link, a.path(KEY))  # events.jsonl is now a link to the secret
    wait_until(lambda: a.file_status(KEY).get("state") == "reset", 10, "a to freeze the file")
    done = subprocess.run([sys.executable, "-m", "syncd", "adopt", KEY, "--from", "b", "--yes",
                           "--config", str(a.config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert f"{a.path(KEY)} is a symbolic link; syncd follows no symbolic links" in done.stderr
    assert not any(SECRET[:20] in data for data in archive_bytes(other_fs))
    assert a.path(KEY).is_symlink() and secret.read_bytes() == SECRET  # nothing changed
    assert "cannot archive the local copy" in a.read_log()
    assert SECRET[:20].decode() not in a.read_log()


def test_archive_copies_and_links_through_the_checked_descriptor(
    tmp_path: Path, other_fs: Path
) -> None:
    for state in (tmp_path / "state", other_fs):  # a hard link, then a copy
        path = tmp_path / "runtimes" / KEY / "events.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b'{"a":1}\n')
        dest = archive_copy(state, "a", KEY, "events.jsonl", path, {"reason": "test"})
        assert dest.read_bytes() == b'{"a":1}\n' and not dest.is_symlink()
        assert not path.exists()
        manifest = dest.with_name(dest.name + ".manifest.json").read_text()
        assert '"size": 8' in manifest and '"existed": true' in manifest


@pytest.mark.parametrize("what", ["file link", "dangling link", "key directory link", "fifo"])
def test_archive_refuses_links_and_special_files(tmp_path: Path, what: str) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    rt = tmp_path / "runtimes"
    path = rt / KEY / "events.jsonl"
    if what == "key directory link":
        rt.mkdir()
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "events.jsonl").write_bytes(SECRET)  # a plain file, but
        (rt / KEY).symlink_to(tmp_path / "elsewhere")  # reached through a linked key
    else:
        path.parent.mkdir(parents=True)
        if what == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(secret if what == "file link" else tmp_path / "nothing")
    with pytest.raises(NotRegularFile, match=r"symbolic link|FIFO"):
        archive_copy(tmp_path / "state", "a", KEY, "events.jsonl", path, {})
    assert archive_bytes(tmp_path / "state") == []  # nothing archived, not even a manifest
    assert os.path.lexists(path)  # nothing removed


def test_store_refuses_links_fifos_and_linked_key_directories(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    key = tmp_path / "runtimes" / KEY
    key.mkdir(parents=True)
    (key / "link").symlink_to(secret)
    os.mkfifo(key / "fifo")
    (tmp_path / "runtimes" / "linked-key").symlink_to(key)
    (key / "plain").write_bytes(b"x\n")
    for name in ("link", "fifo"):
        with pytest.raises(NotRegularFile):
            logfile.read_range(key / name, 0, 10)  # a FIFO does not block the open either
        with pytest.raises(NotRegularFile):
            logfile.snapshot(key / name, ((0, 10),), None)
    with pytest.raises(NotRegularFile, match="symbolic link"):
        logfile.append_at(key / "link", len(SECRET), b"appended\n", (0, 0))
    with pytest.raises(NotRegularFile, match="linked-key is a symbolic link"):
        logfile.read_range(tmp_path / "runtimes" / "linked-key" / "plain", 0, 2)
    assert logfile.read_range(key / "plain", 0, 2) == b"x\n"
    assert secret.read_bytes() == SECRET


def test_verify_refuses_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b'{"type":"secret","password":"hunter2"}\nnot json hunter2\n')
    link = tmp_path / "events.jsonl"
    link.symlink_to(secret)
    done = subprocess.run([sys.executable, "-m", "syncd", "verify", str(link)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "is a symbolic link" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
