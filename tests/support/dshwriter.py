"""A Python writer of dsh-session logs, as @deepseek-ai/dsh-session-persistence-jsonl writes
them (issue #27): `session.jsonl.zstd` is a header frame, then one checksummed Zstandard
frame per batch; `session.jsonl` the same events as plain lines. Each batch is written and
fsynced; a failed write or sync is rolled back (the file truncated to its previous length);
after a crash, load() truncates the torn tail (from the start of the torn frame or line) and
appends synthetic closing events. Records have the library's shape: a `{"type": "session"}`
header, then events `{"seq", "type", "time", "data"}` numbered from 0 (core/dshcheck.py checks
them by the library's rules; tests/support/dsh/ has the real library)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from syncd.core import recordkinds
from tests.support import zstd


class DshWriter:
    def __init__(self, path: Path, compression: str = "zstd") -> None:
        self.path = path
        self.zstd = compression == "zstd"
        self.seq = -1  # of the last event made
        self.turns = 0
        path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        self.seq += 1
        return {"seq": self.seq, "type": kind, "time": 1_800_000_000_000, "data": data}

    def encode(self, events: list[dict[str, Any]]) -> bytes:
        lines = b"".join(orjson.dumps(e) + b"\n" for e in events)
        return zstd.frame(lines) if self.zstd else lines

    def turn(self, n: int, text: str = "hello") -> list[dict[str, Any]]:
        """A turn's events: turn/start, a step with a tool call and its result, turn/end."""
        self.turns = n
        events = [self.event("turn/start", turn=n),
                  self.event("user/message", role="user", source={"kind": "user"},
                             content=[{"type": "text", "text": f"{text} {n}\n" * 20}]),
                  self.event("step/start", turn=n, step=1),
                  self.event("tool/call", turn=n, step=1, callId=f"c{n}", name="bash",
                             arguments="{}"),
                  self.event("tool/result", turn=n, step=1, message={
                      "role": "user", "source": {"kind": "tool", "callId": f"c{n}"},
                      "content": [{"type": "tool-result", "toolCallId": f"c{n}",
                                   "isError": False,
                                   "content": [{"type": "text",
                                                "text": os.urandom(300).hex()}]}]})]
        events[-1]["surfaceOp"] = "append"
        return [*events, self.event("step/end", turn=n, step=1),
                self.event("turn/end", turn=n, reason={"kind": "completed"})]

    def header(self) -> bytes:
        return self.write_batch([{"type": "session", "version": 0, "id": self.path.parent.name,
                                  "createdAt": 1_800_000_000_000, "delegationDepth": 0}])

    def write_batch(self, events: list[dict[str, Any]]) -> bytes:
        """One batch: one write(2), then fsync. Returns the bytes written."""
        data = self.encode(events)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return data

    def write_torn(self, events: list[dict[str, Any]], keep: int) -> bytes:
        """A batch cut short by a crash: only its first `keep` bytes reach the file."""
        data = self.encode(events)[:keep]
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return data

    def load(self) -> bytes:
        """The library's repair after a crash: cut the torn tail at the last whole record,
        then append synthetic closing events. Returns the file's bytes afterwards."""
        data = self.path.read_bytes()
        kind = recordkinds.ZSTD_FRAMES if self.zstd else recordkinds.LINES
        whole = recordkinds.last_end(kind, data)
        if whole != len(data):
            os.truncate(self.path, whole)
        self.write_batch([self.event("turn/end", turn=self.turns,
                                     reason={"kind": "interrupted"})])
        return self.path.read_bytes()


def start_failing_batch(path: Path, first: bytes) -> tuple[int, int]:
    """The first write(2) of a batch that will fail: returns (fd, previous length)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    before = os.fstat(fd).st_size
    os.write(fd, first)
    return fd, before


def roll_back(fd: int, before: int) -> None:
    """The library's answer to ENOSPC/EIO: the file truncated to its previous length."""
    os.ftruncate(fd, before)
    os.fsync(fd)
    os.close(fd)
