"""Reaching files below a runtimes root through directory descriptors, one level at a time.

The local bot owns everything below a runtimes root and may swap any directory for a symbolic
link at any moment; it can even time the swap, watching syncd's reads of its own files with
inotify. So no path below a root is ever resolved by name. A `Spot` is a trusted directory
(`top`: a runtimes root, or the directory a glob lists, opened as the configuration names it)
and the components below it; every component is opened with O_NOFOLLOW from the descriptor of
the one above it (O_DIRECTORY for directories), the last one is checked on its own descriptor
(fstat: a regular file), and everything after that goes through the descriptors: reads,
writes, fsyncs, and the *at calls (stat, link, rename, unlink) relative to the directory's.
A name swapped for a link after the check changes nothing: the descriptors already held name
the checked inodes.

What is not a regular file or a directory where one is expected (a symbolic link, a device, a
FIFO, a socket, a directory where a file should be, a file where a directory should be) raises
NotRegularFile, which says what the entry is (`kind`) and where.

Where the kernel has openat2(2) (Linux 5.6), a whole Spot is opened in one call from its top
with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH: the kernel refuses a link at any level and any way
out of the top, in the same walk that opens. Only a refusal, to name the level, and kernels
without it take the walk one component at a time; both end on a descriptor checked alike.

`Walk` lists a tree the same way, iteratively (its depth bounded by the caller, never by
Python's stack), and reports instead of raising: a link or a device inside is a `Problem` and
is not followed, an unreadable or vanished subdirectory is a `Problem` and the walk goes on
with the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat as stat_mode
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from syncd.core.errors import SyncdError
from syncd.core.spot import Spot

__all__ = ["Spot"]  # re-exported: callers below a root need only this module

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# What an entry is, as shown in status and logs (Problem.kind, NotRegularFile.kind).
LINK = "symlink"
DIRECTORY = "directory"  # where a file should be
NOT_DIRECTORY = "not a directory"  # where a directory should be
UNREADABLE = "unreadable"
TOO_DEEP = "too deep"
VANISHED = "vanished"
_KINDS = {stat_mode.S_IFLNK: LINK, stat_mode.S_IFDIR: DIRECTORY, stat_mode.S_IFIFO: "fifo",
          stat_mode.S_IFSOCK: "socket", stat_mode.S_IFCHR: "character device",
          stat_mode.S_IFBLK: "block device", stat_mode.S_IFREG: "file"}
_SAID = {LINK: "a symbolic link", DIRECTORY: "a directory", "fifo": "a FIFO",
         "socket": "a socket", "character device": "a character device",
         "block device": "a block device", "file": "a regular file"}


_RESOLVE = 0x04 | 0x08  # RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH
_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_HOW = struct.Struct("QQQ")  # struct open_how: flags, mode, resolve


class _Openat2:
    """openat2(2) through libc's syscall(2); `works` turns False for good on ENOSYS (an old
    kernel) or EPERM (a seccomp filter that does not know it)."""

    def __init__(self) -> None:
        self.works = os.uname().sysname == "Linux"
        self._syscall: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
        self._how: dict[tuple[int, int], ctypes.Array[ctypes.c_char]] = {}

    def __call__(self, dir_fd: int, rel: str, flags: int, mode: int) -> int:
        if self._syscall is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            self._syscall = libc.syscall
        how = self._how.get((flags, mode))
        if how is None:
            how = self._how[(flags, mode)] = ctypes.create_string_buffer(
                _HOW.pack(flags, mode, _RESOLVE), _HOW.size)
        fd = self._syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd),
                           ctypes.c_char_p(os.fsencode(rel)), how, ctypes.c_size_t(_HOW.size))
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM):
                self.works = False
            raise OSError(err, os.strerror(err), rel)
        return int(fd)


_openat2 = _Openat2()
# openat2's refusals that the walk one component at a time explains (or does instead)
_WALK_INSTEAD = frozenset((errno.ELOOP, errno.ENOTDIR, errno.EXDEV, errno.ENOSYS, errno.EPERM,
                           errno.EISDIR, errno.ENXIO, errno.EAGAIN))


def _open_beneath(top_dir: Path, parts: tuple[str, ...], flags: int, mode: int = 0
                  ) -> int | None:
    """`parts` below `top_dir` opened in one openat2 call, or None: not available, or refused
    (the caller walks it one component at a time to say which level is what). Other errors
    raise."""
    if not _openat2.works or not parts:
        return None
    top = os.open(top_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _openat2(top, "/".join(parts), flags | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in _WALK_INSTEAD:
            return None
        raise
    finally:
        os.close(top)


def kind_of(mode: int) -> str:
    return _KINDS.get(stat_mode.S_IFMT(mode), "not a file")


class NotRegularFile(SyncdError, OSError):
    """An entry on the way is a symbolic link, or not what is expected there (a device, a FIFO,
    a directory where a file should be): syncd neither reads nor writes through it. An OSError
    (ELOOP for a link, ENOTDIR, EISDIR or EINVAL for the rest), so every caller that reports
    I/O errors reports this one too; `strerror` is the whole explanation, `kind` what the entry
    is and `where` its path."""

    def __init__(self, code: int, message: str, where: str, kind: str = "") -> None:
        super().__init__(code, message, where)
        self.kind = kind
        self.where = where


def _refusal(where: Path, kind: str, wanted: str) -> NotRegularFile:
    if kind == LINK:
        return NotRegularFile(errno.ELOOP, f"{where} is a symbolic link; syncd follows no "
                              "symbolic links (nothing read or written)", str(where), LINK)
    if wanted == "directory":
        return NotRegularFile(errno.ENOTDIR, f"{where} is {_SAID.get(kind, kind)}, not a "
                              "directory", str(where), NOT_DIRECTORY)
    return NotRegularFile(errno.EISDIR if kind == DIRECTORY else errno.EINVAL,
                          f"{where} is {_SAID.get(kind, kind)}, not a regular file; syncd "
                          "reads and writes regular files only", str(where), kind)


def _open_step(dir_fd: int, name: str, where: Path, create: bool, mode: int) -> int:
    """The directory `name` inside `dir_fd`, not followed if it is a link (`create`: made
    when missing)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(where, _entry_kind(dir_fd, name), "directory") from None
        raise
    with contextlib.suppress(FileExistsError):  # made meanwhile: checked like any other
        os.mkdir(name, mode, dir_fd=dir_fd)
    return _open_step(dir_fd, name, where, False, mode)


def _entry_kind(dir_fd: int | None, name: str, unknown: str = NOT_DIRECTORY) -> str:
    """What `name` is (for a refusal's words only: the refusal is decided already)."""
    try:
        return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return unknown


def open_dir(spot: Spot, create_from: int | None = None, mode: int = 0o777) -> int:
    """A descriptor on the directory at `spot`, reached one component at a time.
    `create_from`: make the missing components from `spot.parts[create_from]` on (with
    `mode`, less the umask); those above must exist. Raises NotRegularFile when one is a link
    or not a directory, FileNotFoundError when one is missing."""
    if create_from is None:
        fast = _open_beneath(spot.top, spot.parts, _DIR_FLAGS)
        if fast is not None:
            return fast
    fd = os.open(spot.top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = spot.top
    try:
        for i, part in enumerate(spot.parts):
            where = where / part
            create = create_from is not None and i >= create_from
            nxt = _open_step(fd, part, where, create, mode)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_in(dir_fd: int | None, name: str, flags: int = os.O_RDONLY, mode: int = 0o666, *,
            where: Path | str = "") -> int:
    """A descriptor on the regular file `name` inside the directory `dir_fd` (None: a path
    relative to the working directory, or absolute, for files outside the roots whose
    directories are trusted): a link is not
    followed, anything but a regular file is refused (NotRegularFile, with `where` in the
    message). The check is made on the descriptor returned."""
    shown = Path(where or name)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not block the open
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refusal(shown, LINK, "file") from None
        if e.errno == errno.EISDIR:
            raise _refusal(shown, DIRECTORY, "file") from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO without a reader opened for writing
            raise _refusal(shown, _entry_kind(dir_fd, name, "fifo"), "file") from None
        raise
    try:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind != "file":
            raise _refusal(shown, kind, "file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(spot: Spot, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """A descriptor on the regular file at `spot` (see open_dir and open_in)."""
    if not flags & os.O_CREAT:
        fd = _open_beneath(spot.top, spot.parts, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
        if fd is not None:
            try:
                if kind_of(os.fstat(fd).st_mode) == "file":
                    os.set_blocking(fd, True)
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # not a regular file: the walk below refuses it, naming it
    parent = open_dir(spot.parent)
    try:
        return open_in(parent, spot.name, flags, mode, where=spot.path)
    finally:
        os.close(parent)


def open_parent(spot: Spot) -> int:
    """open_dir(spot.parent), without making that Spot: the look at a busy file asks for its
    directory at every write (the same openat2 call, or the same walk when it is refused)."""
    fast = _open_beneath(spot.top, spot.parts[:-1], _DIR_FLAGS)
    return fast if fast is not None else open_dir(spot.parent)


def lstat(spot: Spot) -> os.stat_result | None:
    """The entry's own stat (a link is not followed), reached through descriptors; None when
    it or a directory above it is missing. A link on the way raises NotRegularFile."""
    try:
        parent = open_parent(spot)
    except FileNotFoundError:
        return None
    try:
        return os.stat(spot.name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


def sync_dir(spot: Spot) -> None:
    """fsync the directory at `spot` (its entries: a rename or a link made in it)."""
    fd = open_dir(spot)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def linked_component(spot: Spot) -> Path | None:
    """The first component below `top` that is a symbolic link, or None (none is, up to the
    first missing one or the first that is not a directory)."""
    try:
        os.close(open_dir(spot))
    except NotRegularFile as e:
        return Path(e.where) if e.kind == LINK else None
    except OSError:
        return None
    return None


# --- walking a tree ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """An entry the walk did not follow or could not read (`rel`: below the walk's top)."""

    rel: str
    kind: str  # LINK, a device's kind, UNREADABLE, TOO_DEEP, VANISHED, ...
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.rel, "kind": self.kind, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file found by a walk: `name` inside the directory `dir_fd`, which stays
    open until the walk moves on (open it with open_in(entry.dir_fd, entry.name))."""

    rel: str
    dir_fd: int
    name: str
    stat: os.stat_result


@dataclass
class Walk:
    """Every regular file below the directory `top` (a descriptor, not closed here), depth
    first in name order, at most `max_depth` directories down (`max_depth` 0: `top` only).

    Iterative: a tree far deeper than Python's stack costs a Problem at `max_depth`, not a
    crash. Holds one descriptor per level below `top`. `entering(fd, rel)`: called with each
    directory's descriptor once it is open (False: do not go into it; not a problem).
    `leaving(fd, rel)`: called with each directory's descriptor before it is closed (for an
    fsync of its entries; `rel` ends with '/', "" for `top`). Problems are in `problems`
    once it is done: the first `max_problems` of them (a bot can make millions of links),
    `more_problems` counts the rest."""

    top: int
    max_depth: int
    entering: Callable[[int, str], bool] | None = None
    leaving: Callable[[int, str], None] | None = None
    max_problems: int = 1000
    problems: list[Problem] = field(default_factory=list)
    more_problems: int = 0

    def __iter__(self) -> Iterator[Entry]:
        stack: list[tuple[int, str, int, Iterator[str]]] = []
        names = self._list(self.top, ".")
        if names is None:
            return
        stack.append((self.top, "", 0, iter(names)))
        try:
            while stack:
                fd, rel, depth, pending = stack[-1]
                name = next(pending, None)
                if name is None:
                    stack.pop()
                    if self.leaving is not None:
                        self.leaving(fd, rel)
                    if fd != self.top:
                        os.close(fd)
                    continue
                below = f"{rel}{name}"
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone since it was listed: the next walk will not see it
                except OSError as e:
                    self._problem(below, UNREADABLE, f"cannot stat: {e.strerror or e}")
                    continue
                kind = kind_of(st.st_mode)
                if kind == "file":
                    yield Entry(below, fd, name, st)
                elif kind == DIRECTORY:
                    sub = self._enter(fd, name, below, depth)
                    if sub is not None:
                        sub_fd, sub_names = sub
                        stack.append((sub_fd, below + "/", depth + 1, iter(sub_names)))
                else:
                    self._problem(below, kind, f"{_SAID.get(kind, kind)}: not followed, not "
                                  "replicated")
        finally:
            for fd, _, _, _ in stack:
                if fd != self.top:
                    os.close(fd)

    def _enter(self, fd: int, name: str, rel: str, depth: int) -> tuple[int, list[str]] | None:
        if depth + 1 > self.max_depth:
            self._problem(rel, TOO_DEEP, f"more than {self.max_depth} levels deep: not walked "
                          "(max_depth)")
            return None
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            self._problem(rel, VANISHED, "removed while it was walked")
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped since its stat
                kind = _entry_kind(fd, name)
                self._problem(rel, kind, f"{_SAID.get(kind, kind)}: not followed, not "
                              "replicated")
            else:
                self._problem(rel, UNREADABLE, f"cannot open: {e.strerror or e}")
            return None
        if self.entering is not None and not self.entering(sub, rel):
            os.close(sub)
            return None
        names = self._list(sub, rel)
        if names is None:
            os.close(sub)
            return None
        return sub, names

    def _list(self, fd: int, rel: str) -> list[str] | None:
        try:
            return sorted(os.listdir(fd))
        except FileNotFoundError:
            self._problem(rel, VANISHED, "removed while it was walked")
        except OSError as e:
            self._problem(rel, UNREADABLE, f"cannot list: {e.strerror or e}")
        return None

    def _problem(self, rel: str, kind: str, reason: str) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(Problem(rel, kind, reason))
        else:
            self.more_problems += 1
