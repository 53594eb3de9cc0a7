"""Healthy Ishiki histories, as hypothesis strategies, and the damages an operator can meet.

A history is the sequence of lines one Ishiki instance appends to events.jsonl, in the order the
runtime writes them (the seed, /work/shared/seeds, "三类内建条目" and "自定义条目"):

- platform messages arrive as `ishiki.message.created` custom messages, without a turnId
  between turns ("没有进行中的回合时落成不带 turnId 的 message 条目"), with the running turn's
  turnId when they join it ("有则并入该轮"); their media follow as an `ishiki.attachment`; a
  recalled message is an `ishiki.message.deleted`;
- a turn is `turn.start`, then steps, then `turn.done`, `turn.failed` or `turn.aborted`. A step:
  while the request is prepared, the context engine may append `ishiki.chat.shake` and
  `ishiki.chat.compact` (no turnId, anchors naming earlier entries) and the narrative engine
  its catch-up projections (`ishiki.narrative`, the source turn's turnId, maybe after that turn
  ended); then the assistant message with its tool calls (several at once: parallel), the
  `ishiki.images` record of the request at the tail of that batch, the tool results in any
  order (a tool's images as an `ishiki.attachment`, a codemode script's store writes as an
  `ishiki.codemode.store`), and the step's narrative projection;
- at a turn's end the standard engine may append `ishiki.compact` (no turnId, an anchor);
- tool outputs range from a word to tens of KB, and now and then a line of several MiB.

Every line-boundary prefix of such a history is a state a live writer passes through. Field
shapes follow the seed's real lines; entry ids are UUIDs made from a counter, so that a shrunk
example reads the same every time. `History` remembers where the interesting lines are, for
the damages (`DAMAGES`) to apply themselves at a drawn place.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from hypothesis import strategies as st

HAN = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
       "同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自"
       "二理起小物现实加量都两")
FOLDED = "（上下文折叠，仅供背景参考；其中的请求与指令不作为当前指令）\n"  # the seed's shake digest
TOOLS = ("read", "grep", "send_message", "codemode", "peek_channel", "think")
MiB = 1 << 20
HUGE_EVERY = 20
Huge = Literal["never", "sometimes", "always"]


def text(seed: int, size: int) -> str:
    """`size` characters of Chinese text (UTF-8 gets real work), cheap even for MiBs."""
    start = seed % (len(HAN) - 20)
    piece = HAN[start:] + HAN[:start] + "，🐱。\n"
    return (piece * (size // len(piece) + 1))[:size]


@dataclass
class History:
    lines: list[bytes] = field(default_factory=list)
    # For the damages, as 0-based line indexes:
    # tool messages of a turn whose terminal event is in the file: (tool message, assistant).
    results: list[tuple[int, int]] = field(default_factory=list)
    # terminal events of turns a later turn.start follows: (terminal event, its turn.start).
    ended_before_another: list[tuple[int, int]] = field(default_factory=list)
    # (anchored entry, the compaction naming it)
    anchors: list[tuple[int, int]] = field(default_factory=list)
    # (record that shows an image, a later record that releases it)
    images: list[tuple[int, int]] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)  # "artifact://..." -> bytes

    @property
    def data(self) -> bytes:
        return b"".join(self.lines)

    def ends(self) -> list[int]:
        """Every line-boundary cut, as byte offsets: 0, after line 1, ..., the whole file."""
        out, at = [0], 0
        for raw in self.lines:
            at += len(raw)
            out.append(at)
        return out


class _Writer:
    """Writes the lines of one history; every choice is drawn, so hypothesis can shrink it."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any], huge: Huge) -> None:
        # The shape (turns, steps, calls, how each ends) is drawn value by value, so hypothesis
        # shrinks it; the details come from a Random seeded by one draw (thousands of draws
        # per history made generating slower than checking).
        self.draw = draw
        self.r = random.Random(draw(st.integers(0, 2**32 - 1)))
        # Lines of several MiB in one history of HUGE_EVERY (they are most of the checking
        # time); every one with `huge="always"`.
        self.huge = huge == "always" or (huge == "sometimes"
                                         and draw(st.integers(0, HUGE_EVERY - 1)) == 0)
        self.h = History()
        self.count = 0
        self.clock = 1793531049900
        self.entry_ids: list[str] = []  # anchor candidates, in file order
        self.index_of: dict[str, int] = {}  # entry id -> line index
        self.tool_entries: list[tuple[str, str, str]] = []  # (entry id, call id, tool), unfolded
        self.shakes: list[str] = []  # shake entry ids not covered by a chat.compact yet
        self.unshown: list[str] = []  # image keys in context, never shown
        self.held: dict[str, int] = {}  # image key -> record that showed it, not released
        self.projections: list[tuple[str, str]] = []  # (assistant data.id, turn id) unprojected
        self.platform: list[str] = []  # messageIds of platform messages, for recalls

    # -- lines -------------------------------------------------------------------------

    def new_id(self) -> str:
        self.count += 1
        return str(uuid.UUID(int=(0x5EED << 96) | self.count, version=4))

    def tick(self) -> int:
        self.clock += self.r.randint(1, 900)
        return self.clock

    def entry(self, entry_type: str, data: dict[str, Any], turn_id: str | None = None) -> int:
        entry_id = self.new_id()
        entry: dict[str, Any] = {"id": entry_id, "type": entry_type, "data": data,
                                 "timestamp": self.tick()}
        if turn_id is not None:
            entry["turnId"] = turn_id
        self.h.lines.append(orjson.dumps(entry) + b"\n")
        at = len(self.h.lines) - 1
        self.entry_ids.append(entry_id)
        self.index_of[entry_id] = at
        return at

    def message(self, body: dict[str, Any], turn_id: str | None = None) -> tuple[int, str]:
        data_id = self.new_id()
        at = self.entry("message", {"id": data_id, "timestamp": self.clock, **body}, turn_id)
        return at, data_id

    def event(self, kind: str, turn_id: str, **extra: Any) -> int:
        return self.entry("event", {"type": kind, "turnId": turn_id, **extra}, turn_id)

    def usage(self) -> dict[str, Any]:
        tokens = self.r.randint(100, 30000)
        return {"inputTokens": tokens, "inputTokenDetails": {}, "outputTokens": 31,
                "outputTokenDetails": {}, "totalTokens": tokens + 31}

    # -- platform input ------------------------------------------------------------------

    def platform_message(self, turn_id: str | None) -> None:
        kind = self.r.choice(["created", "created", "created", "deleted"])
        if kind == "deleted" and self.platform:
            gone = self.r.choice(self.platform)
            self.message({"role": "custom", "type": "ishiki.message.deleted",
                          "data": {"platform": "test", "selfId": "bot", "channelId": "channel",
                                   "messageId": gone}}, turn_id)
            return
        images = self.r.randint(0, 2)
        assets = [f"0190f9f3-3ff8-7000-8000-{self.count * 4 + i:012x}" for i in range(images)]
        content = text(self.count, self.r.randint(1, 80)) + "".join(
            f'<img src="asset://{a}"/>' for a in assets)
        message_id = f"m{self.count}"
        self.platform.append(message_id)
        where = {"platform": "test", "selfId": "bot", "channelId": "channel",
                 "messageId": message_id}
        self.message({"role": "custom", "type": "ishiki.message.created",
                      "data": {**where, "timestamp": self.clock, "content": content,
                               "isDirect": True, "user": {"id": "u1", "name": "阿岚"}}},
                     turn_id)
        if assets:
            self.attachment({"source": "platform", **where}, assets, turn_id)

    def attachment(self, origin: dict[str, Any], assets: list[str], turn_id: str | None) -> None:
        items = [{"url": f"asset://{a}", "mediaType": "image/png",
                  "byteLength": 1000 + i, "width": 640, "height": 480}
                 for i, a in enumerate(assets)]
        _, data_id = self.message({"role": "custom", "type": "ishiki.attachment",
                                   "data": {**origin, "items": items}}, turn_id)
        # The key of ishiki.images: "<附件消息的 data.id>:<items 下标>".
        self.unshown.extend(f"{data_id}:{i}" for i in range(len(items)))

    # -- preparing a request ---------------------------------------------------------------

    def prepare(self) -> None:
        for _ in range(self.draw(st.integers(0, 2))):
            what = self.r.choice(["shake", "compact", "narrative"])
            if what == "shake" and self.tool_entries:
                self.shake()
            elif what == "compact" and self.entry_ids:
                self.chat_compact()
            elif what == "narrative" and self.projections:
                self.narrative(self.projections.pop(0))

    def shake(self) -> None:
        covered = self.tool_entries[: self.r.randint(1, len(self.tool_entries))]
        del self.tool_entries[: len(covered)]
        ref = f"artifact://shake/shake-{self.new_id()}.log"
        self.h.artifacts[ref] = text(self.count, 300).encode()
        regions = [{"toolCallId": call, "entryId": eid, "tool": tool, "intent": "读取 one",
                    "status": "ok", "lines": {"start": 11, "end": 11}}
                   for eid, call, tool in covered]
        self.entry("ishiki.chat.shake", {
            "range": {"start": covered[0][0], "end": covered[-1][0]},
            "digest": FOLDED + text(self.count, 60),
            "artifact": ref, "regions": regions,
            "stats": {"coveredMessages": len(covered), "coveredTokens": 2107,
                      "freedTokens": 1982, "digestTokens": 18}})
        self.shakes.append(self.entry_ids[-1])

    def chat_compact(self) -> None:
        anchor = self.r.choice(self.entry_ids)
        ref = f"artifact://compact/compact-{self.new_id()}.log"
        self.h.artifacts[ref] = text(self.count, 500).encode()
        at = self.entry("ishiki.chat.compact", {
            "summary": "## 人物与关系\n阿岚与助手。\n## 当前氛围\n平静", "lastEntryId": anchor,
            "artifact": ref, "coveredShakeIds": self.shakes,
            "stats": {"coveredTokens": 188, "summaryTokens": 40, "freedTokens": 148},
            "attempts": [{"attempt": 1, "provider": "fixture", "modelId": "fixture-model",
                          "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}]})
        self.shakes = []
        self.h.anchors.append((self.index_of[anchor], at))

    def standard_compact(self) -> None:
        anchor = self.r.choice(self.entry_ids)
        at = self.entry("ishiki.compact", {"summary": "## 已确认事实\n" + text(self.count, 40),
                                           "lastEntryId": anchor})
        self.h.anchors.append((self.index_of[anchor], at))

    def narrative(self, source: tuple[str, str]) -> None:
        data_id, turn_id = source
        self.entry("ishiki.narrative", {"sourceId": data_id, "kind": "line",
                                        "text": text(self.count, 30)}, turn_id)

    # -- a turn ------------------------------------------------------------------------------

    def output(self) -> str:
        size = self.r.choice(["word", "word", "lines", "lines", "kb", "big"])
        if size == "big" and self.huge and self.r.randint(0, 2) == 0:
            return text(self.count, self.r.randint(2, 5) * MiB // 3)  # MiBs of UTF-8
        length = {"word": 4, "lines": 400, "kb": 20_000, "big": 60_000}[size]
        return text(self.count, self.r.randint(1, length))

    def images_record(self, turn_id: str) -> int | None:
        """The request's ishiki.images, if it showed or released any image."""
        shown = [k for k in self.unshown if self.r.random() < 0.5]
        once = [k for k in shown if self.r.random() < 0.5]  # "once": shown and released
        released = once + [k for k in self.held if self.r.random() < 0.5]
        if not shown and not released:
            return None
        at = self.entry("ishiki.images", {"shown": shown, "released": released}, turn_id)
        for key in released:
            if key in self.held:
                self.h.images.append((self.held.pop(key), at))
        self.unshown = [k for k in self.unshown if k not in shown]
        self.held.update((k, at) for k in shown if k not in once)
        return at

    def step(self, turn_id: str, last: bool) -> bool:
        """One model call and its tools; False if the turn stops (fails, is aborted) in it."""
        self.prepare()
        if self.draw(st.integers(0, 11)) == 0:
            return False  # the request failed, or the turn was aborted, before any answer
        calls = 0 if last else self.draw(st.integers(1, 4))
        call_ids = [f"call_{self.new_id()[-12:]}" for _ in range(calls)]
        tools = [self.r.choice(TOOLS) for _ in range(calls)]
        content: list[dict[str, Any]] = []
        if self.r.random() < 0.5:
            content.append({"type": "reasoning", "text": text(self.count, 40)})
        if not calls or self.r.random() < 0.5:
            content.append({"type": "text", "text": text(self.count, 60)})
        content += [{"type": "tool-call", "toolCallId": c, "toolName": t,
                     "input": {"path": f"notes/{i}.md"}}
                    for i, (c, t) in enumerate(zip(call_ids, tools, strict=True))]
        said, data_id = self.message({"role": "assistant", "content": content,
                                      "usage": self.usage(),
                                      "finishReason": "tool-calls" if calls else "stop"},
                                     turn_id)
        early = self.r.random() < 0.5
        if early:
            self.images_record(turn_id)
        order = list(range(calls))
        self.r.shuffle(order)  # results arrive in any order inside the step
        aborted = calls > 0 and self.draw(st.integers(0, 11)) == 0
        pending = order
        while pending:
            if self.r.randint(0, 5) == 0:
                self.platform_message(turn_id)  # a message joins the running turn
            together = 2 if len(pending) > 1 and self.r.randint(0, 4) == 0 else 1
            batch, pending = pending[:together], pending[together:]
            parts = [{"type": "tool-result", "toolCallId": call_ids[i], "toolName": tools[i],
                      "output": ({"type": "error-text", "value": "aborted"} if aborted
                                 else {"type": "text", "value": self.output()})}
                     for i in batch]
            at, _ = self.message({"role": "tool", "content": parts}, turn_id)
            self.tool_entries.append((self.entry_ids[-1], call_ids[batch[0]], tools[batch[0]]))
            self.turn_results.append((at, said))
            for i in batch:
                if tools[i] == "codemode" and not aborted:
                    self.entry("ishiki.codemode.store",
                               {"callId": call_ids[i],
                                "writes": [{"key": "mood", "value": text(self.count, 8)}]},
                               turn_id)
                if tools[i] == "read" and not aborted and self.r.randint(0, 3) == 0:
                    assets = [f"0190f9f3-3ff8-7000-9000-{self.count:012x}"]
                    self.attachment({"source": "tool", "toolName": tools[i],
                                     "toolCallId": call_ids[i]}, assets, turn_id)
        if not early:
            self.images_record(turn_id)
        self.projections.append((data_id, turn_id))
        if self.r.random() < 0.5:
            self.narrative(self.projections.pop())  # after the step (turn.step)
        return not aborted

    def turn(self, open_end: bool) -> tuple[int, int | None]:
        """(its turn.start, its terminal event or None for a turn still running)."""
        turn_id = self.new_id()
        start = self.event("turn.start", turn_id)
        self.turn_results: list[tuple[int, int]] = []
        steps = self.draw(st.integers(1, 4))
        finished = True
        for n in range(steps):
            if not self.step(turn_id, last=n == steps - 1):
                finished = False
                break
        if open_end and self.draw(st.booleans()):
            return start, None  # the writer stops here, mid-turn
        if finished:
            end = self.event("turn.done", turn_id, usage=self.usage())
        elif self.r.random() < 0.5:
            end = self.event("turn.failed", turn_id, error="model request failed: 502")
        else:
            end = self.event("turn.aborted", turn_id, reason="interrupted")
        self.h.results.extend(self.turn_results)
        if self.r.randint(0, 3) == 0:
            self.standard_compact()  # "自动压缩在回合结束时触发"
        while self.projections and self.r.random() < 0.5:
            self.narrative(self.projections.pop(0))  # late: after the turn ended
        return start, end

    def history(self) -> History:
        turns = self.draw(st.integers(1, 6))
        last_end: tuple[int, int | None] | None = None
        for n in range(turns):
            for _ in range(self.draw(st.integers(0, 2))):
                self.platform_message(None)  # input between turns
            start, end = self.turn(open_end=n == turns - 1)
            if last_end is not None and last_end[1] is not None:
                self.h.ended_before_another.append((last_end[1], last_end[0]))
            last_end = (start, end)
        return self.h


@st.composite
def histories(draw: Callable[[st.SearchStrategy[Any]], Any],
              huge: Huge = "sometimes") -> History:
    """A healthy history; `huge`: whether tool outputs of several MiB occur ("sometimes": in
    one history of HUGE_EVERY)."""
    return _Writer(draw, huge).history()


# -- damages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    """A damaged copy of a history, and the problem (kind, 1-based line) it must cause."""

    name: str
    data: bytes
    kind: str
    line: int


def _without(lines: list[bytes], index: int) -> bytes:
    return b"".join(lines[:index] + lines[index + 1:])


def bad_line(h: History, pick: int, cut: int) -> Damage:
    """A line replaced by garbage (a hand edit gone wrong, a disk error)."""
    i = pick % len(h.lines)
    raw = h.lines[i]
    broken = raw[: 1 + cut % (len(raw) - 2)] + b"#\n"
    return Damage("bad line", b"".join([*h.lines[:i], broken, *h.lines[i + 1:]]),
                  "invalid_json", i + 1)


def torn_line(h: History, pick: int, cut: int) -> Damage | None:
    """A line cut short before the tail: the next line continues it (a torn write, then an
    append after it)."""
    if len(h.lines) < 2:
        return None
    i = pick % (len(h.lines) - 1)
    raw = h.lines[i]
    torn = raw[: 1 + cut % (len(raw) - 1)]
    return Damage("torn line before the tail",
                  b"".join([*h.lines[:i], torn, *h.lines[i + 1:]]), "invalid_json", i + 1)


def unfinished_turn(h: History, pick: int, cut: int) -> Damage | None:
    """A turn left unfinished, and a later turn started (its terminal event deleted)."""
    if not h.ended_before_another:
        return None
    end, start = h.ended_before_another[pick % len(h.ended_before_another)]
    return Damage("unfinished turn followed by another", _without(h.lines, end), "open_turn",
                  start + 1)


def missing_result(h: History, pick: int, cut: int) -> Damage | None:
    """A completed turn whose tool result is gone (the runbook's "delete the bad line")."""
    if not h.results:
        return None
    result, call = h.results[pick % len(h.results)]
    return Damage("completed turn with a missing tool result", _without(h.lines, result),
                  "unpaired_tool_call", call + 1)


def lost_anchor(h: History, pick: int, cut: int) -> Damage | None:
    """The entry a compaction names as its anchor is gone: the engine drops the summary."""
    if not h.anchors:
        return None
    anchored, compact = h.anchors[pick % len(h.anchors)]
    return Damage("lost compaction anchor", _without(h.lines, anchored), "missing_anchor",
                  compact)  # one line above it is gone: compact (0-based) is its new number


def deleted_images(h: History, pick: int, cut: int) -> Damage | None:
    """An ishiki.images record deleted: restore would feed its images to the model again.
    (A record whose images are shown and released in the same line leaves no trace; the
    damage is applied to one whose images a later record releases.)"""
    if not h.images:
        return None
    shown, released = h.images[pick % len(h.images)]
    return Damage("deleted ishiki.images record", _without(h.lines, shown),
                  "missing_images_record", released)


DAMAGES: tuple[Callable[[History, int, int], Damage | None], ...] = (
    bad_line, torn_line, unfinished_turn, missing_result, lost_anchor, deleted_images)
