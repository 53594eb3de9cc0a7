"""Which files under an instance's resources/ travel, and by which rule (config [resources]).

WRITE-ONCE names are fetched whole and never replaced; REPLACED names (sidecars) carry a
version, and the highest wins (the rules in full: resources/__init__.py).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from enum import Enum

from syncd.core import frames
from syncd.core.frames import ResEntry

DEFAULT_INCLUDE = ("artifacts/**", "assets/**")
DEFAULT_EXCLUDE: tuple[str, ...] = ()
DEFAULT_REPLACED = ("*.json", "*.view")
# Always excluded, whatever the config says: the writer's temp files (`.<name>.<uuid>.tmp`,
# `<name>.json.<uuid>.tmp`) and syncd's own (`.<name>.syncd.tmp`) are never complete files.
TEMP_PATTERNS = ("*.tmp",)
MAX_FILE_BYTES = 32 << 20
# Directories below resources/ that a scan goes into ([resources] max_depth): Ishiki's deepest
# is 2 (artifacts/shake/); a bot-made tree deeper than this is shown, not walked.
MAX_DEPTH = 32


class FileKind(Enum):
    ONCE = "once"
    REPLACED = "replaced"


def _match(name: str, pattern: str) -> bool:
    # A pattern with a '/' is matched against the whole path (its `*` crosses '/', so
    # `artifacts/**` is everything below artifacts/); one without, against the last component.
    target = name if "/" in pattern else name.rsplit("/", 1)[-1]
    return fnmatch.fnmatchcase(target, pattern)


@dataclass(frozen=True)
class Rules:
    """Which files under resources/ replicate, and by which rule (config [resources])."""

    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    replaced: tuple[str, ...] = DEFAULT_REPLACED
    max_file_bytes: int = MAX_FILE_BYTES
    max_depth: int = MAX_DEPTH

    def kind(self, name: str) -> FileKind | None:
        """The rule for `name` (a path relative to resources/), None: it does not travel."""
        if len(name) > CACHED_NAME:
            return _rule(self, name)
        kinds: dict[str, FileKind | None] | None = self.__dict__.get("_kinds")
        if kinds is None:
            kinds = {}
            object.__setattr__(self, "_kinds", kinds)  # not a field: not compared, not hashed
        try:
            return kinds[name]
        except KeyError:
            pass
        kind = _rule(self, name)
        if len(kinds) >= CACHED_NAMES:
            kinds.clear()
        kinds[name] = kind
        return kind


# The rule of each name is asked for at every sweep: cached per Rules, names up to
# CACHED_NAME long, CACHED_NAMES of them. Peers announce names too, and the cache must not
# become a way to hold their memory: full, it starts again empty. A dict entry costs 26-40
# bytes besides the name it keeps alive; functools.lru_cache's (its link, a key made of the
# rules and the name, the entry) 149, 2.4 MB full, and full it stayed under a hostile peer's
# random names, each kept alive too (tracemalloc, 16 000 names of 23 characters:
# docs/peer-limits.md). A hit costs 160 ns instead of 580 (the frozen Rules hashed each time).
CACHED_NAME = 128
CACHED_NAMES = 1 << 14


def _rule(rules: Rules, name: str) -> FileKind | None:
    if frames.resource_name_problem(name) is not None:
        return None
    if name.count("/") > rules.max_depth:
        # Deeper than our own scans go: no peer's name makes us create such a tree either.
        return None
    if any(_match(name, p) for p in TEMP_PATTERNS + rules.exclude):
        return None
    if not any(_match(name, p) for p in rules.include):
        return None
    return FileKind.REPLACED if any(_match(name, p) for p in rules.replaced) else FileKind.ONCE


def version(e: ResEntry) -> tuple[int, str]:
    return (e.stamp, e.origin)
