"""Trace when bytes are present in a target file, for replicators that trace nothing (lsyncd).

    python -m bench.watch_target DIR FILE KEY OUT

Watches DIR with inotify (modify, close-write, create, moved-to, attrib: rsync appends in
place with --append-verify and renames a temporary file otherwise). After each batch of events
it stats DIR/FILE and, when the size grew, appends "KEY FILE size monotonic_ns" to OUT (the
format of syncd's SYNCD_TRACE_FILE); the time is taken after the stat, so a size is never
dated before it was seen. A 50 ms poll timeout re-stats as a safety net. Prints "ready" once
the watch is in place; runs until killed.
"""

from __future__ import annotations

import ctypes
import os
import select
import sys
import time
from pathlib import Path

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x4, 0x8, 0x80, 0x100


def main() -> None:
    directory, name, key, out = sys.argv[1:5]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    mask = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
    if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
        raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
    target = Path(directory) / name
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    last = -1
    with open(out, "a", buffering=1) as trace:
        print("ready", flush=True)
        while True:
            if poller.poll(50):
                try:
                    while os.read(fd, 65536):
                        pass
                except BlockingIOError:
                    pass
            try:
                size = os.stat(target).st_size
            except FileNotFoundError:
                continue
            now = time.monotonic_ns()
            if size > last:
                last = size
                trace.write(f"{key} {name} {size} {now}\n")


if __name__ == "__main__":
    main()
