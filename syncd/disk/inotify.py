"""Linux inotify through ctypes: the few calls the watcher needs, and the event record parser.

Read on the event loop (the fd is non-blocking): a thread in between (watchdog's observer)
cost a wake-up of the loop per event, and at 500 writes/s about 15 % of the daemon's CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What can change a file's bytes or existence, or a directory's entries. Not IN_OPEN or
# IN_CLOSE_*: our own reads open and close the files all the time.
DIR_MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
            | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

_libc: ctypes.CDLL | None = None


class Event(NamedTuple):
    wd: int
    mask: int
    name: bytes  # b"" for an event about the watched directory itself


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


def available() -> bool:
    try:
        return hasattr(_lib(), "inotify_init1")
    except OSError:
        return False


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def init() -> int:
    """A new inotify instance: non-blocking, closed on exec."""
    return _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")


def add_watch(fd: int, path: bytes, mask: int = DIR_MASK) -> int:
    return _check(_lib().inotify_add_watch(fd, path, mask), "inotify_add_watch")


def rm_watch(fd: int, wd: int) -> None:
    _lib().inotify_rm_watch(fd, wd)  # EINVAL: already gone with its directory; nothing to do


def parse(buf: bytes) -> Iterator[Event]:
    """The events of one read(2) of an inotify fd (the kernel never splits a record)."""
    at, end = 0, len(buf)
    size = _HEADER.size
    while at + size <= end:
        wd, mask, _cookie, length = _HEADER.unpack_from(buf, at)
        at += size
        name = buf[at:at + length].rstrip(b"\0")
        at += length
        yield Event(wd, mask, name)
