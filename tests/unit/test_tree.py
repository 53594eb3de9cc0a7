"""disk/tree.py on real directories: every level opened without following a link, a name
swapped after the check changes nothing, and walks that report instead of crashing."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.core.spot import Spot
from syncd.disk import tree
from syncd.disk.tree import NotRegularFile, Walk
from tests.support.resolvers import RESOLVERS, use_resolver

SECRET = b"outside the root\n"


@pytest.fixture(params=RESOLVERS, autouse=True)
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with openat2 (where the kernel has it) and with the walk alone."""
    return use_resolver(str(request.param), monkeypatch)


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """(a root holding inst/resources/artifacts/x, a secret outside it)."""
    root = tmp_path / "root"
    (root / "inst" / "resources" / "artifacts").mkdir(parents=True)
    (root / "inst" / "resources" / "artifacts" / "x").write_bytes(b"ours\n")
    outside = tmp_path / "outside"  # the same tree, with a secret at its end
    (outside / "inst" / "resources" / "artifacts").mkdir(parents=True)
    (outside / "inst" / "resources" / "artifacts" / "x").write_bytes(SECRET)
    (outside / "x").write_bytes(SECRET)
    return root, outside


def read(spot: Spot) -> bytes:
    fd = tree.open_file(spot)
    try:
        return os.read(fd, 1000)
    finally:
        os.close(fd)


X = ("inst", "resources", "artifacts", "x")


@pytest.mark.parametrize("level", range(1, 4))
def test_a_link_at_any_level_is_refused_and_named(world: tuple[Path, Path], level: int) -> None:
    root, outside = world
    assert read(Spot(root, X)) == b"ours\n"
    swapped = root.joinpath(*X[:level])
    os.rename(swapped, swapped.with_name("moved"))
    swapped.symlink_to(outside.joinpath(*X[:level]))  # followed, it would lead to SECRET
    with pytest.raises(NotRegularFile) as e:
        read(Spot(root, X))
    assert e.value.kind == tree.LINK and e.value.where == str(swapped)
    assert e.value.strerror == (f"{swapped} is a symbolic link; syncd follows no symbolic links "
                            "(nothing read or written)")


def test_the_file_itself_a_link_a_fifo_a_socket_or_a_directory_is_refused(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    root, outside = world
    folder = root / "inst" / "resources" / "artifacts"
    (folder / "link").symlink_to(outside / "x")
    os.mkfifo(folder / "fifo")
    (folder / "dir").mkdir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(folder / "sock"))
        for name, kind in [("link", tree.LINK), ("fifo", "fifo"), ("dir", tree.DIRECTORY),
                           ("sock", "socket")]:
            with pytest.raises(NotRegularFile) as e:
                read(Spot(root, (*X[:-1], name)))
            assert e.value.kind == kind, name
            with pytest.raises(NotRegularFile):  # writing neither
                os.close(tree.open_file(Spot(root, (*X[:-1], name)), os.O_WRONLY))
    assert (outside / "x").read_bytes() == SECRET


def test_a_descriptor_held_keeps_to_the_checked_directory_after_a_swap(
    world: tuple[Path, Path]
) -> None:
    root, outside = world
    folder = tree.open_dir(Spot(root, X[:-1]))
    try:
        artifacts = root / "inst" / "resources" / "artifacts"
        os.rename(artifacts, artifacts.with_name("moved"))
        artifacts.symlink_to(outside / "inst" / "resources" / "artifacts")  # leads outside
        fd = tree.open_in(folder, "x")
        try:
            assert os.read(fd, 100) == b"ours\n"
        finally:
            os.close(fd)
    finally:
        os.close(folder)


def test_creating_directories_stops_at_a_link_and_makes_nothing_through_it(
    world: tuple[Path, Path]
) -> None:
    root, outside = world
    fd = tree.open_dir(Spot(root, ("inst", "resources", "assets", "sub")), create_from=2)
    os.close(fd)
    assert (root / "inst" / "resources" / "assets" / "sub").is_dir()
    with pytest.raises(FileNotFoundError):  # above create_from: must exist
        tree.open_dir(Spot(root, ("other", "resources")), create_from=1)
    (root / "inst" / "resources" / "linked").symlink_to(outside)
    with pytest.raises(NotRegularFile):
        tree.open_dir(Spot(root, ("inst", "resources", "linked", "new")), create_from=2)
    assert not (outside / "new").exists()


def test_lstat_and_linked_component(world: tuple[Path, Path]) -> None:
    root, _ = world
    st = tree.lstat(Spot(root, X))
    assert st is not None and st.st_size == 5
    assert tree.lstat(Spot(root, ("inst", "nothing", "x"))) is None
    assert tree.linked_component(Spot(root, X[:-1])) is None
    (root / "inst2").symlink_to(root / "inst")
    with pytest.raises(NotRegularFile):
        tree.lstat(Spot(root, ("inst2", "resources")))
    assert tree.linked_component(Spot(root, ("inst2", "resources"))) == root / "inst2"
    assert tree.linked_component(Spot(root, ("missing", "deeper"))) is None


def test_openat2_opens_in_one_call_what_the_walk_opens(
    world: tuple[Path, Path], resolver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = world
    calls: list[str] = []
    real = tree._openat2

    class Counting:
        works = real.works

        def __call__(self, dir_fd: int, rel: str, flags: int, mode: int) -> int:
            calls.append(rel)
            return real(dir_fd, rel, flags, mode)

    monkeypatch.setattr(tree, "_openat2", Counting())
    assert read(Spot(root, X)) == b"ours\n"
    assert calls == (["inst/resources/artifacts/x"] if resolver == "openat2" else [])


def test_a_spot_holds_single_components_only() -> None:
    for bad in ("", ".", "..", "a/b", "a\0"):
        with pytest.raises(ValueError):
            Spot(Path("/r"), ("ok", bad))
    s = Spot(Path("/r"), ("a",)) / "b/c"
    assert s.parts == ("a", "b", "c") and s.path == Path("/r/a/b/c") and s.name == "c"
    assert s.parent == Spot(Path("/r"), ("a", "b"))


def deep(top: Path, levels: int) -> None:
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
        f.write(b"bottom\n")
    os.close(fd)


def walk(top: Path, max_depth: int) -> tuple[list[str], list[tuple[str, str]]]:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        w = Walk(fd, max_depth)
        names = [e.rel for e in w]
        return names, [(p.rel, p.kind) for p in w.problems]
    finally:
        os.close(fd)


def test_a_walk_deeper_than_pythons_stack_is_iterative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep(tmp_path / "t", 300)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100)  # a recursive walk could not go 300 levels down now
    try:
        names, problems = walk(tmp_path / "t", 400)
    finally:
        sys.setrecursionlimit(limit)
    assert names == ["d/" * 300 + "f"] and problems == []
    names, problems = walk(tmp_path / "t", 10)
    assert names == [] and problems == [("d/" * 10 + "d", tree.TOO_DEEP)]


def test_a_walk_shows_links_and_special_files_and_goes_on(tmp_path: Path) -> None:
    top = tmp_path / "t"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_bytes(b"1")
    (top / "z").write_bytes(b"2")
    (top / "a" / "dirlink").symlink_to(tmp_path)
    (top / "a" / "filelink").symlink_to(top / "z")
    os.mkfifo(top / "a" / "fifo")
    names, problems = walk(top, 8)
    assert names == ["a/b/f", "z"]
    assert problems == [("a/dirlink", tree.LINK), ("a/fifo", "fifo"),
                        ("a/filelink", tree.LINK)]


def test_a_walk_goes_on_past_an_unreadable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / "t"
    for d in ("a", "locked", "z"):
        (top / d).mkdir(parents=True)
        (top / d / "f").write_bytes(b"x")
    real = os.listdir

    def listdir(fd: int) -> list[str]:  # as for a directory of mode 000 (root reads those)
        if os.readlink(f"/proc/self/fd/{fd}") == str(top / "locked"):
            raise PermissionError(13, "Permission denied")
        return real(fd)

    monkeypatch.setattr(tree.os, "listdir", listdir)
    names, problems = walk(top, 8)
    assert names == ["a/f", "z/f"] and problems == [("locked", tree.UNREADABLE)]


def test_a_walk_calls_entering_and_leaving_with_open_descriptors(tmp_path: Path) -> None:
    top = tmp_path / "t"
    for d in ("a/x", "b"):
        (top / d).mkdir(parents=True)
        (top / d / "f").write_bytes(b"x")
    seen: list[tuple[str, str]] = []

    def entering(fd: int, rel: str) -> bool:
        os.fstat(fd)  # open
        seen.append(("in", rel))
        return rel != "b"

    def leaving(fd: int, rel: str) -> None:
        os.fsync(fd)  # still open
        seen.append(("out", rel))

    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [e.rel for e in Walk(fd, 8, entering=entering, leaving=leaving)]
        os.fstat(fd)  # the caller's descriptor is left open
    finally:
        os.close(fd)
    assert names == ["a/x/f"]
    assert seen == [("in", "a"), ("in", "a/x"), ("out", "a/x/"), ("out", "a/"), ("in", "b"),
                    ("out", "")]


def fds() -> Iterator[int]:
    yield from (int(n) for n in os.listdir("/proc/self/fd"))


def test_a_walk_abandoned_midway_closes_what_it_opened(tmp_path: Path) -> None:
    deep(tmp_path / "t", 20)
    before = len(list(fds()))
    fd = os.open(tmp_path / "t", os.O_RDONLY | os.O_DIRECTORY)
    it = iter(Walk(fd, 50))
    next(it)
    it.close()  # type: ignore[attr-defined]
    os.close(fd)
    assert len(list(fds())) == before


def test_a_walk_keeps_a_bounded_number_of_problems(tmp_path: Path) -> None:
    top = tmp_path / "t"
    top.mkdir()
    for i in range(30):
        (top / f"link-{i:02}").symlink_to(tmp_path)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        w = Walk(fd, 4, max_problems=10)
        assert list(w) == []
    finally:
        os.close(fd)
    assert len(w.problems) == 10 and w.more_problems == 20
