"""What one record of a replicated file is: a line, or a whole Zstandard frame.

A file is a sequence of records, and only whole records travel: an unfinished one at the tail
is never shipped, a standby only ever holds whole records (except the first pieces of a
single record longer than `chunk_bytes`, which travels in pieces), the log checks and READY
speak of whole records. Which kind a file holds is chosen by its name (`[records]`, first
matching pattern; `*.zstd` is frames by default) or for a whole key (`[keys."k"] records`).

- "lines": a record ends at b"\\n" (JSONL, Ishiki's events.jsonl, dsh's session.jsonl).
- "zstd-frames": a record is one Zstandard frame or skippable frame (dsh's
  session.jsonl.zstd: a header frame, then one frame per batch); zstdframes.py finds where
  each ends from its headers.

Pure: callers hand bytes over.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from syncd.core import zstdframes

LINES = "lines"
ZSTD_FRAMES = "zstd-frames"
KINDS = (LINES, ZSTD_FRAMES)
# The built-in default, after the patterns the configuration gives.
DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (("*.zstd", ZSTD_FRAMES),)


def kind_for(file: str, patterns: tuple[tuple[str, str], ...] = ()) -> str:
    """The record kind of a file named `file`: the first pattern that matches, then the
    built-in `*.zstd` → frames, else lines."""
    for pattern, kind in (*patterns, *DEFAULT_PATTERNS):
        if fnmatch.fnmatchcase(file, pattern):
            return kind
    return LINES


def last_end(kind: str, buf: bytes, start: int = 0, record_start: int | None = None) -> int:
    """End of the last whole record in buf[start:], or `start` when none ends there. For
    frames `start` must be where a frame starts (bytes that are no frame end nothing), or
    `record_start` must be where the frame that `start` falls inside began."""
    if kind == ZSTD_FRAMES:
        return frame_end_past(start, record_start,
                              lambda at: zstdframes.last_end(buf, at)[0])
    cut = buf.rfind(b"\n", start)
    return cut + 1 if cut >= 0 else start


def frame_end_past(start: int, record_start: int | None, walk: Callable[[int], int]) -> int:
    """The frames' last_end past `start`, where `walk(at)` walks frames from `at`. Nothing
    found from `start` and a frame under way that began before it (shipped in pieces, being
    longer than a read): walked from that frame's start instead, its end if past `start`."""
    end = walk(start)
    if end == start and record_start is not None and record_start < start:
        longer = walk(record_start)
        if longer > start:
            return longer
    return end


def piece_end(kind: str, buf: bytes, start: int, end: int, max_len: int) -> int:
    """Where the data item that starts at buf[start] should stop (exclusive, <= end).

    Items end at a record end whenever one fits, so a receiver's copy only ever holds whole
    records; a single record longer than max_len has to travel in pieces (and so does
    everything after a piece: frames are found from a frame's start only)."""
    stop = min(end, start + max_len)
    if stop == end:
        return end
    if kind == ZSTD_FRAMES:
        cut = zstdframes.last_end(memoryview(buf)[:stop], start)[0]
        return cut if cut > start else stop
    at = buf.rfind(b"\n", start, stop)
    return at + 1 if at >= 0 else stop
