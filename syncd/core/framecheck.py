"""The log checks of a `*.zstd` log: each whole frame decompressed, its JSONL fed to the checker.

`FrameChecker` has LogChecker's interface (feed, report, references, to_state/from_state), so
that `syncd verify`, the daemon's incremental check (daemon/logfollow.py) and READY treat a
frames file as they treat a lines file; `checker_for(records)` picks one. The bytes fed are the
file's compressed bytes; a frame is decompressed once it is whole (libzstd checks its content
checksum when it has one) and the lines it holds go to the JSONL checker behind, whose line
numbers and offsets count the decompressed stream (as `zstdcat FILE | jq` would). Problems of
the frames themselves name the frame (1-based, in `line` and in the message) and its file offset:
`damaged_frame` (a frame that does not decompress, or bytes that are no frame) and
`torn_tail` (an unfinished frame at the end, which syncd never ships).

Bounds: a frame is held while it is assembled up to `hold` compressed bytes (at least
MIN_FRAME_HOLD); a longer one is not checked, and says so in a note. Its content is
decompressed at most MAX_CONTENT bytes (a frame's declared window is capped by libzstd's
default limit, 128 MiB): more is damage, not memory.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import orjson

from syncd.core import recordkinds
from syncd.core.logcheck import LogChecker, with_problems
from syncd.core.logreport import Problem, ProblemKind, Report
from syncd.core.zstdframes import FrameScanner

try:
    from compression import zstd as _zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd as _zstd  # type: ignore[no-redef,unused-ignore]

STATE_VERSION = 2  # 2: its inner LogChecker's state 5 (dsh sessions)
MIN_FRAME_HOLD = 64 << 20  # compressed bytes of one frame held for its check, at least
MAX_CONTENT = 1 << 30  # decompressed bytes of one frame, at most
OUT_STEP = 1 << 20  # decompressed a MiB at a time, each fed on at once


class FrameChecker:
    """Feed it the bytes of a `.zstd` log from its first byte on; ask for a report any time."""

    unread_line: tuple[int, int] | None = None  # frames are held whole: never a line to read

    def __init__(self, hold: int | None = None) -> None:
        self.hold = None if hold is None else max(hold, MIN_FRAME_HOLD)
        self.inner = LogChecker()  # lines inside one frame's content are held whole
        self._scanner = FrameScanner(0)
        self._frame = bytearray()  # the bytes of the frame being assembled (if held)
        self._frame_size = 0  # how many bytes it has so far
        self._frames = 0  # whole frames seen
        self._checked = 0  # file bytes of the whole frames seen
        self._problems: list[Problem] = []
        self._counts: dict[str, int] = {}
        self._unchecked: list[tuple[int, int, int]] = []  # (frame, offset, size) not held

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> int:
        view = memoryview(data)
        sc = self._scanner
        while view:
            want = sc.wanted()
            if want is None:  # damage: nothing after it is a frame we can find
                self._take(view)
                break
            at, header = want
            # Content up to the next header (skipped by the scanner), or that header's bytes.
            n = min(len(view), at - sc.pos if at > sc.pos else header)
            sc.feed(view[:n])
            self._take(view[:n])
            view = view[n:]
            if sc.at_boundary and self._frame_size:
                self._finish()
        return len(data)

    def resume_with(self, line: bytes) -> None:
        raise ValueError("a frames checker holds whole frames: no line to resume with")

    def _take(self, piece: memoryview) -> None:
        self._frame_size += len(piece)
        if self.hold is None or self._frame_size <= self.hold:
            self._frame += piece
        elif self._frame:
            self._frame = bytearray()

    def _finish(self) -> None:
        """A whole frame: check what it holds."""
        number, offset, size = self._frames + 1, self._checked, self._frame_size
        frame = bytes(self._frame)
        self._frames, self._checked = number, offset + size
        self._frame, self._frame_size = bytearray(), 0
        if len(frame) != size:
            self._unchecked.append((number, offset, size))
            del self._unchecked[:-20]
            return
        if frame[:4] != b"\x28\xb5\x2f\xfd":
            return  # a skippable frame: metadata, no log content
        decompressor = _zstd.ZstdDecompressor()
        produced = 0
        try:
            while True:
                out = decompressor.decompress(frame, OUT_STEP)
                frame = b""
                produced += len(out)
                if produced > MAX_CONTENT:
                    raise _zstd.ZstdError(f"content larger than {MAX_CONTENT} bytes")
                if out:
                    self.inner.feed(out)
                if decompressor.eof:
                    break
                if not out and decompressor.needs_input:
                    raise _zstd.ZstdError("the frame ends before its content does")
        except _zstd.ZstdError as e:
            self._record(Problem(ProblemKind.DAMAGED_FRAME, number, offset,
                                 f"frame {number} ({size} bytes from byte {offset}) does not "
                                 "decompress", str(e)))

    def _record(self, problem: Problem) -> None:
        count = self._counts.get(problem.kind.value, 0) + 1
        self._counts[problem.kind.value] = count
        if count <= 20:
            self._problems.append(problem)

    def references(self) -> dict[str, tuple[int, int]]:
        return self.inner.references()

    # -- reporting -------------------------------------------------------------------------

    def report(self) -> Report:
        inner = self.inner.report()
        extra = list(self._problems)
        sc = self._scanner
        if self._frame_size and sc.damage is not None:
            extra.append(Problem(ProblemKind.DAMAGED_FRAME, self._frames + 1, self._checked,
                                 f"frame {self._frames + 1}: the {self._frame_size} bytes from "
                                 f"byte {self._checked} on are no Zstandard frame",
                                 sc.damage))
        elif self._frame_size:
            extra.append(Problem(ProblemKind.TORN_TAIL, self._frames + 1, self._checked,
                                 f"torn tail: frame {self._frames + 1} is unfinished "
                                 f"({self._frame_size} bytes from byte {self._checked})"))
        notes = [f"frame {n} at offset {o} ({s} bytes) is too large to check here"
                 for n, o, s in self._unchecked]
        report = with_problems(inner, extra, notes)
        # with_problems counts the listed extras; the recorded ones may be more.
        counts = dict(report.problem_counts)
        for kind, n in self._counts.items():
            listed = sum(1 for p in self._problems if p.kind == kind)
            counts[kind] = counts.get(kind, 0) + n - listed
        return dataclasses.replace(report, bytes_checked=self._checked + self._frame_size,
                                   problem_counts=counts)

    # -- saving and restoring --------------------------------------------------------------

    def to_state(self) -> bytes:
        return orjson.dumps({
            "version": STATE_VERSION,
            "kind": recordkinds.ZSTD_FRAMES,
            "inner": self.inner.to_state().decode(),
            "scanner": self._scanner.to_state(),
            "frame": base64.b64encode(self._frame).decode(),
            "frame_size": self._frame_size,
            "frames": self._frames,
            "checked": self._checked,
            "problems": [p.to_json() for p in self._problems],
            "counts": self._counts,
            "unchecked": self._unchecked,
        })

    @classmethod
    def from_state(cls, blob: bytes, hold: int | None = None) -> FrameChecker:
        state = orjson.loads(blob)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION \
                or state.get("kind") != recordkinds.ZSTD_FRAMES:
            raise ValueError("not a saved FrameChecker state of this version")
        c = cls(hold)
        c.inner = LogChecker.from_state(state["inner"].encode())
        c._scanner = FrameScanner.from_state(state["scanner"])
        c._frame = bytearray(base64.b64decode(state["frame"]))
        c._frame_size = state["frame_size"]
        if c.hold is not None and len(c._frame) > c.hold:
            c._frame = bytearray()
        c._frames, c._checked = state["frames"], state["checked"]
        c._problems = [_problem(p) for p in state["problems"]]
        c._counts = state["counts"]
        c._unchecked = [(u[0], u[1], u[2]) for u in state["unchecked"]]
        return c


def _problem(p: dict[str, Any]) -> Problem:
    return Problem(kind=ProblemKind(p["kind"]), line=p["line"], offset=p["offset"],
                   message=p["message"], detail=p.get("detail"))


Checker = LogChecker | FrameChecker


def checker_for(records: str, hold: int | None = None) -> Checker:
    """The log checker for a file whose records are `records` (core/recordkinds.py)."""
    return FrameChecker(hold) if records == recordkinds.ZSTD_FRAMES else LogChecker(hold)


def checker_from_state(records: str, blob: bytes, hold: int | None = None) -> Checker:
    if records == recordkinds.ZSTD_FRAMES:
        return FrameChecker.from_state(blob, hold)
    return LogChecker.from_state(blob, hold)
