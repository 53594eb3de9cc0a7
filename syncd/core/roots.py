"""Runtimes roots, and the one mapping between instance keys and directories.

An instance is a directory below a runtimes root; its key is its path relative to the root,
with `/` between components (`onebot_123/group_456`, `main`). With several roots, every key
starts with the name of its root, so that keys stay unique and mean the same on every host:

    runtimes_dir = "/var/lib/ishiki/runtimes"          one root; key = path below it (unprefixed)
    runtimes_dir = "/srv/ishiki/profiles/*/runtimes"   a root per directory the glob matches;
                                                       key = <what * matched>/<path below it>
    runtimes_dir = ["/a/*/runtimes", "/b/bots"]        a list: each glob as above; a plain path
                                                       is named by its last component ("bots")
    [roots]                                            named roots; key = <name>/<path below it>
    alice = "/srv/alice/runtimes"

A glob has exactly one `*`, inside one path component (`profiles/*/runtimes`,
`profile-*/runtimes`); it matches one directory name that does not start with `.` and is not a
symbolic link. A glob, a list and `[roots]` always prefix keys, even while only one root
exists, so that a root added later renames nothing. Instances sit at most MAX_DEPTH
directories below their root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from syncd.core.names import key_problem, part_problem, printable
from syncd.core.spot import Spot

MAX_DEPTH = 4  # directories from a root down to an instance (`onebot_123/group_456` is 2)


class KeyPathError(ValueError):
    """A key that names no directory under the roots; `reason` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"instance key '{printable(key)}': {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class RootSpec:
    """One `runtimes_dir` entry (a path or a glob) or one `[roots]` entry (`name`)."""

    pattern: Path
    name: str | None = None  # fixed name ([roots], or a plain path in a list); None: see Layout
    in_table: bool = False  # from [roots] (else from runtimes_dir)

    @property
    def is_glob(self) -> bool:
        return "*" in str(self.pattern)

    @cached_property
    def _split(self) -> tuple[Path, str, tuple[str, ...]]:
        """(base, wildcard component, components after it); for a plain path (path, "", ())."""
        parts = self.pattern.parts
        at = next((i for i, p in enumerate(parts) if "*" in p), None)
        if at is None:
            return self.pattern, "", ()
        return Path(*parts[:at]), parts[at], tuple(parts[at + 1:])

    @property
    def base(self) -> Path:
        """For a glob: the directory listed to find its roots; else the root itself."""
        return self._split[0]

    @property
    def tail(self) -> tuple[str, ...]:
        return self._split[2]

    def problem(self) -> str | None:
        """Why this pattern cannot be used (None: it can)."""
        text = str(self.pattern)
        if text.count("*") > 1:
            return "a glob may hold one '*' only (it names the root: the profile)"
        if self.is_glob and not self.base.parts:
            return "the '*' cannot be in the first component"
        return None

    def match(self, entry: str) -> str | None:
        """The root name a directory entry of `base` gives (None: the glob does not match)."""
        pre, post = self._split[1].split("*")
        if len(entry) <= len(pre) + len(post) or not entry.startswith(pre) \
                or not entry.endswith(post):
            return None
        name = entry[len(pre):len(entry) - len(post)]
        return None if name.startswith(".") else name

    def entry_for(self, name: str) -> str:
        """The directory name in `base` that gives root name `name`."""
        return self._split[1].replace("*", name)

    def accepts(self, name: str) -> bool:
        entry = self.entry_for(name)
        return part_problem(entry) is None and self.match(entry) == name

    def root_for(self, name: str) -> Path:
        """The root directory of `name` under this glob."""
        return self.base.joinpath(self.entry_for(name), *self.tail)


@dataclass(frozen=True)
class Root:
    """One root directory; `name` prefixes its keys (None: the single unprefixed root).

    `base`: for a root a glob matched, the directory the glob lists (the configuration names
    it, so it is trusted); the levels from there down to the root are opened like any other
    below a root, without following a link (see spot)."""

    name: str | None
    path: Path
    base: Path | None = field(default=None, compare=False)  # how to reach it, not which

    @property
    def spot(self) -> Spot:
        """The root as a Spot: from the trusted directory, one component at a time."""
        if self.base is None:
            return Spot(self.path)
        return Spot(self.base, self.path.relative_to(self.base).parts)

    def spot_of(self, parts: Sequence[str]) -> Spot:
        """The directory `parts` below this root."""
        s = self.spot
        return Spot(s.top, s.parts + tuple(parts))


@dataclass(frozen=True)
class Place:
    """Where a path is: below `root` at `parts`, or (root None) at or above some root."""

    root: Root | None
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    specs: tuple[RootSpec, ...]
    prefixed: bool  # False only for one plain `runtimes_dir = "path"`

    @classmethod
    def single(cls, path: Path) -> Layout:
        return cls((RootSpec(path),), prefixed=False)

    def describe(self) -> str:
        """The roots as configured, for messages."""
        return ", ".join(f"{s.name} = {s.pattern}" if s.in_table else str(s.pattern)
                         for s in self.specs)

    def fixed_roots(self) -> list[Root]:
        """The roots that are not globs, in order."""
        return [Root(s.name if self.prefixed else None, s.pattern)
                for s in self.specs if not s.is_glob]

    def globs(self) -> list[RootSpec]:
        return [s for s in self.specs if s.is_glob]

    def watch_dirs(self) -> list[Path]:
        """One recursive watch each: fixed roots, and the directory each glob lists."""
        dirs: list[Path] = []
        for d in sorted({s.base for s in self.specs}, key=lambda p: len(p.parts)):
            if not any(d.is_relative_to(w) for w in dirs):
                dirs.append(d)
        return dirs

    def key_of(self, root: Root, parts: Sequence[str]) -> str:
        return "/".join([root.name, *parts] if root.name is not None else parts)

    def shape_problem(self, key: str) -> str | None:
        """Why `key` can name no instance at all, whatever exists on disk (None: it can)."""
        problem = key_problem(key)
        if problem is not None:
            return problem
        depth = key.count("/") + 1 - (1 if self.prefixed else 0)
        if depth < 1:
            return "names a root, not an instance (keys are <root name>/<path below it>)"
        if depth > MAX_DEPTH:
            return f"{depth} levels below its root (at most {MAX_DEPTH})"
        return None

    def locate(self, key: str) -> tuple[Root, tuple[str, ...]]:
        """The root of `key` and its path below it; KeyPathError when there is none.

        Every key-to-path mapping goes through here (the daemon, verify, status, adopt).
        """
        problem = self.shape_problem(key)
        if problem is not None:
            raise KeyPathError(key, problem)
        parts = tuple(key.split("/"))
        if not self.prefixed:
            return Root(None, self.specs[0].pattern), parts
        name, rest = parts[0], parts[1:]
        for root in self.fixed_roots():
            if root.name == name:
                return root, rest
        candidates = [Root(name, s.root_for(name), s.base) for s in self.globs()
                      if s.accepts(name)]
        for root in candidates:
            if root.path.is_dir():
                return root, rest
        if candidates:
            return candidates[0], rest
        raise KeyPathError(key, f"no runtimes root is named '{printable(name)}' (roots: "
                                f"{self.describe()})")

    def folder(self, key: str) -> Path:
        """The directory of instance `key` (it may not exist yet); KeyPathError if none."""
        root, parts = self.locate(key)
        return root.path.joinpath(*parts)

    def spot(self, key: str) -> Spot:
        """The directory of instance `key` as a Spot (how the daemon opens it)."""
        root, parts = self.locate(key)
        return root.spot_of(parts)

    def place(self, path: Path) -> Place | None:
        """Where a path the watcher reported lies (None: under no root, nor above one)."""
        for root in self.fixed_roots():
            if path.is_relative_to(root.path):
                return Place(root, path.relative_to(root.path).parts)
        for spec in self.globs():
            if not path.is_relative_to(spec.base):
                continue
            rel = path.relative_to(spec.base).parts
            if not rel:
                return Place(None)
            name = spec.match(rel[0])
            tail = spec.tail
            if name is None:
                continue
            below = rel[1:]
            if len(below) <= len(tail):
                if below == tail[:len(below)]:
                    return Place(None)  # a root's directory itself, or on the way to it
                continue
            if below[:len(tail)] != tail:
                continue
            return Place(Root(name, spec.root_for(name), spec.base), below[len(tail):])
        return None
