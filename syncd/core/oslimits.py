"""The kernel's limits that syncd meets at scale, and what to raise when they are too low.

Pure: disk/oslimits.py reads the numbers; this says whether they suffice and, when not, what
to type. The watcher (disk/watcher.py) uses one inotify instance per daemon and one watch per
directory under the runtimes roots (inotify is not recursive: every directory of every
instance, resources/ and workspace/ included). The kernel counts both per user:

- fs.inotify.max_user_watches: a directory without a watch still replicates, but a change
  in it is found by the sweep only (late: README, sweep_interval);
- fs.inotify.max_user_instances: without an instance nothing is watched at all.

The user's other processes share both limits (and a service in a user namespace, such as
PrivateUsers=yes, is counted for the namespace's owner too), so the value suggested leaves
room: the roots may double before it is reached again.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTANCES_NEEDED = 1  # one inotify instance per daemon
# Descriptors kept open on replicated files (disk/openfiles.py): half of RLIMIT_NOFILE above
# a reserve for everything else (the broker's socket, 64 control connections, state files,
# log checks, resource files), never fewer than KEPT_FLOOR nor more than KEPT_CEILING.
KEPT_FLOOR = 64
KEPT_CEILING = 32768
NOFILE_RESERVE = 256
SYSCTL_FILE = "/etc/sysctl.d/60-syncd.conf"
WATCHES = "fs.inotify.max_user_watches"
INSTANCES = "fs.inotify.max_user_instances"


@dataclass(frozen=True)
class InotifyLimits:
    """The limits in force for this user (None: unknown, e.g. /proc/sys not readable)."""

    max_user_watches: int | None
    max_user_instances: int | None


def kept_descriptors(soft_nofile: int | None) -> int:
    """How many descriptors on replicated files may stay open, given the soft RLIMIT_NOFILE
    (None: unlimited). The unit's LimitNOFILE=65536 keeps 32 640: a host's thousands of busy
    files each keep theirs (reopening one per write cost an open, an fstat and a close each,
    on both hosts); a shell's default 1024 keeps 384."""
    if soft_nofile is None:
        return KEPT_CEILING
    return max(KEPT_FLOOR, min(KEPT_CEILING, (soft_nofile - NOFILE_RESERVE) // 2))


def suggested(need: int, floor: int = 8192) -> int:
    """Room for twice `need`: the power of two at or above 2 x need (at least `floor`)."""
    value = floor
    while value < 2 * need:
        value *= 2
    return value


def how_to_raise(setting: str, value: int) -> str:
    return (f"raise it: sysctl -w {setting}={value}, and keep it across reboots with the line "
            f"'{setting} = {value}' in {SYSCTL_FILE}")


def shortfalls(limits: InotifyLimits, directories: int, unwatched: int = 0,
               instances: int = INSTANCES_NEEDED) -> list[str]:
    """Warnings, each saying what to raise: the limits below what the roots need
    (`directories` to watch, `instances`), or (`unwatched` > 0) watches used up anyway,
    by this user's other processes."""
    found = []
    watches = limits.max_user_watches
    if watches is not None and watches < directories:
        found.append(
            f"{WATCHES} is {watches}, fewer than the {directories} directories under the "
            f"runtimes roots (syncd watches each one): changes in {directories - watches} or "
            f"more of them are found by the sweep only, late; "
            f"{how_to_raise(WATCHES, suggested(directories))}")
    elif unwatched:
        found.append(
            f"{unwatched} of the {directories} directories under the runtimes roots have no "
            f"inotify watch: this user's watches ({WATCHES}"
            f"{f' = {watches}' if watches is not None else ''}) are used up, by other "
            f"processes of the same user too; changes there are found by the sweep only, "
            f"late; {how_to_raise(WATCHES, suggested(max(directories, watches or 0)))}")
    if limits.max_user_instances is not None and limits.max_user_instances < instances:
        found.append(
            f"{INSTANCES} is {limits.max_user_instances}: syncd needs {instances} inotify "
            f"instance{'s' if instances != 1 else ''}, and finds changes by the sweep only "
            f"without; {how_to_raise(INSTANCES, suggested(instances, 128))}")
    return found


def no_instance(limits: InotifyLimits, open_files: int, open_files_limit: int | None,
                error: str) -> str:
    """Why the watcher has no inotify instance (inotify_init1 failed with `error`), and what
    to raise: EMFILE means this user's instances are all in use, or this process's
    descriptors (LimitNOFILE)."""
    if open_files_limit is not None and open_files >= open_files_limit - 1:
        cause = (f"this process has {open_files} of its {open_files_limit} file descriptors "
                 "open: raise LimitNOFILE= in the unit (systemctl edit syncd)")
    elif (have := limits.max_user_instances) is not None and have < INSTANCES_NEEDED:
        cause = (f"{INSTANCES} is {have}; "
                 f"{how_to_raise(INSTANCES, suggested(INSTANCES_NEEDED, 128))}")
    else:
        cause = (f"this user's inotify instances ({INSTANCES}"
                 f"{f' = {have}' if have is not None else ''}) are all in use, by other "
                 f"processes of the same user; "
                 f"{how_to_raise(INSTANCES, suggested(max(have or 0, INSTANCES_NEEDED), 128))}")
    return (f"cannot watch the runtimes roots ({error}): {cause}. Until then changes are "
            "found by the sweep only, late; syncd tries again at every directory scan")
