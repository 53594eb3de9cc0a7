"""Writes that must outlive a power loss, on any filesystem layout (issue #23 case 10).

An fsync of a file makes its bytes durable, not its name: a rename, a new file or a new
directory is an entry of the directory that holds it, durable only once that directory is
fsynced. One ext4 journal commits them in order by accident; `state_dir` and the runtimes on
two filesystems (or XFS, btrfs, a network filesystem) do not. So every record syncd relies
on after a crash (file records, intents, notes, the epoch, peers' epochs, the identity,
installed resources) is written here: the data, then its file's fsync, then the rename, then
the directory's fsync; and a directory created for it is fsynced in its parent.

Blocking calls: the daemon runs them on a thread (asyncio.to_thread) where the event loop
would otherwise wait for a disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def sync_dir(path: Path) -> None:
    """fsync the directory `path`: the entries made in it (renames, new files, new folders)."""
    fd = os.open(path, DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dirs(paths: Iterable[Path]) -> None:
    """fsync each directory once, deepest first (a child's entry before its parent's)."""
    for p in sorted(set(paths), key=lambda p: (-len(p.parts), str(p))):
        sync_dir(p)


def make_dirs(path: Path, mode: int = 0o777) -> list[Path]:
    """Create `path` and its missing parents, each new one made durable in its parent (its
    parent is fsynced). Returns the directories created, outermost first (none if it existed).
    A non-directory in the way raises, as os.makedirs does."""
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        if p.exists() or p.is_symlink():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(p))
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue  # made meanwhile by another writer: that writer syncs its parent
        created.append(d)
    sync_dirs(d.parent for d in created)
    return created


def replace_file(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically make `path` hold `data`: a temp file next to it, written and fsynced, then
    renamed over `path`, then the directory fsynced. `durable=False`: no fsync at all (a record
    that a power loss may take back, costing only work at the next start); the rename still
    makes a kill -9 leave the old or the new content, never a mix."""
    if durable:
        make_dirs(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path, data, mode, sync=durable)
    os.replace(tmp, path)
    if durable:
        sync_dir(path.parent)


def write_temp(path: Path, data: bytes, mode: int = 0o600, sync: bool = False) -> Path:
    """`path`'s temp file, written (and fsynced if `sync`): the first half of `replace_file`.
    Unsynced, the first half of a batch: the caller syncs it (`sync_files`), renames it,
    then syncs the folder."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        _write_all(fd, data)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


SYNC_THREADS = 16  # fsyncs at once in a batch: the journal serves them with a few commits


def sync_files(paths: Iterable[Path], directories: bool = False) -> dict[Path, OSError]:
    """fsync each of `paths` (files, or `directories`), many at once from a pool of threads:
    one after the other, each waits for a journal commit of its own (1000 records: 2.0 s);
    together, one commit serves many (0.5 s). Returns the paths that failed, with why."""
    flags = DIR_FLAGS if directories else os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

    def sync(path: Path) -> OSError | None:
        try:
            fd = os.open(path, flags)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            return e
        return None

    todo = list(dict.fromkeys(paths))
    if len(todo) <= 1:
        results = [sync(p) for p in todo]
    else:
        with ThreadPoolExecutor(min(SYNC_THREADS, len(todo)), "fsync") as pool:
            results = list(pool.map(sync, todo))
    return {p: e for p, e in zip(todo, results, strict=True) if e is not None}


def create_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write a new file `path` (never over an existing one) durably: its bytes, then its
    directory's entry."""
    make_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
