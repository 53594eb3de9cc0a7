"""Reading the kernel's limits that syncd meets at scale (core/oslimits.py judges them).

inotify's limits are per user and, since Linux 4.9, per user namespace too: the sysctls
fs.inotify.* are the initial namespace's, /proc/sys/user/max_inotify_* this namespace's
(unlimited in a new one, such as a unit's PrivateUsers=yes), and the lower of the two is the
one met first. Open files: this process's descriptors and RLIMIT_NOFILE (LimitNOFILE=).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from pathlib import Path

from syncd.core.oslimits import InotifyLimits
from syncd.core.spot import Spot
from syncd.disk import tree

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


def count_directories(tops: Iterable[Path], max_depth: int) -> int:
    """The directories the watcher would watch below `tops` (each top included), down to
    `max_depth` levels: the same walk as disk/watcher.py's (tree.py: no symbolic link
    followed, unreadable ones left out)."""
    count = 0

    def entering(_fd: int, _rel: str) -> bool:
        nonlocal count
        count += 1
        return True

    for top in tops:
        try:
            fd = tree.open_dir(Spot(top, ()))
        except (OSError, ValueError):
            continue  # missing, a link, unreadable: not watched either
        try:
            count += 1
            for _entry in tree.Walk(fd, max_depth, entering=entering):
                pass
        finally:
            os.close(fd)
    return count
