"""Descriptors kept open between reads (disk/openfiles.py) never outlive what the name means."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from syncd.core.errors import FileReplaced
from syncd.core.oslimits import KEPT_CEILING, KEPT_FLOOR, kept_descriptors
from syncd.core.spot import Spot
from syncd.disk import logfile
from syncd.disk.openfiles import APPEND, OPEN, READ, OpenFiles
from syncd.disk.tree import NotRegularFile
from tests.support.resolvers import RESOLVERS, use_resolver


def spot_in(tmp_path: Path, data: bytes = b"a\n") -> tuple[Spot, Path]:
    (tmp_path / "k" / "mem").mkdir(parents=True)
    path = tmp_path / "k" / "mem" / "log.jsonl"
    path.write_bytes(data)
    return Spot(tmp_path, ("k", "mem", "log.jsonl")), path


def look(spot: Spot) -> bytes:
    """As a look does: the stat, then the bytes."""
    logfile.stat(spot)
    _, reads, _ = logfile.snapshot(spot, ((0, 100),), None)
    return reads[(0, 100)]


def test_a_file_renamed_over_is_read_afresh(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    assert look(spot) == b"a\n"
    new = path.with_name("new")
    new.write_bytes(b"b\n")
    new.rename(path)
    assert look(spot) == b"b\n"


def test_a_directory_swapped_for_a_link_is_refused_though_a_descriptor_is_held(
        tmp_path: Path) -> None:
    spot, _ = spot_in(tmp_path)
    assert look(spot) == b"a\n"
    # The folder moved away and a link to it in its place: same inode at the end of the path.
    os.rename(tmp_path / "k" / "mem", tmp_path / "k" / "moved")
    os.symlink(tmp_path / "k" / "moved", tmp_path / "k" / "mem")
    with pytest.raises(NotRegularFile):
        logfile.stat(spot)
    with pytest.raises(NotRegularFile):
        logfile.snapshot(spot, ((0, 100),), None)  # not vouched for: opened by name


def test_a_read_without_a_stat_before_it_opens_by_name(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    assert look(spot) == b"a\n"
    new = path.with_name("new")
    new.write_bytes(b"b\n")
    new.rename(path)
    _, reads, _ = logfile.snapshot(spot, ((0, 100),), None)
    assert reads[(0, 100)] == b"b\n"


def test_an_append_goes_to_the_inode_asked_for_only(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    st = logfile.stat(spot)
    assert st is not None
    st = logfile.append_at(spot, st.size, b"b\n", st.inode)
    logfile.stat(spot)
    st = logfile.append_at(spot, st.size, b"c\n", st.inode)  # through the kept descriptor
    assert path.read_bytes() == b"a\nb\nc\n"
    old = st.inode
    new = path.with_name("new")
    new.write_bytes(b"x\n")
    new.rename(path)
    logfile.stat(spot)
    with pytest.raises(FileReplaced):
        logfile.append_at(spot, st.size, b"d\n", old)


def test_a_deleted_file_is_let_go_at_the_next_stat(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    look(spot)
    fd_count = len(os.listdir("/proc/self/fd"))
    path.unlink()
    assert logfile.stat(spot) is None
    assert len(os.listdir("/proc/self/fd")) == fd_count - 1
    logfile.sync(spot)  # nothing left to sync: no error


def test_at_most_limit_descriptors_and_none_closed_while_in_use(tmp_path: Path) -> None:
    files = OpenFiles(limit=2)
    spots = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x")
        spots.append(Spot(tmp_path, (f"f{i}",)))
    first = files.keep(spots[0], READ, os.open(tmp_path / "f0", os.O_RDONLY), (0, 0))
    for i in (1, 2):
        files.give_back(files.keep(spots[i], READ, os.open(tmp_path / f"f{i}", os.O_RDONLY),
                                   (0, i)))
    assert len(files) == 2
    assert os.pread(first.fd, 1, 0) == b"x"  # evicted, still open for its user
    files.give_back(first)
    with pytest.raises(OSError):
        os.fstat(first.fd)
    files.close_all()


def test_the_process_table_is_bounded_by_the_open_file_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert OPEN.limit == kept_descriptors(None if soft == resource.RLIM_INFINITY else soft)
    assert 0 < OPEN.limit <= KEPT_CEILING


def test_kept_descriptors_leave_room_for_everything_else() -> None:
    assert kept_descriptors(1024) == 384  # a shell's default: busy files still keep theirs
    assert kept_descriptors(65536) == 32640  # the unit's LimitNOFILE
    assert kept_descriptors(300) == KEPT_FLOOR  # a tiny limit: the old fixed table
    assert kept_descriptors(None) == KEPT_CEILING  # unlimited
    for soft in (300, 1024, 4096, 20000, 65536, 1 << 20):
        assert kept_descriptors(soft) <= max(KEPT_FLOOR, soft // 2)


def test_a_limit_is_read_from_rlimit_nofile_when_none_is_given() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, soft), hard))
    try:
        assert OpenFiles().limit == kept_descriptors(min(2048, soft))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thousands_of_files_keep_their_descriptors(tmp_path: Path) -> None:
    """1000 busy files, each read then read again after a stat: no file is reopened (the
    table holds them all), and each reuse still needs its stat (the #23 rule)."""
    files = OpenFiles(limit=kept_descriptors(4096))
    spots = []
    for i in range(1000):
        (tmp_path / f"f{i}").write_bytes(b"x")
        spots.append(Spot(tmp_path, (f"f{i}",)))
    for i, spot in enumerate(spots):
        fd = os.open(tmp_path / f"f{i}", os.O_RDONLY)
        st = os.fstat(fd)
        files.give_back(files.keep(spot, READ, fd, (st.st_dev, st.st_ino)))
    assert len(files) == 1000
    for i, spot in enumerate(spots):
        assert files.take_read(spot) is None  # not vouched for since its last use
        st = os.stat(tmp_path / f"f{i}")
        files.vouch(spot, (st.st_dev, st.st_ino))
        held = files.take_read(spot)
        assert held is not None
        files.give_back(held)
    files.close_all()


def test_the_log_check_reads_back_through_the_descriptor_the_bytes_came_through(
        tmp_path: Path) -> None:
    """read_known (the log check's reads) uses the descriptor of the last read or append,
    not the name: the bytes of the inode the machine shipped or wrote, even once the name
    means another file (the machine's next stat notices that, and the check starts over)."""
    spot, path = spot_in(tmp_path)
    assert look(spot) == b"a\n"
    new = path.with_name("new")
    new.write_bytes(b"b\n")
    new.rename(path)
    assert logfile.read_known(spot, 0, 2) == b"a\n"  # the inode looked at
    assert logfile.read_range(spot, 0, 2) == b"b\n"  # by name: the new file
    logfile.stat(spot)  # the stat finds the new inode: the old descriptor is let go
    assert logfile.read_known(spot, 0, 2) == b"b\n"


def test_an_append_descriptor_is_read_back_through(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    st = logfile.stat(spot)
    assert st is not None
    logfile.append_at(spot, st.size, b"b\n", st.inode)  # a standby's append: kept, readable
    os.rename(path, path.with_name("moved"))
    assert logfile.read_known(spot, 2, 4) == b"b\n"


def test_without_a_descriptor_the_log_check_reads_by_name(tmp_path: Path) -> None:
    spot, _ = spot_in(tmp_path)
    OPEN.forget(spot)
    assert logfile.read_known(spot, 0, 2) == b"a\n"
    assert logfile.read_known(spot, 2, 2) == b""


def test_a_write_only_descriptor_is_not_read_from(tmp_path: Path) -> None:
    spot, path = spot_in(tmp_path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    st = os.fstat(fd)
    OPEN.give_back(OPEN.keep(spot, APPEND, fd, (st.st_dev, st.st_ino)))
    assert logfile.read_known(spot, 0, 2) == b"a\n"  # EBADF on it: read by name instead
    OPEN.forget(spot)


# --- logfile.look: the stat and the read of a writer's look in one resolution -----------------


@pytest.fixture(params=RESOLVERS)
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The look's directory reached with openat2 (where the kernel has it) and by the walk."""
    return use_resolver(str(request.param), monkeypatch)


def look_in_one(spot: Spot) -> bytes:
    _, reads, _ = logfile.look(spot, ((0, 100),), None)
    return reads[(0, 100)]


def test_one_resolution_reads_a_file_renamed_over_afresh(tmp_path: Path, resolver: str) -> None:
    spot, path = spot_in(tmp_path)
    assert look_in_one(spot) == b"a\n"
    new = path.with_name("new")
    new.write_bytes(b"b\n")
    new.rename(path)
    st, reads, _ = logfile.look(spot, ((0, 100),), None)
    assert reads[(0, 100)] == b"b\n"
    assert st is not None and st.ino == os.stat(path).st_ino


def test_one_resolution_refuses_a_directory_swapped_for_a_link(
        tmp_path: Path, resolver: str) -> None:
    spot, _ = spot_in(tmp_path)
    assert look_in_one(spot) == b"a\n"
    os.rename(tmp_path / "k" / "mem", tmp_path / "k" / "moved")
    os.symlink(tmp_path / "k" / "moved", tmp_path / "k" / "mem")
    with pytest.raises(NotRegularFile):
        logfile.look(spot, ((0, 100),), None)


def test_one_resolution_refuses_a_link_or_a_fifo_in_the_file_s_place(
        tmp_path: Path, resolver: str) -> None:
    spot, path = spot_in(tmp_path)
    assert look_in_one(spot) == b"a\n"
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret\n")
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(NotRegularFile):
        logfile.look(spot, ((0, 100),), None)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(NotRegularFile):
        logfile.look(spot, ((0, 100),), None)


def test_one_resolution_lets_a_deleted_file_go(tmp_path: Path, resolver: str) -> None:
    spot, path = spot_in(tmp_path)
    look_in_one(spot)
    fd_count = len(os.listdir("/proc/self/fd"))
    path.unlink()
    assert logfile.look(spot, ((0, 100),), 0) == (None, {}, None)
    assert len(os.listdir("/proc/self/fd")) == fd_count - 1
    (tmp_path / "k" / "mem").rmdir()
    assert logfile.look(spot, ((0, 100),), 0) == (None, {}, None)


def test_one_resolution_reads_through_the_kept_descriptor_and_stats_its_inode(
        tmp_path: Path, resolver: str) -> None:
    spot, path = spot_in(tmp_path, b"a\nb")
    look_in_one(spot)
    kept = OPEN.take_any(spot)
    assert kept is not None
    OPEN.give_back(kept)
    with path.open("ab") as f:
        f.write(b"c\n")
    st, reads, line_end = logfile.look(spot, ((0, 100),), 2)
    assert reads[(0, 100)] == b"a\nbc\n" and line_end == 5
    again = OPEN.take_any(spot)
    assert again is kept  # no new descriptor
    OPEN.give_back(again)
    os_st = os.stat(path)
    assert st is not None and (st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns) == (
        os_st.st_dev, os_st.st_ino, os_st.st_size, os_st.st_mtime_ns, os_st.st_ctime_ns)
