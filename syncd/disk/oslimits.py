"""Reading the kernel's limits that syncd meets at scale (core/oslimits.py judges them).

inotify's limits are per user and, since Linux 4.9, per user namespace too: the sysctls
fs.inotify.* are the initial namespace's, /proc/sys/user/max_inotify_* this namespace's
(unlimited in a new one, such as a unit's PrivateUsers=yes), and the lower of the two is the
one met first. Open files: this process's descriptors and RLIMIT_NOFILE (LimitNOFILE=).
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable
from pathlib import Path

from syncd.core.oslimits import InotifyLimits

PROC_SYS = Path("/proc/sys")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _lowest(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def inotify_limits(proc_sys: Path = PROC_SYS) -> InotifyLimits:
    return InotifyLimits(
        max_user_watches=_lowest(_read_int(proc_sys / "fs/inotify/max_user_watches"),
                                 _read_int(proc_sys / "user/max_inotify_watches")),
        max_user_instances=_lowest(_read_int(proc_sys / "fs/inotify/max_user_instances"),
                                   _read_int(proc_sys / "user/max_inotify_instances")))


def open_files() -> tuple[int, int | None, int | None]:
    """(descriptors open in this process, soft limit, hard limit); a limit is None when
    unlimited. -1 descriptors when /proc/self/fd cannot be listed."""
    try:
        count = len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        count = -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def known(v: int) -> int | None:
        return None if v == resource.RLIM_INFINITY else v

    return count, known(soft), known(hard)


def count_directories(tops: Iterable[Path]) -> int:
    """The directories the watcher would watch below `tops` (each top included): every one
    it can read, reached through no symbolic link, as disk/watcher.py walks them."""
    count = 0
    stack = [os.fsencode(t) for t in tops if t.is_dir() and not t.is_symlink()]
    while stack:
        folder = stack.pop()
        if not os.access(folder, os.R_OK | os.X_OK):
            continue
        count += 1
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    return count
