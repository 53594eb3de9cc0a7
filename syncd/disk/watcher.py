"""Filesystem hints (inotify on Linux), read on the event loop.

Every event is only a hint: "look at this path again". The replica decides with fstat. The
kernel merges identical unread events and drops everything on queue overflow, so hints are
never counted, an overflow asks for a look at everything, and the node's periodic stat sweep
catches whatever never arrived.

Each directory under the roots is watched (inotify is not recursive), down to `max_depth`
levels below its root: directories that appear later are added as they are reported, and what
was created in them before their watch existed is reported too. A directory is reached the
way every other is below a root (tree.py: one level at a time from the root, no symbolic
link followed, an iterative walk) and watched through its descriptor (/proc/self/fd), so a
tree deeper than Python's stack, a link or an unreadable directory is left unwatched, never a
crash, and a directory swapped for a link is never watched in its place.

The events of one read are reduced to one hint per (path, gone) before they are handed on, so
a burst of writes to one file costs one look.

The kernel's limits (core/oslimits.py) are met gracefully: a directory refused a watch for
lack of watches (fs.inotify.max_user_watches) is remembered and walked all the same, so that
the count of directories needed is right; no instance (fs.inotify.max_user_instances) means
no watches at all. Either way the sweep finds the changes, and every rewatch() (each
directory scan of the sweep) tries again, so that a raised limit takes effect without a
restart.

Where inotify is missing (not Linux), watchdog's observer does the same from its threads.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncd.core.oslimits import WATCHES, how_to_raise, no_instance, suggested
from syncd.core.spot import Spot
from syncd.disk import inotify, oslimits, tree

log = logging.getLogger("syncd.watcher")

Hint = Callable[[str, bool], None]  # (path, gone): gone = deleted, or moved away or over

_GONE = (inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
         | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF)
_SELF = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
READS_PER_WAKE = 16  # read(2)s per wake-up at most: coalesce a burst, never starve the loop
_ROOM = 16 + 256  # one event at most: its header and the longest name (NAME_MAX + 1)


class Watcher:
    def __init__(self, roots: list[Path], hint: Hint,
                 overflow: Callable[[], None] | None = None, backend: str = "auto",
                 max_depth: int = 64) -> None:
        self._roots = [os.fsencode(r) for r in roots]
        self._max_depth = max_depth
        self._by_fd = os.path.isdir("/proc/self/fd")
        self._hint = hint
        self._overflow = overflow
        self._backend = backend if backend != "auto" else (
            "inotify" if inotify.available() else "watchdog")
        self._fd = -1
        self._dirs: dict[int, bytes] = {}  # watch descriptor -> directory
        self._wds: dict[bytes, int] = {}  # directory -> watch descriptor
        # Directories refused a watch for lack of watches (ENOSPC): retried by rewatch().
        self._unwatched: set[bytes] = set()
        self._full_logged = False
        self._quiet = False  # no ENOSPC log line while start() walks: the node says it once
        self._started = False
        self.no_instance: str | None = None  # why inotify_init1 failed, while it does
        self._observer: Any = None
        self._held = False  # events left in the kernel's queue until drain() (see hold())

    @property
    def watched(self) -> int:
        """Directories under watch (inotify)."""
        return len(self._dirs)

    @property
    def unwatched(self) -> int:
        """Directories found that have no watch for lack of watches."""
        return len(self._unwatched)

    @property
    def needed(self) -> int:
        """Watches the roots need: one per directory found below them (to max_depth)."""
        return len(self._dirs) + len(self._unwatched)

    @property
    def active(self) -> bool:
        """Changes are hinted (by inotify or watchdog's observer), not only swept."""
        return self._fd >= 0 or self._observer is not None

    def start(self) -> None:
        self._started = True
        if self._backend == "watchdog":
            self._observer = _start_watchdog(self._roots, self._hint)
            return
        self._quiet = True
        try:
            self._open(None)
        finally:
            self._quiet = False
        self._full_logged = bool(self._unwatched)

    def _open(self, hints: dict[tuple[bytes, bool], None] | None) -> None:
        """A new inotify instance, watching every directory below the roots; when the kernel
        refuses an instance, say why (once per cause) and leave it to the sweep."""
        try:
            self._fd = inotify.init()
        except OSError as e:
            count, soft, _hard = oslimits.open_files()
            why = no_instance(oslimits.inotify_limits(), count, soft, e.strerror or str(e))
            if why != self.no_instance:
                log.error("%s", why)
            self.no_instance = why
            return
        if self.no_instance is not None:
            log.info("inotify instance obtained: watching the runtimes roots again")
        self.no_instance = None
        for root in self._roots:
            self._add_tree(root, hints)
        asyncio.get_running_loop().add_reader(self._fd, self._read)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._fd >= 0:
            if not self._held:
                asyncio.get_running_loop().remove_reader(self._fd)
            self._held = False
            os.close(self._fd)
            self._fd = -1
            self._dirs.clear()
            self._wds.clear()
            self._unwatched.clear()
        self._started = False

    def hold(self) -> None:
        """Leave events in the kernel's queue: while the node gathers changes anyway
        (daemon/window.py), waking up for each write would cost a loop turn per write for nothing.
        drain() reads them all at once. An overflow meanwhile is reported as always."""
        if self._fd >= 0 and not self._held:
            self._held = True
            asyncio.get_running_loop().remove_reader(self._fd)

    def drain(self) -> None:
        """Hand on the events held back since hold(), now (they stay held afterwards)."""
        if self._held:
            self._read()

    def resume(self) -> None:
        """Read events as they come again."""
        if self._held:
            self._held = False
            asyncio.get_running_loop().add_reader(self._fd, self._read)

    def rewatch(self) -> None:
        """Called by the sweep: watch the roots that were missing at start, the directories
        refused a watch for lack of watches (what they hold is hinted: it may have changed
        meanwhile), and get an inotify instance if there was none."""
        if not self._started or self._backend != "inotify":
            return
        hints: dict[tuple[bytes, bool], None] = {}
        if self._fd < 0:
            self._open(hints)
        else:
            for root in self._roots:
                if root not in self._wds and root not in self._unwatched:
                    self._add_tree(root, None)
            for folder in sorted(self._unwatched, key=len):  # parents first
                if folder not in self._unwatched:
                    continue  # watched meanwhile, with a parent's tree
                self._unwatched.discard(folder)
                self._add_tree(folder, hints)
                if folder in self._unwatched:
                    break  # still no watch to spare: the next rewatch tries again
        for path, gone in hints:
            self._hint(os.fsdecode(path), gone)

    # --- inotify ------------------------------------------------------------------------------

    def _read(self) -> None:
        hints: dict[tuple[bytes, bool], None] = {}  # ordered set
        for _ in range(READS_PER_WAKE):
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                log.error("cannot read filesystem events: %s; relying on the sweep", e)
                break
            for ev in inotify.parse(buf):
                self._event(ev, hints)
            if len(buf) < (1 << 16) - _ROOM:
                # Short: the queue was empty. What comes next wakes the loop again (the
                # reader is level-triggered); a second read only met EAGAIN, per wake-up.
                break
        for path, gone in hints:
            self._hint(os.fsdecode(path), gone)

    def _event(self, ev: inotify.Event, hints: dict[tuple[bytes, bool], None]) -> None:
        mask = ev.mask
        if mask & inotify.IN_Q_OVERFLOW:
            log.warning("filesystem event queue overflowed; looking at every file again")
            if self._overflow is not None:
                self._overflow()
            return
        if mask & inotify.IN_IGNORED:
            self._drop(ev.wd)
            return
        folder = self._dirs.get(ev.wd)
        if folder is None:
            return
        if not ev.name:
            # The directory itself went: its parent reports that too, but nothing reports a
            # root's removal but this.
            if mask & _SELF and folder in self._roots:
                hints[(folder, True)] = None
            return
        path = folder + b"/" + ev.name
        if mask & inotify.IN_ISDIR:
            if mask & (inotify.IN_MOVED_FROM | inotify.IN_DELETE):
                self._forget_tree(path)
            elif mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                if mask & inotify.IN_MOVED_TO:
                    self._forget_tree(path)  # moved over an old directory of that name
                self._add_tree(path, hints)
        hints[(path, bool(mask & _GONE))] = None

    def _add_tree(self, top: bytes, hints: dict[tuple[bytes, bool], None] | None) -> None:
        """Watch `top` and every directory below it; with `hints`, report what is inside
        (it may have been created before the watches existed). Below a directory refused a
        watch for lack of watches the walk goes on, to count what the roots need."""
        spot = self._spot(top)
        if spot is None or len(spot.parts) > self._max_depth:
            return
        try:
            fd = tree.open_dir(spot)
        except OSError:
            return  # gone already, a link (not followed), unreadable: the sweep covers it
        try:
            if not self._add(fd, top):
                return

            def entering(sub: int, rel: str) -> bool:
                path = top + b"/" + os.fsencode(rel)
                if hints is not None:
                    hints[(path, False)] = None
                return self._add(sub, path)

            walk = tree.Walk(fd, self._max_depth - len(spot.parts), entering=entering)
            for entry in walk:
                if hints is not None:
                    hints[(top + b"/" + os.fsencode(entry.rel), False)] = None
            if hints is not None:  # links and the like: their scans say what they are
                for p in walk.problems:
                    hints[(top + b"/" + os.fsencode(p.rel), False)] = None
        finally:
            os.close(fd)

    def _spot(self, path: bytes) -> Spot | None:
        """`path` as a Spot below the watched root it lies in (None: in none)."""
        for root in self._roots:
            if path == root or path.startswith(root + b"/"):
                rel = path[len(root) + 1:]
                parts = tuple(os.fsdecode(p) for p in rel.split(b"/")) if rel else ()
                try:
                    return Spot(Path(os.fsdecode(root)), parts)
                except ValueError:
                    return None
        return None

    def _add(self, fd: int, folder: bytes) -> bool:
        """Watch the directory open as `fd` (reported as `folder`); False when it is no
        directory to walk (gone, not a directory). A directory refused for lack of watches
        is walked (True), and kept for rewatch()."""
        try:
            if self._by_fd:
                # The descriptor's magic link leads to the very directory opened, whatever
                # its name names by now (IN_DONT_FOLLOW would stop at the magic link).
                wd = inotify.add_watch(self._fd, f"/proc/self/fd/{fd}".encode(),
                                       inotify.DIR_MASK & ~inotify.IN_DONT_FOLLOW)
            else:
                wd = inotify.add_watch(self._fd, folder)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return False  # gone already, or not a directory (a symlink: not followed)
            if e.errno == errno.ENOSPC:
                self._unwatched.add(folder)
                if not self._full_logged and not self._quiet:
                    self._full_logged = True
                    log.warning("inotify watch limit reached at %s (%s; %d directories "
                                "watched): changes below it are found by the sweep only; %s",
                                os.fsdecode(folder), WATCHES, len(self._dirs),
                                how_to_raise(WATCHES, suggested(self.needed)))
                return True
            log.warning("cannot watch %s: %s; changes there are found by the sweep",
                        os.fsdecode(folder), e.strerror)
            return False
        self._unwatched.discard(folder)
        old = self._dirs.get(wd)
        if old is not None and old != folder:
            self._wds.pop(old, None)  # the same directory under a new name
        self._dirs[wd] = folder
        self._wds[folder] = wd
        return True

    def _forget_tree(self, top: bytes) -> None:
        below = top + b"/"
        for folder in [f for f in self._wds if f == top or f.startswith(below)]:
            wd = self._wds.pop(folder)
            if self._dirs.get(wd) == folder:
                del self._dirs[wd]
                inotify.rm_watch(self._fd, wd)
        self._unwatched -= {f for f in self._unwatched if f == top or f.startswith(below)}

    def _drop(self, wd: int) -> None:
        folder = self._dirs.pop(wd, None)
        if folder is not None and self._wds.get(folder) == wd:
            del self._wds[folder]


# --- watchdog (no inotify) ------------------------------------------------------------------


def _start_watchdog(roots: list[bytes], hint: Hint) -> Any:
    from watchdog.events import (
        DirCreatedEvent,
        DirDeletedEvent,
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

    class Bridge(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            # Runs on the observer thread: hand over and return at once.
            gone = event.event_type in ("deleted", "moved")
            for path in (event.src_path, getattr(event, "dest_path", "")):
                if path:
                    loop.call_soon_threadsafe(hint, _text(path), gone)

    observer = Observer()
    bridge = Bridge()
    for root in roots:
        if os.path.isdir(root):
            observer.schedule(bridge, os.fsdecode(root), recursive=True,
                              event_filter=[FileModifiedEvent, FileCreatedEvent,
                                            FileDeletedEvent, FileMovedEvent, DirCreatedEvent,
                                            DirMovedEvent, DirDeletedEvent])
    observer.daemon = True
    observer.start()
    return observer


def _text(path: Any) -> str:
    return path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else str(path)
