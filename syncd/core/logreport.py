"""What the log checker (core/logcheck.py) reports: the problems found, by kind, and a Report
of one file (counts, problems, and the information that is not a problem: a turn in progress,
its pending tool calls, late projections). The JSON of `syncd verify --json` and of the status
is these classes' to_json().
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

PENDING_SHOWN = 3  # pending tool calls named one by one in the notes


class ProblemKind(StrEnum):
    # Declaration order is the report order for problems on the same line.
    INVALID_JSON = "invalid_json"
    NOT_OBJECT = "not_object"
    TURN_WITHOUT_START = "turn_without_start"
    TURN_START_NOT_FIRST = "turn_start_not_first"
    DUPLICATE_TURN_START = "duplicate_turn_start"
    OPEN_TURN = "open_turn"
    ENTRY_AFTER_TURN_END = "entry_after_turn_end"
    UNPAIRED_TOOL_CALL = "unpaired_tool_call"
    MISSING_ANCHOR = "missing_anchor"
    MISSING_IMAGES_RECORD = "missing_images_record"
    MISSING_RESOURCE = "missing_resource"
    # dsh-session files (core/dshcheck.py)
    MISSING_HEADER = "missing_header"
    HEADER_NOT_FIRST = "header_not_first"
    NOT_EVENT = "not_event"
    SEQ_NOT_INCREASING = "seq_not_increasing"
    SEQ_GAP = "seq_gap"
    TURN_NUMBER = "turn_number"
    STEP_NUMBER = "step_number"
    OUTSIDE_TURN = "outside_turn"
    OUTSIDE_STEP = "outside_step"
    OPEN_STEP = "open_step"
    TOOL_RESULT_WITHOUT_CALL = "tool_result_without_call"
    DAMAGED_FRAME = "damaged_frame"  # a `.zstd` log's frame that does not decompress
    TORN_TAIL = "torn_tail"


_KIND_ORDER = {kind: rank for rank, kind in enumerate(ProblemKind)}


def listing_order(p: Problem) -> tuple[int, int, str]:
    """Where a problem is listed: by line, then by kind (ProblemKind's order), then message."""
    return (p.line, _KIND_ORDER[p.kind], p.message)


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    line: int  # 1-based, like awk NR
    offset: int  # byte offset of the line's first byte
    message: str
    detail: str | None = None  # the parser's own words; they vary between orjson versions
    turn_id: str | None = None
    tool_call_id: str | None = None
    anchor: str | None = None
    reference: str | None = None  # missing_resource: the artifact:// or asset:// reference

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": str(self.kind),
            "line": self.line,
            "offset": self.offset,
            "message": self.message,
        }
        for name in ("detail", "turn_id", "tool_call_id", "anchor", "reference"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass(frozen=True)
class TurnInProgress:
    """The last turn started and not ended yet: a live log's normal state, not a problem."""

    turn_id: str
    line: int  # of its turn.start
    offset: int
    timestamp: int | float | None  # the turn.start entry's timestamp (ms since the epoch)

    def to_json(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "line": self.line, "offset": self.offset,
                "timestamp": self.timestamp}


@dataclass(frozen=True)
class PendingCall:
    """A tool call of the turn in progress still waiting for its result: information."""

    tool_call_id: str
    tool: str | None
    turn_id: str
    line: int  # of the assistant message
    offset: int

    def to_json(self) -> dict[str, Any]:
        return {"tool_call_id": self.tool_call_id, "tool": self.tool, "turn_id": self.turn_id,
                "line": self.line, "offset": self.offset}


@dataclass(frozen=True)
class Report:
    bytes_checked: int  # every byte fed, the torn tail included
    lines: int  # complete (newline-terminated) lines
    blank_lines: int
    entries: int  # lines that are JSON objects
    problems: tuple[Problem, ...]  # listing_order; at most logcheck.MAX_LISTED a kind
    problem_counts: Mapping[str, int]  # exact, by kind, only kinds that occur
    turn_events: Mapping[str, int]  # the four persisted turn events, all four keys
    entry_types: Mapping[str, int]  # `jq -r .type | sort | uniq -c`
    message_types: Mapping[str, int]  # `select(.type=="message") | .data.type // .data.role`
    # Information, not problems (logcheck.py's header): entries after their turn's end that the seed
    # allows, by type, and the turn in progress at the tail.
    late_projections: Mapping[str, int] = dataclasses.field(default_factory=dict)
    turn_in_progress: TurnInProgress | None = None
    pending_tool_calls: tuple[PendingCall, ...] = ()  # of the turn in progress, by line
    extra_notes: tuple[str, ...] = ()
    # A dsh-session file (core/dshcheck.py): its events, turns, steps and tool calls.
    dsh: Mapping[str, int] | None = None

    @property
    def clean(self) -> bool:
        return not self.problem_counts

    @property
    def notes(self) -> list[str]:
        """The information above in words (status and verify print these)."""
        out = []
        if self.turn_in_progress is not None:
            t = self.turn_in_progress
            out.append(f"turn {t.turn_id} in progress since line {t.line}"
                       + (f" ({_ms_text(t.timestamp)})" if t.timestamp is not None else ""))
        pending = self.pending_tool_calls
        if len(pending) > PENDING_SHOWN:
            lines = ", ".join(str(p.line) for p in pending[:PENDING_SHOWN])
            out.append(f"{len(pending)} tool calls of the turn in progress wait for their "
                       f"results (lines {lines} ...)")
        else:
            for p in pending:
                tool = f" ({p.tool})" if p.tool is not None else ""
                out.append(f"tool call {p.tool_call_id}{tool} at line {p.line} waits for its "
                           "result (its turn is in progress)")
        for kind, count in self.late_projections.items():
            out.append(f"late {kind} entries: {count} (written after their turn ended, "
                       "as the seed allows)")
        out.extend(self.extra_notes)
        return out

    @property
    def problem_total(self) -> int:
        return sum(self.problem_counts.values())

    @property
    def unlisted(self) -> int:
        return self.problem_total - len(self.problems)

    def to_json(self) -> dict[str, Any]:
        out = {
            "clean": self.clean,
            "bytes": self.bytes_checked,
            "lines": self.lines,
            "blank_lines": self.blank_lines,
            "entries": self.entries,
            "problem_total": self.problem_total,
            "problem_counts": dict(self.problem_counts),
            "problems": [problem.to_json() for problem in self.problems],
            "turn_events": dict(self.turn_events),
            "entry_types": dict(self.entry_types),
            "message_types": dict(self.message_types),
            "late_projections": dict(self.late_projections),
            "turn_in_progress": (self.turn_in_progress.to_json()
                                 if self.turn_in_progress is not None else None),
            "pending_tool_calls": [p.to_json() for p in self.pending_tool_calls],
            "notes": self.notes,
        }
        if self.dsh is not None:  # a dsh-session file only: Ishiki reports stay as they were
            out["dsh"] = dict(self.dsh)
        return out


def _ms_text(ms: int | float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))
    except (OverflowError, OSError, ValueError):
        return str(ms)
