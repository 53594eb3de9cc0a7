"""Generated dsh-session histories, as @deepseek-ai/dsh-session writes them, and damages.

A history is a list of records: the header, then events without their seq (numbered when
written, as the library numbers them: seq = log length, from 0), some `assistant/chunk` runs
packed into one `text-chunks` row as the JSONL backend packs them. Turns hold zero or more
steps; a step a request/header, chunks, an assistant message, tool calls and their results,
maybe unknown plugin events; a turn the library's crash repair closed ends with its synthetic
closers. A damage changes the records and says which problem it must cause at which line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import strategies as st

Record = dict[str, Any]

HEADER: Record = {"type": "session", "version": 0, "id": "s-1", "createdAt": 1_800_000_000_000,
                  "cwd": "/home/a/proj", "delegationDepth": 0}


def ev(kind: str, **data: Any) -> Record:
    return {"type": kind, "time": 1_800_000_000_000, "data": data}


def result(turn: int, step: int, call_id: str, code: str | None = None) -> Record:
    e = ev("tool/result", turn=turn, step=step,
           message={"id": f"r-{call_id}", "role": "user",
                    "source": {"kind": "tool", "callId": call_id},
                    "content": [{"type": "tool-result", "toolCallId": call_id,
                                 "isError": code is not None, "content": []}]})
    if code is not None:
        e["data"]["error"] = {"name": "x", "code": code}
    e["surfaceOp"] = "append"
    return e


@st.composite
def histories(draw: st.DrawFn) -> list[Record]:
    records: list[Record] = [dict(HEADER)]
    calls = 0
    turns = draw(st.integers(0, 4))
    for turn in range(1, turns + 1):
        records.append(ev("turn/start", turn=turn))
        records.append({**ev("user/message", id=f"u{turn}", role="user",
                             source={"kind": "human"}, content="hi\n" * draw(st.integers(0, 2))),
                        "surfaceOp": "append"})
        steps = draw(st.integers(0, 3))
        crashed = turn == turns and draw(st.booleans())
        for step in range(1, steps + 1):
            records.append(ev("step/start", turn=turn, step=step))
            records.append(ev("request/header", header={"model": "m"}, reason="initial"))
            chunks = draw(st.integers(0, 4))
            if chunks >= 2 and draw(st.booleans()):
                records.append({"type": "text-chunks", "time0": 1, "data": {
                    "turn": turn, "step": step, "index": 0, "dt": [1] * (chunks - 1),
                    "texts": ["t"] * chunks}})
            else:
                records += [ev("assistant/chunk", turn=turn, step=step,
                               chunk={"type": "text-delta", "text": "t"})
                            for _ in range(chunks)]
            if draw(st.booleans()):
                records.append({**ev("llm/retry", attempt=1), "ignorable": True})
            records.append({**ev("assistant/message", turn=turn, step=step,
                                 message={"role": "assistant"}), "surfaceOp": "append"})
            ids = []
            for _ in range(draw(st.integers(0, 3))):
                calls += 1
                ids.append(f"call-{calls}")
                records.append(ev("tool/call", turn=turn, step=step, callId=ids[-1],
                                  name="bash", arguments="{}"))
            last = crashed and step == steps
            answered = draw(st.permutations(ids))
            if last:  # the crash came while these ran: the library's repair answers them
                answered = answered[:draw(st.integers(0, len(answered)))]
            records += [result(turn, step, i) for i in answered]
            if last:
                records += [result(turn, step, i, "TOOL_OUTCOME_UNKNOWN")
                            for i in ids if i not in answered]
                if draw(st.booleans()):
                    records.append(result(turn, step, "never-recorded", "TOOL_NOT_STARTED"))
            records.append(ev("step/end", turn=turn, step=step))
        records.append(ev("turn/end", turn=turn,
                          reason={"kind": "interrupted" if crashed else "completed"}))
        if draw(st.booleans()):
            records.append({**ev("hook/note", text="between turns"), "ignorable": True})
    return records


def number(records: list[Record]) -> list[Record]:
    """The records with their seq, as the library numbers them."""
    out, seq = [], 0
    for r in records:
        if r.get("type") == "session":
            out.append(r)
        elif r.get("type") == "text-chunks":
            out.append({"type": r["type"], "seq0": seq, **{k: v for k, v in r.items()
                                                             if k != "type"}})
            seq += len(r["data"]["texts"])
        else:
            out.append({"seq": seq, **r})
            seq += 1
    return out


def lines(records: list[Record]) -> list[bytes]:
    return [orjson.dumps(r) + b"\n" for r in number(records)]


@dataclass
class Damage:
    name: str
    kind: str
    line: int  # 1-based: the record the problem must name
    data: list[bytes]


def _find(records: list[Record], pick: int, want: Callable[[int, Record], bool]) -> int | None:
    places = [i for i, r in enumerate(records) if want(i, r)]
    return places[pick % len(places)] if places else None


def _next_type(records: list[Record], i: int) -> str | None:
    return records[i + 1].get("type") if i + 1 < len(records) else None


def drop_header(records: list[Record], pick: int) -> Damage | None:
    if len(records) < 2:
        return None
    return Damage("drop_header", "missing_header", 1, lines(records[1:]))


def header_again(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: i >= 1)
    if i is None:
        return None
    return Damage("header_again", "header_not_first", i + 1,
                  lines([*records[:i], dict(HEADER), *records[i:]]))


def not_event(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: i >= 1)
    if i is None:
        return None
    out = lines(records)
    out[i] = b'{"note":"hand edit"}\n'
    return Damage("not_event", "not_event", i + 1, out)


def seq_repeated(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: i >= 2 and "seq" in number(records)[i])
    if i is None:
        return None
    numbered = number(records)
    numbered[i] = {**numbered[i], "seq": numbered[i]["seq"] - 1}
    return Damage("seq_repeated", "seq_not_increasing", i + 1,
                  [orjson.dumps(r) + b"\n" for r in numbered])


def record_lost(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: 1 <= i < len(records) - 1)
    if i is None:
        return None
    out = lines(records)
    del out[i]
    return Damage("record_lost", "seq_gap", i + 1, out)


def turn_renumbered(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: r.get("type") == "turn/start")
    if i is None:
        return None
    out = [dict(r) for r in records]
    out[i] = ev("turn/start", turn=out[i]["data"]["turn"] + 1)
    return Damage("turn_renumbered", "turn_number", i + 1, lines(out))


def step_renumbered(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: r.get("type") == "step/start")
    if i is None:
        return None
    d = records[i]["data"]
    out = list(records)
    out[i] = ev("step/start", turn=d["turn"], step=d["step"] + 1)
    return Damage("step_renumbered", "step_number", i + 1, lines(out))


def header_outside_turn(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: r.get("type") == "turn/end")
    if i is None:
        return None
    out = [*records[:i + 1], ev("request/header", header={}, reason="change"), *records[i + 1:]]
    return Damage("header_outside_turn", "outside_turn", i + 2, lines(out))


def chunk_after_step(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: r.get("type") == "step/end")
    if i is None:
        return None
    d = records[i]["data"]
    late = ev("assistant/chunk", turn=d["turn"], step=d["step"], chunk={"type": "text-delta"})
    return Damage("chunk_after_step", "outside_step", i + 2,
                  lines([*records[:i + 1], late, *records[i + 1:]]))


def step_end_lost(records: list[Record], pick: int) -> Damage | None:
    i = _find(records, pick, lambda i, r: r.get("type") == "step/end"
              and _next_type(records, i) in ("turn/end", "step/start"))
    if i is None:
        return None
    return Damage("step_end_lost", "open_step", i + 1, lines(records[:i] + records[i + 1:]))


def turn_end_lost(records: list[Record], pick: int) -> Damage | None:
    starts = [i for i, r in enumerate(records) if r.get("type") == "turn/start"]
    i = _find(records, pick, lambda i, r: r.get("type") == "turn/end"
              and any(s > i for s in starts))
    if i is None:
        return None
    start = max(s for s in starts if s < i)
    return Damage("turn_end_lost", "open_turn", start + 1, lines(records[:i] + records[i + 1:]))


def call_lost(records: list[Record], pick: int) -> Damage | None:
    answered = {r["data"]["message"]["source"]["callId"] for r in records
                if r.get("type") == "tool/result"}
    i = _find(records, pick, lambda i, r: r.get("type") == "tool/call"
              and r["data"]["callId"] in answered)
    if i is None:
        return None
    call_id = records[i]["data"]["callId"]
    out = records[:i] + records[i + 1:]
    at = next(j for j, r in enumerate(out) if r.get("type") == "tool/result"
              and r["data"]["message"]["source"]["callId"] == call_id)
    return Damage("call_lost", "tool_result_without_call", at + 1, lines(out))


DAMAGES = [drop_header, header_again, not_event, seq_repeated, record_lost, turn_renumbered,
           step_renumbered, header_outside_turn, chunk_after_step, step_end_lost, turn_end_lost,
           call_lost]
