"""The log checker: the operator's checks of events.jsonl (seed, "核对与排查") as a state machine.

Everything the checks need to remember lives in LogChecker, so that the same object serves a
one-off `syncd verify` over a whole file and, later, the daemon feeding appended bytes as they
arrive and saving the checker's state across restarts. No files, no clock, no printing: bytes
in, a Report out. The caller does the reading and decides what to show. The Report and the
kinds of Problem are core/logreport.py.

Theory of operation
-------------------
Bytes are cut into lines at b"\\n"; a line may span any number of feed() calls. Each complete
line is numbered from 1 like `awk NR` and located by the byte offset of its first byte. An empty
line is counted and skipped, as the reference loader skips it (`if (!line) continue`); any other
line must parse with orjson.loads as a JSON object. Bytes after the last newline are a torn tail:
reported, but not checked further, because the next feed() may complete them (and syncd never
ships them, so a standby never holds them either).

How much of an unfinished line is held is the caller's choice (`hold`): `syncd verify` holds
it all; the daemon holds at most HOLD bytes per file, so that a bot's 200 MiB line without its
newline costs neither memory nor a long save (its state then keeps only the line's length).
When such a line ends, feed() stops right after its newline and names it in `unread_line`
(offset, length): the caller reads those bytes back from the file, where they are, and hands
them to resume_with() (the daemon does that in another process: logfollow.py). The rules are
the same for every line, however long.

The checks that need memory keep only per-turn and per-id bookkeeping:
- turns, by turnId: "pre" (entries seen, no turn.start yet), "open" (started), "ended" (a
  terminal event turn.done / turn.failed / turn.aborted seen). turn.start must be the first
  entry of its turn and the terminal event its last, with the exceptions below;
- assistant tool calls waiting for a later result with the same toolCallId;
- the ids of all entries (as 64-bit digests, core/idset.py) and the compacts whose anchor
  (data.lastEntryId) had not been seen when they were read: an anchor may name any entry of
  the file, so a missing one is only known when report() is asked.
Problems found line by line are recorded as they happen (the first MAX_LISTED of each kind,
with exact counts); the others are derived from the bookkeeping by report(), which changes
nothing, so it may be called at any time.

A DeepSeek Harness session (its first entry a `{"type": "session", ...}` header or an event
with a `seq`) is checked by core/dshcheck.py instead, by that library's own invariants; the
counting, the torn tail, the bounds and the saved state here stay the same for it.

The seed's rules, and the exceptions it states itself
-----------------------------------------------------
"turn.start 第一行、终结事件最后一行" (turn.start first, the terminal event last) is a rule
about the entries the runtime writes inside a turn. The seed names what is written outside a
turn's window, and each is checked accordingly (information, never a problem):

1. Late narrative projections. "写入两只手：每步结束后按 turn.step 事件补投影，准备请求时再扫
   一次补漏 ... turnId 沿用来源 assistant 条目的值" (two writers: after each step, and again
   while preparing the next request, the catch-up pass; the turnId is the source assistant
   entry's). So an `ishiki.narrative` entry may follow its turn's terminal event: counted in
   Report.late_projections, not reported as entry_after_turn_end.
2. Compaction entries. "ishiki.chat.shake、ishiki.chat.compact、ishiki.compact 不带 turnId"
   (they carry no turnId), written "准备请求时" (while preparing a request) or "在回合结束时"
   (at the end of a turn, ishiki.compact): they belong to no turn, so no turn rule applies
   to them, wherever they are.
3. Input between turns. "没有进行中的回合时落成不带 turnId 的 message 条目" (with no turn in
   progress a platform message is written without a turnId) and "不带 turnId 的行属于回合之外
   的输入" (lines without a turnId are input outside any turn): no turn rule applies.
4. Not exceptions: `ishiki.images` and `ishiki.codemode.store` carry the turnId and are
   written "同批追加的尾部" (at the tail of the same append) as the turn's assistant message,
   "所以它总是排在那一轮的 assistant 消息之后" (so always after that turn's assistant message),
   i.e. inside the turn, before its terminal event (the seed's timeline shows ishiki.images
   between the assistant message and turn.done). After the terminal event they are still
   entry_after_turn_end.
5. A turn in progress. The runtime writes turn.start when a turn begins and the terminal
   event when it ends, so a live log is mid-turn most of the time: the last turn started,
   not ended, with no turn started after it, is Report.turn_in_progress (information). An
   unfinished turn followed by a later turn.start is damage (open_turn): turns run one at a
   time ("turn.queued" waits), so the earlier one can no longer end.
6. Inside the turn in progress, a step under way. "每个 assistant tool-call 之后应有同
   toolCallId 的 tool 消息" (every assistant tool call is followed by a tool message with the
   same toolCallId) holds for a finished turn. While the tool runs (seconds, often) the
   assistant line is written and its result is not yet: a tool call of the turn in progress
   without a result is Report.pending_tool_calls (information). Once its turn ends, or a
   later turn starts, a missing result is damage (unpaired_tool_call), as before. The other
   entries of a step under way (ishiki.images, ishiki.codemode.store and ishiki.narrative
   after the assistant message, compaction entries before the next request) are checked by
   the rules above, which they pass wherever a step may stop.

One more check the seed motivates, on ishiki.images: "键的格式是 <附件消息的 data.id>:<items
下标>" and "重启后 restore 用这些历史记录重建槽位，已释放的图不会被重新投喂" (restore rebuilds the
image slots from these records; released images are not fed again); "ishiki.images 缺失或被手工
删掉 ... 会重新投喂一遍" (a missing or deleted record re-feeds images). A record can only release
an image a record showed (the same record, for a "once" image, or an earlier one): a release
of an image no record before it shows means the record that showed it is gone
(missing_images_record). A deleted record that showed and released the same images (a "once"
image) leaves no trace in the file: no check can find it.
"""

from __future__ import annotations

import base64
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from syncd.core.dshcheck import DshTrace, looks_dsh
from syncd.core.idset import IdSet, id_digest, pack_ids, unpack_ids
from syncd.core.logreport import (
    PendingCall,
    Problem,
    ProblemKind,
    Report,
    TurnInProgress,
    listing_order,
)
from syncd.core.refs import line_refs

STATE_VERSION = 5  # 5: the dsh-session trace (core/dshcheck.py)

# Enough to act on; a file with more bad lines than this is broken as a whole.
MAX_LISTED = 1000
MAX_REFS = 200_000  # resource references remembered (readiness checks each one)

TURN_START = "turn.start"
TURN_TERMINALS = ("turn.done", "turn.failed", "turn.aborted")
TURN_EVENTS = (TURN_START, *TURN_TERMINALS)
COMPACT_TYPES = frozenset({"ishiki.compact", "ishiki.chat.compact"})
IMAGES_TYPE = "ishiki.images"
# Entries the seed says may be written after their turn's terminal event (see the header).
LATE_PROJECTION_TYPES = frozenset({"ishiki.narrative"})

# The AI SDK's ModelMessage parts ("tool-call", "tool-result") are what @yesimagent/core writes;
# the other spellings are what neighbouring SDKs write, accepted so that a foreign log is not
# flagged wholesale.
TOOL_CALL_PART_TYPES = frozenset(
    {"tool-call", "toolCall", "tool_call", "tool_use", "function_call"}
)
TOOL_RESULT_PART_TYPES = frozenset(
    {"tool-result", "toolResult", "tool_result", "function_call_output"}
)
TOOL_RESULT_ROLES = frozenset({"tool", "toolResult"})
_CALL_ID_KEYS = ("toolCallId", "tool_call_id", "id", "call_id")
_RESULT_ID_KEYS = ("toolCallId", "tool_call_id", "tool_use_id", "call_id")


def _jq_text(value: Any) -> str:
    """How `jq -r` prints a value that is not a string (null, numbers, objects...)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array"


def _first_str(part: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = part.get(key)
        if isinstance(value, str):
            return value
    return None


def _call_name(call: Mapping[str, Any]) -> str | None:
    name = call.get("toolName", call.get("name"))
    if name is None:
        function = call.get("function")  # OpenAI chat: {"function": {"name": ...}}
        if isinstance(function, dict):
            name = function.get("name")
    return name if isinstance(name, str) else None


# (line, offset, tool name, turn id) of an assistant tool call still waiting for its result.
_CallSite = tuple[int, int, str | None, str | None]
# (line, offset, entry type, anchor) of a compact whose anchor was unknown when it was read.
_AnchorSite = tuple[int, int, str, str | None]


class LogChecker:
    """Feed it the bytes of an events.jsonl, from the first byte on; ask for a report any time.

    `hold`: bytes of an unfinished line kept at most (None: all of it); see the header."""

    def __init__(self, hold: int | None = None) -> None:
        self.hold = hold
        self._offset = 0  # where the line being assembled starts
        self._lines = 0
        self._pending = bytearray()  # bytes of that line so far (all of them, or none: see hold)
        self._pending_size = 0  # how many bytes that line has so far
        # (offset, length) of a line that ended but was longer than `hold`: resume_with()
        self.unread_line: tuple[int, int] | None = None
        self._blank_lines = 0
        self._entries = 0
        self._entry_types: dict[str, int] = {}
        self._message_types: dict[str, int] = {}
        self._turn_events: dict[str, int] = dict.fromkeys(TURN_EVENTS, 0)
        # turn id -> (line, offset) of its first entry, while it has no turn.start
        self._pre_turns: dict[str, tuple[int, int]] = {}
        # turn id -> (line, offset) of its turn.start, until its terminal event
        self._open_turns: dict[str, tuple[int, int]] = {}
        # turn id -> line of its terminal event
        self._ended_turns: dict[str, int] = {}
        # turn id -> [first late line, its offset, how many late lines]
        self._late_turns: dict[str, list[int]] = {}
        # entry type -> late entries the seed allows (LATE_PROJECTION_TYPES)
        self._late_projections: dict[str, int] = {}
        # [turn id, timestamp of its turn.start] of the turn started last
        self._last_start: list[Any] | None = None
        self._tool_calls: dict[str, list[_CallSite]] = {}
        self._entry_ids = IdSet()
        self._shown_images = IdSet()  # keys any ishiki.images record showed (as digests)
        self._anchors: list[_AnchorSite] = []
        self._recorded: list[Problem] = []
        self._recorded_counts: dict[str, int] = {}
        # resource reference (refs.py) -> [line, offset] where it first appears
        self._refs: dict[str, list[int]] = {}
        self._dsh: DshTrace | None = None  # a dsh-session file: its checks instead of these

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> int:
        """Check `data`; how many of its bytes were taken: all of them, except when a line that
        was not held ends in `data` (then up to its newline, and `unread_line` names it)."""
        if self.unread_line is not None:
            raise ValueError("a line that was not held must be checked first (resume_with)")
        end = data.find(b"\n")
        if end < 0:
            # No line ends here: collect without re-splitting what we already hold, so a huge
            # line arriving in small pieces stays linear.
            self._hold_more(data)
            return len(data)
        if self._held() < self._pending_size + end:
            self.unread_line = (self._offset, self._pending_size + end)
            self._pending, self._pending_size = bytearray(), 0
            return end + 1
        lines = data.split(b"\n")
        if self._pending:
            lines[0] = bytes(self._pending) + lines[0]
        tail = lines.pop()
        self._pending, self._pending_size = bytearray(), 0
        self._check_lines(lines)
        self._hold_more(tail)
        return len(data)

    def resume_with(self, line: bytes) -> None:
        """The bytes of `unread_line` (without its newline), read back by the caller."""
        if self.unread_line is None or len(line) != self.unread_line[1]:
            raise ValueError(f"not the line waited for ({self.unread_line}, got {len(line)} "
                             "bytes)")
        self.unread_line = None
        self._check_lines([line])

    def _held(self) -> int:
        """How long a line may grow and still be checked here: unbounded, `hold`, or -1
        once the line being assembled has outgrown it (its bytes are gone)."""
        if len(self._pending) != self._pending_size:
            return -1
        return sys.maxsize if self.hold is None else self.hold

    def _hold_more(self, data: bytes) -> None:
        if not data:
            return
        keep = self._held() >= self._pending_size + len(data)
        self._pending_size += len(data)
        if keep:
            self._pending += data
        elif self._pending:
            self._pending = bytearray()  # outgrown: only its length is kept from now on

    def _check_lines(self, lines: list[bytes]) -> None:
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        offset = self._offset
        number = self._lines
        for raw in lines:
            number += 1
            if not raw:
                self._blank_lines += 1
                offset += 1
                continue
            try:
                entry = loads(raw)
            except decode_error as error:
                self._record(
                    Problem(ProblemKind.INVALID_JSON, number, offset, "not valid JSON", error.msg)
                )
            else:
                if type(entry) is dict:
                    self._check_entry(entry, number, offset)
                    if b"://" in raw:
                        for ref in line_refs(raw, entry):
                            if ref not in self._refs and len(self._refs) < MAX_REFS:
                                self._refs[ref] = [number, offset]
                else:
                    kind = _json_kind(entry)
                    self._record(
                        Problem(
                            ProblemKind.NOT_OBJECT,
                            number,
                            offset,
                            f"valid JSON but not an object ({kind})",
                        )
                    )
            offset += len(raw) + 1
        self._offset = offset
        self._lines = number

    def _record(self, problem: Problem) -> None:
        kind = problem.kind.value  # plain str keys: they go through orjson in to_state()
        count = self._recorded_counts.get(kind, 0) + 1
        self._recorded_counts[kind] = count
        if count <= MAX_LISTED:
            self._recorded.append(problem)

    # -- one entry -------------------------------------------------------------------------

    def _check_entry(self, entry: dict[str, Any], line: int, offset: int) -> None:
        if self._entries == 0 and looks_dsh(entry):
            self._dsh = DshTrace()  # chosen by what the file holds (see core/dshcheck.py)
        self._entries += 1
        entry_type = entry.get("type")
        if type(entry_type) is not str:
            entry_type = _jq_text(entry_type)
        counts = self._entry_types
        counts[entry_type] = counts.get(entry_type, 0) + 1
        if self._dsh is not None:
            for kind, at, off, message in self._dsh.entry(entry, line, offset):
                self._record(Problem(ProblemKind(kind), at, off, message))
            return

        entry_id = entry.get("id")
        if type(entry_id) is str:
            self._entry_ids.add(id_digest(entry_id))

        data = entry.get("data")
        turn_id = entry.get("turnId")
        event_type = None
        if entry_type == "message":
            self._check_message(data, turn_id, line, offset)
        elif entry_type == "event":
            if type(data) is dict:
                event_type = data.get("type")
                if type(event_type) is not str:
                    event_type = None  # JSON can put a list here, and a list cannot be looked up
                elif event_type in self._turn_events:
                    self._turn_events[event_type] += 1
                if turn_id is None:
                    turn_id = data.get("turnId")  # the event itself names its turn too
        elif entry_type in COMPACT_TYPES:
            anchor = data.get("lastEntryId") if type(data) is dict else None
            if type(anchor) is not str or id_digest(anchor) not in self._entry_ids:
                self._anchors.append(
                    (line, offset, entry_type, anchor if type(anchor) is str else None)
                )
        elif entry_type == IMAGES_TYPE and type(data) is dict:
            self._check_images(data, line, offset)

        if type(turn_id) is str:
            self._track_turn(turn_id, event_type, entry_type, line, offset)
            if event_type == TURN_START:
                stamp = entry.get("timestamp")
                self._last_start = [turn_id, stamp if type(stamp) in (int, float) else None]

    def _check_images(self, data: dict[str, Any], line: int, offset: int) -> None:
        shown, released = data.get("shown"), data.get("released")
        if type(shown) is list:
            for key in shown:
                if type(key) is str:
                    self._shown_images.add(id_digest(key))
        if type(released) is not list:
            return
        unshown = [key for key in released
                   if type(key) is str and id_digest(key) not in self._shown_images]
        if unshown:
            more = f" (and {len(unshown) - 1} more)" if len(unshown) > 1 else ""
            self._record(Problem(
                ProblemKind.MISSING_IMAGES_RECORD, line, offset,
                f'ishiki.images releases image "{unshown[0]}"{more}, which no ishiki.images '
                "record before it shows: the record that showed it is missing (a restart "
                "would feed it to the model again)"))

    def _track_turn(self, turn_id: str, event_type: Any, entry_type: str, line: int,
                    offset: int) -> None:
        is_start = event_type == TURN_START
        is_terminal = event_type in TURN_TERMINALS
        if turn_id in self._open_turns:
            if is_terminal:
                del self._open_turns[turn_id]
                self._ended_turns[turn_id] = line
            elif is_start:
                self._record(
                    Problem(
                        ProblemKind.DUPLICATE_TURN_START,
                        line,
                        offset,
                        f"turn {turn_id} started again "
                        f"(first turn.start at line {self._open_turns[turn_id][0]})",
                        turn_id=turn_id,
                    )
                )
            return
        ended_at = self._ended_turns.get(turn_id)
        if ended_at is not None:
            if entry_type in LATE_PROJECTION_TYPES:
                # The seed's catch-up pass (see the header): information, not damage.
                counts = self._late_projections
                counts[entry_type] = counts.get(entry_type, 0) + 1
                return
            late = self._late_turns.get(turn_id)
            if late is None:
                self._late_turns[turn_id] = [line, offset, 1]
            else:
                late[2] += 1
            return
        first = self._pre_turns.get(turn_id)
        if is_start:
            if first is not None:
                del self._pre_turns[turn_id]
                self._record(
                    Problem(
                        ProblemKind.TURN_START_NOT_FIRST,
                        line,
                        offset,
                        f"turn.start of turn {turn_id} comes after entries of that turn "
                        f"(the first at line {first[0]})",
                        turn_id=turn_id,
                    )
                )
            self._open_turns[turn_id] = (line, offset)
        elif is_terminal:
            self._ended_turns[turn_id] = line
            if first is None:
                where = (line, offset)
                message = f"turn {turn_id} ended ({event_type}) but never started"
            else:
                del self._pre_turns[turn_id]
                where = first
                message = f"turn {turn_id} never started (it ended at line {line}, {event_type})"
            self._record(Problem(ProblemKind.TURN_WITHOUT_START, *where, message, turn_id=turn_id))
        elif first is None:
            self._pre_turns[turn_id] = (line, offset)

    def _check_message(self, message: Any, turn_id: Any, line: int, offset: int) -> None:
        key: Any = "null"
        role: Any = None
        if type(message) is dict:
            role = message.get("role")
            custom_type = message.get("type")
            # jq's `.data.type // .data.role`: null and false fall through to the role.
            key = custom_type if custom_type is not None and custom_type is not False else role
            if type(key) is not str:
                key = _jq_text(key)
        counts = self._message_types
        counts[key] = counts.get(key, 0) + 1
        if role == "assistant":
            self._scan_assistant(message, turn_id if type(turn_id) is str else None, line, offset)
        elif type(role) is str and role in TOOL_RESULT_ROLES:
            self._scan_tool_results(message)

    def _scan_assistant(
        self, message: dict[str, Any], turn_id: str | None, line: int, offset: int
    ) -> None:
        content = message.get("content")
        if type(content) is list:
            for part in content:
                if type(part) is not dict:
                    continue
                part_type = part.get("type")
                if type(part_type) is not str:
                    continue
                if part_type in TOOL_CALL_PART_TYPES:
                    self._open_call(part, turn_id, line, offset)
                elif part_type in TOOL_RESULT_PART_TYPES:
                    # A provider-executed tool answers inside the assistant message itself.
                    self._close_call(_first_str(part, _RESULT_ID_KEYS))
        for key in ("toolCalls", "tool_calls"):
            calls = message.get(key)
            if type(calls) is list:
                for call in calls:
                    if type(call) is dict:
                        self._open_call(call, turn_id, line, offset)

    def _scan_tool_results(self, message: dict[str, Any]) -> None:
        # A tool message answers by a toolCallId on the message (pi / OpenAI shapes) or on
        # each content part (AI SDK: [{"type": "tool-result", "toolCallId": ...}]).
        self._close_call(_first_str(message, _RESULT_ID_KEYS))
        content = message.get("content")
        if type(content) is list:
            for part in content:
                if type(part) is dict:
                    self._close_call(_first_str(part, _RESULT_ID_KEYS))

    def _open_call(self, call: dict[str, Any], turn_id: str | None, line: int, offset: int) -> None:
        call_id = _first_str(call, _CALL_ID_KEYS)
        if call_id is None:
            return
        site: _CallSite = (line, offset, _call_name(call), turn_id)
        waiting = self._tool_calls.get(call_id)
        if waiting is None:
            self._tool_calls[call_id] = [site]
        else:
            waiting.append(site)  # some providers reuse ids ("call_0"): answer them in order

    def _close_call(self, call_id: str | None) -> None:
        if call_id is None:
            return
        waiting = self._tool_calls.get(call_id)
        if waiting:
            waiting.pop(0)
            if not waiting:
                del self._tool_calls[call_id]

    def references(self) -> dict[str, tuple[int, int]]:
        """Every resource reference read so far (artifact://, asset://), in the order of
        first appearance, with the line number and offset of that appearance."""
        return {ref: (at[0], at[1]) for ref, at in self._refs.items()}

    # -- reporting -------------------------------------------------------------------------

    def report(self) -> Report:
        derived: list[Problem] = []
        for turn_id, (line, offset) in self._pre_turns.items():
            derived.append(
                Problem(
                    ProblemKind.TURN_WITHOUT_START,
                    line,
                    offset,
                    f"turn {turn_id} has entries but no turn.start",
                    turn_id=turn_id,
                )
            )
        in_progress = None
        last = self._last_start
        for turn_id, (line, offset) in self._open_turns.items():
            if last is not None and last[0] == turn_id:
                # Nothing started after it: the turn the writer is in now.
                in_progress = TurnInProgress(turn_id, line, offset, last[1])
                continue
            derived.append(
                Problem(
                    ProblemKind.OPEN_TURN,
                    line,
                    offset,
                    f"turn {turn_id} started but never ended "
                    f"(turn {last[0] if last else '?'} started after it)",
                    turn_id=turn_id,
                )
            )
        for turn_id, (line, offset, count) in self._late_turns.items():
            more = f" ({count} lines in all)" if count > 1 else ""
            derived.append(
                Problem(
                    ProblemKind.ENTRY_AFTER_TURN_END,
                    line,
                    offset,
                    f"turn {turn_id} ended at line {self._ended_turns[turn_id]}, "
                    f"but this line still belongs to it{more}",
                    turn_id=turn_id,
                )
            )
        pending: list[PendingCall] = []
        for call_id, sites in self._tool_calls.items():
            for line, offset, name, call_turn in sites:
                if in_progress is not None and call_turn == in_progress.turn_id:
                    # A step under way: its tool is still running (see the header, 6).
                    pending.append(PendingCall(call_id, name, call_turn, line, offset))
                    continue
                tool = f" ({name})" if name is not None else ""
                derived.append(
                    Problem(
                        ProblemKind.UNPAIRED_TOOL_CALL,
                        line,
                        offset,
                        f"tool call {call_id}{tool} has no later tool result",
                        turn_id=call_turn,
                        tool_call_id=call_id,
                    )
                )
        for line, offset, entry_type, anchor in self._anchors:
            if anchor is not None and id_digest(anchor) in self._entry_ids:
                continue  # it named an entry further down the file
            message = (
                f"{entry_type} has no lastEntryId"
                if anchor is None
                else f'{entry_type} anchor lastEntryId "{anchor}" is not an entry id in this file'
            )
            derived.append(
                Problem(ProblemKind.MISSING_ANCHOR, line, offset, message, anchor=anchor)
            )
        if self._pending_size:
            derived.append(self._torn_tail())

        counts = dict(self._recorded_counts)
        listed = list(self._recorded)
        per_kind: dict[str, int] = {}
        for problem in derived:
            counts[problem.kind] = counts.get(problem.kind, 0) + 1
            per_kind[problem.kind] = per_kind.get(problem.kind, 0) + 1
            if per_kind[problem.kind] <= MAX_LISTED:
                listed.append(problem)
        listed.sort(key=listing_order)

        return Report(
            bytes_checked=self._offset + self._pending_size,
            lines=self._lines,
            blank_lines=self._blank_lines,
            entries=self._entries,
            problems=tuple(listed),
            problem_counts={str(kind): counts[kind] for kind in ProblemKind if kind in counts},
            turn_events=dict(self._turn_events),
            entry_types=dict(sorted(self._entry_types.items())),
            message_types=dict(sorted(self._message_types.items())),
            late_projections=dict(sorted(self._late_projections.items())),
            turn_in_progress=in_progress,
            pending_tool_calls=tuple(sorted(pending, key=lambda p: (p.line, p.tool_call_id))),
            extra_notes=tuple(self._dsh.notes()) if self._dsh is not None else (),
            dsh=self._dsh.summary() if self._dsh is not None else None,
        )

    def _torn_tail(self) -> Problem:
        size = self._pending_size
        if len(self._pending) != size:
            shape = f"longer than the {self.hold} bytes held: not parsed"
        else:
            try:
                parsed = orjson.loads(bytes(self._pending))
            except orjson.JSONDecodeError:
                shape = "not valid JSON"
            else:
                shape = "a JSON object" if type(parsed) is dict else "JSON, but not an object"
        return Problem(
            ProblemKind.TORN_TAIL,
            self._lines + 1,
            self._offset,
            f"torn tail: {size} bytes without a final newline ({shape})",
        )

    # -- saving and restoring --------------------------------------------------------------

    def to_state(self) -> bytes:
        """Everything needed to continue feeding from where this checker stands."""
        state = {
            "version": STATE_VERSION,
            "offset": self._offset,
            "lines": self._lines,
            "pending": base64.b64encode(self._pending).decode(),  # empty once outgrown
            "pending_size": self._pending_size,
            "unread_line": self.unread_line,
            "blank_lines": self._blank_lines,
            "entries": self._entries,
            "entry_types": self._entry_types,
            "message_types": self._message_types,
            "turn_events": self._turn_events,
            "pre_turns": self._pre_turns,
            "open_turns": self._open_turns,
            "ended_turns": self._ended_turns,
            "late_turns": self._late_turns,
            "late_projections": self._late_projections,
            "last_start": self._last_start,
            "tool_calls": self._tool_calls,
            "entry_ids": base64.b64encode(pack_ids(self._entry_ids)).decode(),
            "shown_images": base64.b64encode(pack_ids(self._shown_images)).decode(),
            "anchors": self._anchors,
            "recorded": [problem.to_json() for problem in self._recorded],
            "recorded_counts": self._recorded_counts,
            "refs": self._refs,
            "dsh": self._dsh.to_state() if self._dsh is not None else None,
        }
        return orjson.dumps(state)

    @classmethod
    def from_state(cls, blob: bytes, hold: int | None = None) -> LogChecker:
        state = orjson.loads(blob)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("not a saved LogChecker state of this version")
        checker = cls(hold)
        checker._offset = state["offset"]
        checker._lines = state["lines"]
        checker._pending = bytearray(base64.b64decode(state["pending"]))
        checker._pending_size = state.get("pending_size", len(checker._pending))
        unread = state.get("unread_line")
        checker.unread_line = (unread[0], unread[1]) if unread else None
        if hold is not None and len(checker._pending) > hold:
            checker._pending = bytearray()  # saved by a checker that held more: outgrown here
        checker._blank_lines = state["blank_lines"]
        checker._entries = state["entries"]
        checker._entry_types = state["entry_types"]
        checker._message_types = state["message_types"]
        checker._turn_events = state["turn_events"]
        checker._pre_turns = {k: (v[0], v[1]) for k, v in state["pre_turns"].items()}
        checker._open_turns = {k: (v[0], v[1]) for k, v in state["open_turns"].items()}
        checker._ended_turns = state["ended_turns"]
        checker._late_turns = state["late_turns"]
        checker._late_projections = state["late_projections"]
        checker._last_start = state["last_start"]
        checker._tool_calls = {
            call_id: [(s[0], s[1], s[2], s[3]) for s in sites]
            for call_id, sites in state["tool_calls"].items()
        }
        checker._entry_ids = unpack_ids(base64.b64decode(state["entry_ids"]))
        checker._shown_images = unpack_ids(base64.b64decode(state["shown_images"]))
        checker._anchors = [(a[0], a[1], a[2], a[3]) for a in state["anchors"]]
        checker._recorded = [
            Problem(
                kind=ProblemKind(p["kind"]),
                line=p["line"],
                offset=p["offset"],
                message=p["message"],
                detail=p.get("detail"),
                turn_id=p.get("turn_id"),
                tool_call_id=p.get("tool_call_id"),
                anchor=p.get("anchor"),
                reference=p.get("reference"),
            )
            for p in state["recorded"]
        ]
        checker._recorded_counts = state["recorded_counts"]
        checker._refs = {str(k): [v[0], v[1]] for k, v in state["refs"].items()}
        dsh = state["dsh"]
        checker._dsh = DshTrace.from_state(dsh) if dsh is not None else None
        return checker


def with_problems(report: Report, extra: list[Problem], notes: list[str]) -> Report:
    """`report` with problems found outside the log (missing resource files) and notes."""
    counts = dict(report.problem_counts)
    for p in extra:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    listed = sorted([*report.problems, *extra[:MAX_LISTED]],
                    key=listing_order)
    return dataclasses.replace(
        report, problems=tuple(listed),
        problem_counts={str(k): counts[k] for k in ProblemKind if k in counts},
        extra_notes=(*report.extra_notes, *notes))
