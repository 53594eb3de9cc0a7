"""Can this host take over what the selectors name, now? The answer of `syncd status --ready`.

Per file, READY is readiness.decide's (`ready` and `not_ready` in the status document). Over
selectors (selection.py): ready when every selector names at least one replicated file and
every file it names is ready. A selector that names no file is not ready: a typo in a bot
unit's selector, or a profile this host has not heard of, must not start the bot on nothing.

Pure: a status document in, a verdict out; `syncd status` prints it and does the waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from syncd.core.selection import is_glob, matches


@dataclass(frozen=True)
class FileVerdict:
    key: str
    file: str
    ready: bool
    reasons: tuple[str, ...]  # why not (empty when ready)
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Named:
    """What one selector names, and whether all of it can be taken over."""

    selector: str
    files: tuple[FileVerdict, ...]  # in the status document's order (by key, then file)

    @property
    def exact(self) -> bool:
        """The selector is one key, and names that key only: shown as a key always was."""
        return not is_glob(self.selector) and all(f.key == self.selector for f in self.files)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.key for f in self.files))

    @property
    def unready(self) -> tuple[FileVerdict, ...]:
        return tuple(f for f in self.files if not f.ready)

    @property
    def ready(self) -> bool:
        return bool(self.files) and not self.unready


@dataclass(frozen=True)
class Takeover:
    node: str
    named: tuple[Named, ...]

    @property
    def ready(self) -> bool:
        return bool(self.named) and all(n.ready for n in self.named)

    @property
    def unready_files(self) -> int:
        """Files not ready, each counted once even if several selectors name it."""
        return len({(f.key, f.file) for n in self.named for f in n.unready})


def _verdict(f: Mapping[str, Any]) -> FileVerdict:
    return FileVerdict(f["key"], f["file"], bool(f["ready"]), tuple(f.get("not_ready", ())),
                       tuple(f.get("notes", ())))


def takeover(status: Mapping[str, Any], selectors: Iterable[str]) -> Takeover:
    files = [_verdict(f) for f in status["files"]]
    return Takeover(status["node"], tuple(
        Named(s, tuple(f for f in files if matches(s, f.key))) for s in selectors))


def to_json(t: Takeover) -> dict[str, Any]:
    """The verdict as `status --ready --json` prints it (README: Readiness)."""
    return {
        "node": t.node,
        "ready": t.ready,
        "selectors": [{
            "selector": n.selector,
            "ready": n.ready,
            "keys": list(n.keys),
            "files": len(n.files),
            "ready_files": len(n.files) - len(n.unready),
            "not_ready": [{"key": f.key, "file": f.file, "reasons": list(f.reasons),
                           "notes": list(f.notes)} for f in n.unready],
        } for n in t.named],
    }
