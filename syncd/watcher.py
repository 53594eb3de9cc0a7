"""Filesystem hints from watchdog (inotify on Linux), bridged into the event loop.

Every event is only a hint: "look at this path again". The replica decides with fstat. The
kernel merges identical unread events and drops everything on queue overflow, so hints are
never counted and the node's periodic stat sweep catches whatever never arrived.
One recursive watch per directory given (each watchdog `schedule()` costs a thread): the
runtimes root, or with several roots each fixed root and the directory a glob lists (so that
a profile created later is seen too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

Hint = Callable[[str, bool], None]  # (path, gone): gone = deleted, or moved away or over


class _Bridge(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, hint: Hint) -> None:
        self._loop = loop
        self._hint = hint

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Runs on the observer thread: hand over and return at once. A deletion or a rename
        # is worth passing on: a recreated file can get the same inode number back.
        gone = event.event_type in ("deleted", "moved")
        for path in (event.src_path, getattr(event, "dest_path", "")):
            if path:
                self._loop.call_soon_threadsafe(self._hint, _text(path), gone)


def _text(path: Any) -> str:
    return path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else str(path)


class Watcher:
    def __init__(self, roots: list[Path], hint: Hint) -> None:
        self._roots = roots
        self._hint = hint
        self._observer: Any = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        observer = Observer()
        # Only what can change a file's bytes or existence: our own reads open and close the
        # files all the time, and open/close events would wake us for nothing.
        bridge = _Bridge(loop, self._hint)
        for root in self._roots:
            observer.schedule(bridge, str(root), recursive=True,
                              event_filter=[FileModifiedEvent, FileCreatedEvent,
                                            FileDeletedEvent, FileMovedEvent, DirCreatedEvent,
                                            DirMovedEvent, DirDeletedEvent])
        observer.daemon = True
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
