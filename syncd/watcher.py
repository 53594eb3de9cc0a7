"""Filesystem hints from inotify, read on the event loop itself (watchdog where it cannot be).

Every event is only a hint: "look at this path again". The replica decides with fstat. The
kernel merges identical unread events and drops everything on queue overflow, so hints are
never counted and the node's periodic stat sweep catches whatever never arrived.

On Linux the inotify descriptor is read by the event loop (`add_reader`): an append costs one
wake-up of the loop and a read of a few bytes. watchdog, used before, spent about 0.3 ms of CPU
per append (three threads handing each event on, then `call_soon_threadsafe`), on the writer's
host and on every standby alike (a standby's own appends are events too), and stalled later
events for 0.5 s after a rename. watchdog remains the fallback where inotify is missing.

What is watched: `runtimes_dir` and each directory directly under it (an instance key), which is
all the node routes (`<key>` and `<key>/<file>`). A new key directory gets its watch when its
creation (or arrival by rename) is read, and its entries are hinted then, so that a file
created in it before the watch existed is not missed. Symbolic links are never followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("syncd.watcher")

Hint = Callable[[str, bool], None]  # (path, gone): gone = deleted, or moved away or over

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

# Only what can change a file's bytes or existence: our own reads open and close the files all
# the time, and open/close events would wake us for nothing.
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
_GONE = IN_DELETE | IN_MOVED_FROM
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ = 64 * 1024
_COOKIES = 256  # recent IN_MOVED_FROM cookies: a rename within the tree, not an arrival


class Inotify:
    """One inotify descriptor on the event loop, watching a directory and its subdirectories
    one level down."""

    def __init__(self, root: Path, hint: Hint) -> None:
        self._root = str(root)
        self._hint = hint
        self._libc: Any = None
        self._fd = -1
        self._paths: dict[int, str] = {}  # wd -> directory
        self._wds: dict[str, int] = {}  # directory -> wd
        self._moved: OrderedDict[int, str] = OrderedDict()  # cookie -> path moved away
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit_logged = False

    def start(self) -> None:
        """Raises OSError when inotify cannot be used here."""
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            raise OSError("inotify is not available")
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._libc, self._fd = libc, fd
        try:
            self._watch(self._root, root=True)
        except OSError:
            os.close(fd)
            self._fd = -1
            raise
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._on_readable)
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._root):
                if entry.is_dir(follow_symlinks=False):
                    self._watch(entry.path)

    def stop(self) -> None:
        if self._fd < 0:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        self._paths.clear()
        self._wds.clear()

    def _watch(self, path: str, root: bool = False) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if root:
                raise OSError(err, f"cannot watch {path}: {os.strerror(err)}")
            if not self._limit_logged and err == 28:  # ENOSPC: fs.inotify.max_user_watches
                self._limit_logged = True
                log.error("cannot watch %s: the inotify watch limit is reached "
                          "(fs.inotify.max_user_watches); such keys are found by the stat "
                          "sweep only", path)
            return
        old = self._paths.get(wd)
        if old is not None and self._wds.get(old) == wd:
            del self._wds[old]  # the same directory, renamed: the watch followed it
        self._paths[wd] = path
        self._wds[path] = wd

    def _unwatch(self, path: str) -> None:
        wd = self._wds.pop(path, None)
        if wd is not None:
            self._paths.pop(wd, None)
            self._libc.inotify_rm_watch(self._fd, wd)

    def _on_readable(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, _READ)
            except BlockingIOError:
                return
            except OSError as e:
                log.error("reading inotify events failed: %s; the stat sweep goes on", e)
                return
            if not buf:
                return
            self._dispatch(buf)
            if len(buf) <= _READ - 512:
                return  # drained: a read returns every queued event that fits

    def _dispatch(self, buf: bytes) -> None:
        pos, end = 0, len(buf)
        unpack = _EVENT.unpack_from
        hint = self._hint
        while pos + 16 <= end:
            wd, mask, cookie, length = unpack(buf, pos)
            raw = buf[pos + 16 : pos + 16 + length].rstrip(b"\0")
            pos += 16 + length
            if mask & IN_Q_OVERFLOW:
                # Events were lost: look at every key now rather than at the next sweep.
                for watched in list(self._wds):
                    hint(watched, False)
                continue
            if mask & IN_IGNORED:
                gone_dir = self._paths.pop(wd, None)
                if gone_dir is not None and self._wds.get(gone_dir) == wd:
                    del self._wds[gone_dir]
                continue
            directory = self._paths.get(wd)
            if directory is None or not raw:
                continue  # a watch just removed, or an event about the directory itself
            path = f"{directory}/{os.fsdecode(raw)}"
            key_dir = directory == self._root and bool(mask & IN_ISDIR)
            if mask & IN_MOVED_FROM:
                self._moved[cookie] = path
                if len(self._moved) > _COOKIES:
                    self._moved.popitem(last=False)
                if key_dir:
                    self._unwatch(path)
            elif mask & IN_DELETE and mask & IN_ISDIR:
                continue  # its files' deletions were hinted by its own watch
            if not mask & IN_MOVED_TO:
                hint(path, bool(mask & _GONE))
            else:
                # A rename within the tree replaces what the name held; a file moved in from
                # elsewhere is a creation (as watchdog reported them).
                source = self._moved.pop(cookie, None)
                hint(path, source is not None)
                if key_dir and source is not None:
                    self._watch(path)
                    with contextlib.suppress(OSError):
                        for entry in os.scandir(path):  # its files moved with it
                            hint(f"{source}/{entry.name}", True)
                            hint(entry.path, True)
                    continue
            if key_dir and mask & (IN_CREATE | IN_MOVED_TO):
                self._watch(path)
                # Entries made before the watch existed would otherwise wait for the sweep.
                with contextlib.suppress(OSError):
                    for entry in os.scandir(path):
                        hint(entry.path, False)


class _Watchdog:
    """The fallback where inotify cannot be used: watchdog's observer (one thread per watch,
    events bridged with `call_soon_threadsafe`)."""

    def __init__(self, root: Path, hint: Hint) -> None:
        self._root = root
        self._hint = hint
        self._observer: Any = None

    def start(self) -> None:
        from watchdog.events import (
            DirCreatedEvent,
            DirMovedEvent,
            FileCreatedEvent,
            FileDeletedEvent,
            FileModifiedEvent,
            FileMovedEvent,
            FileSystemEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        loop = asyncio.get_running_loop()
        hint = self._hint

        class Bridge(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # Runs on the observer thread: hand over and return at once. A deletion or a
                # rename is worth passing on: a recreated file can get the same inode back.
                gone = event.event_type in ("deleted", "moved")
                for path in (event.src_path, getattr(event, "dest_path", "")):
                    if path:
                        loop.call_soon_threadsafe(hint, _text(path), gone)

        observer = Observer()
        observer.schedule(Bridge(), str(self._root), recursive=True,
                          event_filter=[FileModifiedEvent, FileCreatedEvent, FileDeletedEvent,
                                        FileMovedEvent, DirCreatedEvent, DirMovedEvent])
        observer.daemon = True
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


def _text(path: Any) -> str:
    return path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else str(path)


class Watcher:
    def __init__(self, root: Path, hint: Hint) -> None:
        self._root = root
        self._hint = hint
        self._impl: Inotify | _Watchdog | None = None

    def start(self) -> None:
        impl = Inotify(self._root, self._hint)
        try:
            impl.start()
        except OSError as e:
            log.warning("inotify unavailable (%s); watching %s with watchdog instead", e,
                        self._root)
            fallback = _Watchdog(self._root, self._hint)
            fallback.start()
            self._impl = fallback
            return
        self._impl = impl

    def stop(self) -> None:
        if self._impl is not None:
            self._impl.stop()
            self._impl = None
