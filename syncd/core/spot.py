"""A path below a trusted directory, as its components: what disk/tree.py opens one at a time.

Pure (no I/O): the roots (roots.py) and the configuration make Spots, the disk layer opens
them. `top` is trusted (a runtimes root, or the directory a glob lists: the configuration names
it); every one of `parts` is a single component, which the disk layer opens with O_NOFOLLOW.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Spot:
    """`top` (trusted, opened as named) and the components below it (each opened with
    O_NOFOLLOW). `path` is for messages and for the watcher's hints, never for opening."""

    top: Path
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for p in self.parts:
            if p in ("", ".", "..") or "/" in p or "\0" in p:
                raise ValueError(f"not one path component: {p!r}")

    @property
    def path(self) -> Path:
        return self.top.joinpath(*self.parts)

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else self.top.name

    @property
    def parent(self) -> Spot:
        if not self.parts:
            raise ValueError(f"{self.top} is the top of its spot")
        return Spot(self.top, self.parts[:-1])

    def __truediv__(self, rel: str) -> Spot:
        """The spot of `rel` (components separated by '/') below this one."""
        return Spot(self.top, self.parts + tuple(rel.split("/")))

    def __str__(self) -> str:
        return str(self.path)
