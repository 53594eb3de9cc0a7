"""Log output for `syncd run`: plain text for people and journald, or one JSON object a line.

- text: `2026-11-30 06:53:02,118 INFO syncd.link: connected ...` on a terminal. Under journald
  (stderr is the stream named by $JOURNAL_STREAM) the timestamp is left out, since the journal
  stamps every line itself, and each line starts with its syslog priority (`<4>`), so that
  `journalctl -p warning` and the colours work.
- json: `{"ts": "...Z", "level": "info", "logger": "syncd.link", "msg": "...", ...}`, with any
  `extra={...}` fields of the call and the traceback as `exc`, for log shippers. Lines about
  one file carry `key` and `file`, and lines about an event from a peer carry `peer`: they are
  set per task in the context variables below (a replica's task inherits FIELDS from where it
  was started and sets PEER while it handles a peer's event), so no call has to pass them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import IO, Any

import orjson

FORMATS = ("text", "json")

FIELDS: ContextVar[Mapping[str, str] | None] = ContextVar("syncd_log_fields", default=None)
PEER: ContextVar[str | None] = ContextVar("syncd_log_peer", default=None)

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}


def under_journald(stream: IO[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `stream` is connected to the journal (not merely a child of a service)."""
    value = environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


class JournalFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        level = _PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return f"<{level}>{super().format(record)}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in doc and value is not None:
                doc[name] = value
        # Formatted in the thread and context of the logging call: the task's own fields.
        for name, value in (FIELDS.get() or {}).items():
            doc.setdefault(name, value)
        peer = PEER.get()
        if peer:
            doc.setdefault("peer", peer)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = record.stack_info
        return orjson.dumps(doc, default=repr).decode()


def formatter(fmt: str, stream: IO[str], environ: Mapping[str, str] = os.environ
              ) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if under_journald(stream, environ):
        return JournalFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def setup(level: str, fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Send every log record at `level` or above to `stream` (stderr) in format `fmt`."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(fmt, out))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
