"""Finding instances: directories below a runtimes root that hold a configured file.

An instance is a directory from 1 to MAX_DEPTH levels below its root that holds (an entry
named like) one of its configured files; its key is its path below the root (see core/roots.py).
What is inside an instance (`resources/`, `workspace/`, any directory below it) is never an
instance, and never listed. A directory without such a file is looked into, down to
MAX_DEPTH: `onebot_123/` holds the instances `onebot_123/group_456`, ...

Nothing is skipped in silence: a directory that would be an instance but cannot be replicated
(a name that is not valid UTF-8, a symbolic link, too deep, unreadable) comes back as
`Skipped`, with the reason.

A sweep runs every second, so a scan must stay cheap with thousands of instances: instances
are not listed at all once found, and any other directory is listed again only when its mtime
changed (an entry was added, removed or renamed in it); so a sweep costs one stat per
directory above the instances. A directory whose mtime was less than RACY_NS old when it was
listed is listed again at the next scan (git's "racily clean" rule: a second change within the
same timestamp tick would not change the mtime).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncd.core.names import part_problem, printable
from syncd.core.roots import MAX_DEPTH, Layout, Root
from syncd.core.spot import Spot
from syncd.disk import tree

RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class Instance:
    key: str
    folder: Path


@dataclass(frozen=True)
class Skipped:
    """A directory that cannot be replicated, and why."""

    folder: Path
    key: str  # printable (bytes that are not UTF-8 shown as \xNN)
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "path": printable(str(self.folder)), "reason": self.reason}


@dataclass(frozen=True)
class Scan:
    instances: list[Instance]
    skipped: list[Skipped]
    roots: list[Root]
    changed: bool  # some directory was listed anew (created, changed or gone) since the last scan


@dataclass(frozen=True)
class _Listing:
    mtime_ns: int | None  # None: listed while racy, list it again next time
    marks: frozenset[str]  # configured file names present (any kind of entry)
    dirs: tuple[str, ...]  # sub-directories (not symbolic links)
    links: tuple[str, ...]  # symbolic links to directories


@dataclass
class _Walk:
    found: list[Instance] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    seen: dict[Path, _Listing] = field(default_factory=dict)
    changed: bool = False


class Scanner:
    """Finds the instances under a layout's roots; keeps what it listed between scans.

    `files_of(key)`: the file names replicated in instance `key`; `names`: every configured
    file name (for directories whose key is not valid). `extra_depth`: look that many levels
    further, to report instances too deep to be replicated (check-config).
    """

    def __init__(self, layout: Layout, files_of: Callable[[str], tuple[str, ...]],
                 names: frozenset[str], extra_depth: int = 0) -> None:
        self.layout = layout
        self.files_of = files_of
        self.names = names
        self.max_depth = MAX_DEPTH + extra_depth
        self.leaves: set[Path] = set()  # instance directories found: they stay instances
        self._cache: dict[Path, _Listing] = {}
        self._last: Scan | None = None
        self._awaited: list[Path] = []  # roots a glob's match may grow (profiles/carol/runtimes)

    def scan(self) -> Scan:
        if self._last is not None and self._unchanged():
            return dataclasses.replace(self._last, changed=False)
        walk = _Walk()
        self._awaited = []
        roots = self._roots(walk)
        for root in roots:
            self._visit(walk, root, root.path, (), None)
        if walk.seen.keys() != self._cache.keys():
            walk.changed = True  # directories gone
        self._cache = walk.seen
        self._last = Scan(walk.found, walk.skipped, roots, walk.changed)
        return self._last

    def _unchanged(self) -> bool:
        """Whether no directory listed last time changed (one stat each), and no awaited root
        appeared: then the last scan stands, and no instance needs a look."""
        try:
            for folder, listing in self._cache.items():
                if listing.mtime_ns is None or os.stat(folder).st_mtime_ns != listing.mtime_ns:
                    return False
        except OSError:
            return False
        return not any(path.is_dir() for path in self._awaited)

    def _roots(self, walk: _Walk) -> list[Root]:
        roots = self.layout.fixed_roots()
        taken = {r.name: r.path for r in roots}
        for spec in self.layout.globs():
            listing = self._list(walk, spec.base, Spot(spec.base))
            if isinstance(listing, str):
                walk.skipped.append(Skipped(spec.base, "", f"cannot list {spec.base} "
                                            f"(for {spec.pattern}): {listing}"))
                continue
            if listing is None:
                continue
            for entry in listing.links:
                if spec.match(entry) is not None:
                    walk.skipped.append(Skipped(spec.base / entry, printable(entry),
                                                "a symbolic link: not followed (a root must "
                                                "be a directory of its own)"))
            for entry in listing.dirs:
                name = spec.match(entry)
                if name is None:
                    continue
                path = spec.root_for(name)
                if spec.tail and not path.is_dir():
                    self._awaited.append(path)
                    continue
                problem = part_problem(name)
                if problem is not None:
                    walk.skipped.append(Skipped(path, printable(name),
                                                f"root name '{printable(name)}': {problem}"))
                elif name in taken:
                    walk.skipped.append(Skipped(path, name, f"root name {name!r} is already "
                                                f"taken by {taken[name]}"))
                else:
                    taken[name] = path
                    roots.append(Root(name, path, spec.base))
        return roots

    def _visit(self, walk: _Walk, root: Root, folder: Path, parts: tuple[str, ...],
               problem: str | None) -> None:
        depth = len(parts)
        key = self.layout.key_of(root, parts)
        if folder in self.leaves:
            self._leaf(walk, folder, key, depth, problem)
            return
        listing = self._list(walk, folder, root.spot_of(parts))
        if listing is None:
            return
        if isinstance(listing, str):
            walk.skipped.append(Skipped(folder, printable(key), f"cannot list: {listing}"))
            return
        if depth == 0:
            if listing.marks:
                walk.skipped.append(Skipped(folder, "", (
                    f"the root itself holds {', '.join(sorted(listing.marks))}: instances "
                    "are the directories below a root (is the root one level too deep?)")))
        else:
            wanted = self.names if problem else frozenset(self.files_of(key))
            if listing.marks & wanted:
                self.leaves.add(folder)
                walk.seen.pop(folder, None)  # never listed again
                self._leaf(walk, folder, key, depth, problem)
                return
        if depth >= self.max_depth:
            return
        for name in listing.dirs:
            below = problem
            if below is None and (bad := part_problem(name)) is not None:
                below = f"component '{printable(name)}': {bad}"
            self._visit(walk, root, folder / name, (*parts, name), below)
        for name in listing.links:
            walk.skipped.append(Skipped(
                folder / name, printable(self.layout.key_of(root, (*parts, name))),
                "a symbolic link: not followed (an instance must be a directory of its own "
                "below the root)"))

    def _leaf(self, walk: _Walk, folder: Path, key: str, depth: int,
              problem: str | None) -> None:
        if problem is not None:
            walk.skipped.append(Skipped(folder, printable(key), problem))
        elif depth > MAX_DEPTH:
            walk.skipped.append(Skipped(folder, printable(key), (
                f"{depth} levels below its root (instances are found at most {MAX_DEPTH} "
                "levels deep)")))
        else:
            walk.found.append(Instance(key, folder))

    def _list(self, walk: _Walk, folder: Path, spot: Spot) -> _Listing | str | None:
        """The folder's listing (cached while its mtime holds); a reason when it cannot be
        listed; None when it is gone. Listed through a descriptor reached from the root one
        level at a time (tree.py): a level swapped for a link is refused, not listed. (The
        stat by name only decides whether to list again.)"""
        try:
            mtime = os.stat(folder).st_mtime_ns
            cached = self._cache.get(folder)
            if cached is not None and cached.mtime_ns == mtime:
                walk.seen[folder] = cached
                return cached
            walk.changed = True
            marks, dirs, links = set(), [], []
            fd = tree.open_dir(spot)
            try:
                mtime = os.fstat(fd).st_mtime_ns  # of what is listed
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if entry.name in self.names:
                            marks.add(entry.name)
                        elif entry.is_dir(follow_symlinks=False):
                            dirs.append(entry.name)
                        elif entry.is_symlink() and entry.is_dir():
                            links.append(entry.name)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except tree.NotRegularFile as e:
            return "a symbolic link: not followed" if e.kind == tree.LINK else e.strerror
        except OSError as e:
            return e.strerror or str(e)
        racy = time.time_ns() - mtime < RACY_NS
        listing = _Listing(None if racy else mtime, frozenset(marks), tuple(sorted(dirs)),
                           tuple(sorted(links)))
        walk.seen[folder] = listing
        return listing


def root_problems(layout: Layout, who: str) -> list[tuple[str, str]]:
    """What stops the roots from being used, as (config key, problem) pairs: a fixed root
    must be a readable and writable directory; the directory a glob lists must exist (the
    roots it matches may come and go)."""
    found = []
    rwx = os.R_OK | os.W_OK | os.X_OK
    for spec in layout.specs:
        where = f"roots.{spec.name}" if spec.in_table else "runtimes_dir"
        d = spec.base
        if not d.is_dir():
            found.append((where, f"{d} does not exist or is not a directory"))
        elif not os.access(d, rwx if not spec.is_glob else os.R_OK | os.X_OK):
            found.append((where, f"{d} is not readable {'and writable ' * (not spec.is_glob)}"
                                 f"by {who}"))
    return found
