"""The log checks of a DeepSeek Harness session (dsh-session): the library's own invariants.

A dsh session file (`session.jsonl`, or the lines inside `session.jsonl.zstd`'s frames) is a
header record `{"type": "session", "version", "id", "createdAt", ...}`, then one record per
event `{"seq", "type", "time", "data", ...}`, where a run of stream deltas may be packed into
one storage row (`text-chunks`, `reasoning-chunks`, `tool-call-chunks`: `seq0`, and one member
per entry of `data.texts` / `data.args`). LogChecker (core/logcheck.py) hands every entry of a
file whose first entry looks like this to DshTrace instead of its Ishiki checks: selected by
what the file contains, never by configuration.

The rules are those @deepseek-ai/dsh-session (0.1.1) enforces itself, in its invariant
companion (`lib/invariant.js`) and its `seq = log.length` contract:
- the header is the first record and the only one (missing_header, header_not_first);
- every other record is an event: an integer `seq` and a string `type` (not_event);
- seq starts at 0 and grows by exactly one (seq_not_increasing, seq_gap);
- turn/start opens turn N+1 with no turn open; turn/end closes the open turn with no step
  open (turn_number, open_turn, open_step, outside_turn);
- step/start opens step S+1 of the open turn, step 1 first; step/end closes it
  (step_number, open_step, outside_turn);
- assistant/chunk, assistant/message, tool/call and an appended tool/result name the open
  turn and step (outside_step); a tool/result answers a tool/call of this step, unless it is
  the library's synthetic TOOL_NOT_STARTED result (tool_result_without_call);
- request/header, request/context, todo/write belong to an open turn (outside_turn).
Event types it does not know (plugins merge their own) are counted and not checked.

What a live writer passes through at a record boundary is not damage: a turn in progress, a
step under way, a tool call whose result is not written yet. These are notes. (The library
clears a step's unanswered calls at step/end and its crash repair closes them with synthetic
results, so a call without a result is never a problem by itself.)

Pure: entries in (already parsed), problems and counts out. Problems are (kind, line, offset,
message) tuples that logcheck.py turns into its Problem.
"""

from __future__ import annotations

from typing import Any

HEADER_TYPE = "session"
CHUNK_ROWS = frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"})
IN_STEP = frozenset({"assistant/chunk", "assistant/message", "tool/call"})
IN_TURN = frozenset({"request/header", "request/context", "todo/write"})
KNOWN = frozenset({"turn/start", "turn/end", "step/start", "step/end", "user/message",
                   "tool/result", "session/end-seed", *IN_STEP, *IN_TURN})
TOOL_NOT_STARTED = "TOOL_NOT_STARTED"
MAX_PENDING = 10_000  # tool calls of one step remembered (a peer controls the file)
MAX_ID = 200  # characters of a call id or tool name kept (in notes, messages, saved state)

DshProblem = tuple[str, int, int, str]  # kind, line, offset, message


def is_header(entry: dict[str, Any]) -> bool:
    return entry.get("type") == HEADER_TYPE and "id" in entry and "version" in entry


def looks_dsh(entry: dict[str, Any]) -> bool:
    """Whether a file whose first entry is `entry` is a dsh session."""
    kind = entry.get("type")
    if is_header(entry):
        return True
    if type(kind) is not str:
        return False
    if kind in CHUNK_ROWS:
        return type(entry.get("seq0")) is int
    return type(entry.get("seq")) is int and "/" in kind


def _n(value: int | None) -> str:
    return "none" if value is None else str(value)


def _short(value: Any) -> str | None:
    return value[:MAX_ID] if type(value) is str else None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


class DshTrace:
    def __init__(self) -> None:
        self.records = 0
        self.header_line: int | None = None
        self.last_seq = -1
        self.open_turn: int | None = None
        self.open_step: int | None = None
        self.next_turn = 1
        self.next_step = 1
        self.turn_at: list[int] = [0, 0]  # line, offset of the open turn's turn/start
        self.step_at: list[int] = [0, 0]
        self.pending: dict[str, list[Any]] = {}  # callId -> [line, offset, name]
        self.counts = {"events": 0, "turns_started": 0, "turns_ended": 0, "steps": 0,
                       "tool_calls": 0, "tool_results": 0}

    # -- one record --------------------------------------------------------------------------

    def entry(self, entry: dict[str, Any], line: int, offset: int) -> list[DshProblem]:
        out: list[DshProblem] = []
        self.records += 1
        if is_header(entry):
            if self.records != 1:
                out.append(("header_not_first", line, offset,
                            f"a session header at record {self.records}"
                            + (f" (the header is line {self.header_line})"
                               if self.header_line else " (it must be the first record)")))
            else:
                self.header_line = line
            return out
        if self.records == 1:
            out.append(("missing_header", line, offset,
                        "the first record is not a session header "
                        '({"type": "session", "version", "id", ...})'))
        kind = entry.get("type")
        if kind in CHUNK_ROWS:
            seq0 = _int(entry.get("seq0"))
            data = entry.get("data")
            members = None
            if type(data) is dict:
                members = data.get("args" if kind == "tool-call-chunks" else "texts")
            if seq0 is None or type(members) is not list or not members:
                out.append(("not_event", line, offset,
                            f"a {kind} row without seq0 or members"))
                return out
            out += self._seq(seq0, line, offset)
            self.last_seq = seq0 + len(members) - 1
            self.counts["events"] += len(members)
            out += self._event("assistant/chunk", data if type(data) is dict else {}, entry,
                               line, offset)
            return out
        seq = _int(entry.get("seq"))
        if seq is None or type(kind) is not str:
            out.append(("not_event", line, offset,
                        "not a session event (an integer seq and a string type)"))
            return out
        out += self._seq(seq, line, offset)
        self.last_seq = max(self.last_seq, seq)
        self.counts["events"] += 1
        data = entry.get("data")
        out += self._event(kind, data if type(data) is dict else {}, entry, line, offset)
        return out

    def _seq(self, seq: int, line: int, offset: int) -> list[DshProblem]:
        if seq <= self.last_seq:
            return [("seq_not_increasing", line, offset,
                     f"seq {seq} after seq {self.last_seq}")]
        if seq != self.last_seq + 1:
            return [("seq_gap", line, offset,
                     f"seq {seq} after seq {self.last_seq}: "
                     f"{seq - self.last_seq - 1} events missing")]
        return []

    def _event(self, kind: str, data: dict[str, Any], entry: dict[str, Any], line: int,
               offset: int) -> list[DshProblem]:
        turn, step = _int(data.get("turn")), _int(data.get("step"))
        out: list[DshProblem] = []
        if kind == "turn/start":
            self.counts["turns_started"] += 1
            if self.open_turn is not None:
                out.append(("open_turn", self.turn_at[0], self.turn_at[1],
                            f"turn {self.open_turn} started but never ended (turn/start "
                            f"{turn} at line {line})"))
            if turn != self.next_turn:
                out.append(("turn_number", line, offset,
                            f"turn/start {turn}, expected turn {self.next_turn}"))
            self.open_turn, self.open_step = turn, None
            self.next_turn = (turn if turn is not None else self.next_turn) + 1
            self.next_step = 1
            self.turn_at = [line, offset]
            self.pending.clear()
        elif kind == "turn/end":
            self.counts["turns_ended"] += 1
            if self.open_turn is None:
                out.append(("outside_turn", line, offset, f"turn/end {turn} with no turn open"))
            elif turn != self.open_turn:
                out.append(("turn_number", line, offset,
                            f"turn/end {turn} while turn {self.open_turn} is open"))
            if self.open_step is not None:
                out.append(("open_step", line, offset,
                            f"turn/end {turn} while step {self.open_step} is still open"))
            self.open_turn = self.open_step = None
            self.pending.clear()
        elif kind == "step/start":
            self.counts["steps"] += 1
            if self.open_turn is None or turn != self.open_turn:
                out.append(("outside_turn", line, offset,
                            f"step/start in turn {turn}, but the open turn is "
                            f"{_n(self.open_turn)}"))
            if self.open_step is not None:
                out.append(("open_step", line, offset,
                            f"step/start {step} while step {self.open_step} is still open"))
            if step != self.next_step:
                out.append(("step_number", line, offset,
                            f"step/start {step}, expected step {self.next_step}"))
            self.open_step = step
            self.next_step = (step if step is not None else self.next_step) + 1
            self.step_at = [line, offset]
            self.pending.clear()
        elif kind == "step/end":
            if self.open_step is None or turn != self.open_turn or step != self.open_step:
                out.append(("step_number", line, offset,
                            f"step/end of turn {turn} step {step}, but open is turn "
                            f"{_n(self.open_turn)} step {_n(self.open_step)}"))
            self.open_step = None
            self.pending.clear()
        elif kind in IN_STEP or (kind == "tool/result" and entry.get("surfaceOp") == "append"):
            if self.open_step is None or turn != self.open_turn or step != self.open_step:
                out.append(("outside_step", line, offset,
                            f"{kind} names turn {turn} step {step}, but open is turn "
                            f"{_n(self.open_turn)} step {_n(self.open_step)}"))
            if kind == "tool/call":
                self.counts["tool_calls"] += 1
                call_id = _short(data.get("callId"))
                if call_id is not None and len(self.pending) < MAX_PENDING:
                    self.pending[call_id] = [line, offset, _short(data.get("name"))]
            elif kind == "tool/result":
                self.counts["tool_results"] += 1
                out += self._result(data, line, offset)
        elif kind == "tool/result":  # a surface replacement (compaction), not an answer
            if self.open_turn is None:
                out.append(("outside_turn", line, offset,
                            "tool/result replacement with no turn open"))
        elif kind in IN_TURN and self.open_turn is None:
            out.append(("outside_turn", line, offset, f"{kind} with no turn open"))
        return out

    def _result(self, data: dict[str, Any], line: int, offset: int) -> list[DshProblem]:
        message = data.get("message")
        source = message.get("source") if type(message) is dict else None
        call_id = _short(source.get("callId")) if type(source) is dict else None
        if call_id is not None and self.pending.pop(call_id, None) is not None:
            return []
        error = data.get("error")
        if type(error) is dict and error.get("code") == TOOL_NOT_STARTED:
            return []  # the library's own closer for a call it never recorded
        return [("tool_result_without_call", line, offset,
                 f"tool/result for {call_id} with no tool/call before it in this step")]

    # -- reporting ---------------------------------------------------------------------------

    def notes(self) -> list[str]:
        """A live writer's state at the tail, in words: information, never problems."""
        out = []
        if self.open_turn is not None:
            out.append(f"dsh turn {self.open_turn} in progress since line {self.turn_at[0]}")
        if self.open_step is not None:
            out.append(f"dsh step {self.open_step} of turn {self.open_turn} under way since "
                       f"line {self.step_at[0]}")
        for call_id, (line, _offset, name) in list(self.pending.items())[:3]:
            tool = f" ({name})" if name else ""
            out.append(f"tool call {call_id}{tool} at line {line} waits for its result "
                       "(its step is under way)")
        if len(self.pending) > 3:
            out.append(f"{len(self.pending)} tool calls of the step under way wait in all")
        return out

    def summary(self) -> dict[str, int]:
        return {**self.counts, "pending_tool_calls": len(self.pending),
                "open_turn": self.open_turn or 0, "open_step": self.open_step or 0}

    # -- saving and restoring ----------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"records": self.records, "header_line": self.header_line,
                "last_seq": self.last_seq, "open_turn": self.open_turn,
                "open_step": self.open_step, "next_turn": self.next_turn,
                "next_step": self.next_step, "turn_at": self.turn_at, "step_at": self.step_at,
                "pending": self.pending, "counts": self.counts}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DshTrace:
        t = cls()
        t.records, t.header_line = state["records"], state["header_line"]
        t.last_seq, t.open_turn, t.open_step = (state["last_seq"], state["open_turn"],
                                                state["open_step"])
        t.next_turn, t.next_step = state["next_turn"], state["next_step"]
        t.turn_at, t.step_at = list(state["turn_at"]), list(state["step_at"])
        t.pending = {str(k): list(v) for k, v in state["pending"].items()}
        t.counts = dict(state["counts"])
        return t
