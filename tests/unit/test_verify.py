"""The pure log checker: each check on real-shaped lines, chunk-split invariance, saved state."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.core import logcheck as verify
from syncd.core.logcheck import LogChecker
from syncd.core.logreport import PendingCall, Problem, ProblemKind, Report, TurnInProgress

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verify"
T1 = "e061c676-0701-4e5c-b2c8-565cf9462c91"
T2 = "5b0c4a7e-2f1d-4c55-9a3e-8d2f6b1c7e40"
CLEAN_LINES = (FIXTURES / "clean.jsonl").read_bytes().splitlines(keepends=True)


def check(data: bytes) -> Report:
    checker = LogChecker()
    checker.feed(data)
    return checker.report()


def fixture_report(name: str) -> Report:
    return check((FIXTURES / name).read_bytes())


def line(entry: dict[str, Any]) -> bytes:
    return orjson.dumps(entry) + b"\n"


def event(event_type: str, turn_id: str, entry_id: str = "e") -> bytes:
    data = {"type": event_type, "turnId": turn_id}
    return line({"id": entry_id, "type": "event", "data": data, "timestamp": 1, "turnId": turn_id})


def message(data: dict[str, Any], turn_id: str | None = None, entry_id: str = "m") -> bytes:
    entry: dict[str, Any] = {"id": entry_id, "type": "message", "data": data, "timestamp": 1}
    if turn_id is not None:
        entry["turnId"] = turn_id
    return line(entry)


def kinds(report: Report) -> list[tuple[str, int]]:
    return [(problem.kind.value, problem.line) for problem in report.problems]


def offset_of(number: int, lines: list[bytes] = CLEAN_LINES) -> int:
    return sum(len(raw) for raw in lines[: number - 1])


# -- the fixtures, report by report ------------------------------------------------------------


def test_clean_fixture_has_no_problems_and_counts_like_the_seed() -> None:
    report = fixture_report("clean.jsonl")
    assert report.clean
    assert report.problems == ()
    assert report.problem_counts == {}
    assert (report.lines, report.entries, report.blank_lines) == (13, 13, 0)
    assert report.bytes_checked == (FIXTURES / "clean.jsonl").stat().st_size
    assert report.turn_events == {
        "turn.start": 2,
        "turn.done": 2,
        "turn.failed": 0,
        "turn.aborted": 0,
    }
    assert report.entry_types == {"event": 4, "ishiki.compact": 1, "ishiki.images": 1, "message": 7}
    assert report.message_types == {
        "assistant": 3,
        "ishiki.attachment": 1,
        "ishiki.message.created": 2,
        "tool": 1,
    }


def test_the_seed_nine_line_sample_counts_exactly_as_its_jq_output() -> None:
    # The fixture opens with the seed's 9-line sample: `jq -r .type | sort | uniq -c` printed
    # 2 event / 1 ishiki.images / 6 message, and the role query 2/1/2/1.
    report = check(b"".join(CLEAN_LINES[:9]))
    assert report.entry_types == {"event": 2, "ishiki.images": 1, "message": 6}
    assert report.message_types == {
        "assistant": 2,
        "ishiki.attachment": 1,
        "ishiki.message.created": 2,
        "tool": 1,
    }
    assert report.clean


def test_bad_line_is_reported_and_hides_the_tool_result_it_carried() -> None:
    raw = (FIXTURES / "bad_line.jsonl").read_bytes()
    bad = raw.splitlines()[4]
    with pytest.raises(orjson.JSONDecodeError) as parse_error:
        orjson.loads(bad)
    report = check(raw)
    assert report.problems == (
        Problem(
            ProblemKind.UNPAIRED_TOOL_CALL,
            4,
            offset_of(4),
            "tool call call_8Jq2dM1xV4 (read) has no later tool result",
            turn_id=T1,
            tool_call_id="call_8Jq2dM1xV4",
        ),
        Problem(ProblemKind.INVALID_JSON, 5, offset_of(5), "not valid JSON", parse_error.value.msg),
    )
    assert report.problem_counts == {"invalid_json": 1, "unpaired_tool_call": 1}
    assert report.message_types == {
        "assistant": 3,
        "ishiki.attachment": 1,
        "ishiki.message.created": 2,
    }


def test_deleting_the_bad_line_leaves_an_unpaired_tool_call() -> None:
    report = fixture_report("unpaired_tool_call.jsonl")
    assert report.problems == (
        Problem(
            ProblemKind.UNPAIRED_TOOL_CALL,
            4,
            offset_of(4),
            "tool call call_8Jq2dM1xV4 (read) has no later tool result",
            turn_id=T1,
            tool_call_id="call_8Jq2dM1xV4",
        ),
    )


def test_torn_tail_is_reported_with_its_offset() -> None:
    raw = (FIXTURES / "torn_tail.jsonl").read_bytes()
    assert not raw.endswith(b"\n")
    report = check(raw)
    start = raw.rindex(b"\n") + 1
    assert report.lines == 12
    assert report.bytes_checked == len(raw)
    assert report.problems == (
        Problem(
            ProblemKind.TORN_TAIL,
            13,
            start,
            f"torn tail: {len(raw) - start} bytes without a final newline (not valid JSON)",
        ),
    )


def test_a_turn_in_progress_at_the_tail_is_information_not_a_problem() -> None:
    report = fixture_report("open_turn.jsonl")
    assert report.clean
    assert report.turn_in_progress == TurnInProgress(T2, 10, offset_of(10), 1793531112352)
    assert report.notes == [f"turn {T2} in progress since line 10 (2026-11-01 11:05:12Z)"]
    assert report.turn_events["turn.start"] == 2
    assert report.turn_events["turn.done"] == 1


def test_compact_whose_anchor_is_not_in_the_file() -> None:
    report = fixture_report("missing_anchor.jsonl")
    assert report.problems == (
        Problem(
            ProblemKind.MISSING_ANCHOR,
            14,
            offset_of(14),
            'ishiki.chat.compact anchor lastEntryId "onet" is not an entry id in this file',
            anchor="onet",
        ),
    )


# -- each check on small logs ---------------------------------------------------------------


def test_empty_input_is_clean() -> None:
    report = check(b"")
    assert report.clean
    assert (report.lines, report.bytes_checked, report.entries) == (0, 0, 0)


def test_blank_lines_are_counted_and_skipped_like_the_loader_does() -> None:
    report = check(b"\n" + CLEAN_LINES[0] + b"\n")
    assert report.clean
    assert (report.lines, report.blank_lines, report.entries) == (3, 2, 1)


def test_whitespace_only_and_non_object_lines() -> None:
    report = check(b'  \n[1, 2]\n"text"\nnull\n')
    assert [(p.kind.value, p.line, p.offset, p.message) for p in report.problems] == [
        ("invalid_json", 1, 0, "not valid JSON"),
        ("not_object", 2, 3, "valid JSON but not an object (array)"),
        ("not_object", 3, 10, "valid JSON but not an object (string)"),
        ("not_object", 4, 17, "valid JSON but not an object (null)"),
    ]


def test_line_offsets_count_bytes_not_characters() -> None:
    first = message({"role": "user", "content": "阿岚阿岚"})
    report = check(first + b"{oops\n")
    assert report.problems[0].offset == len(first)


def test_turn_events_and_counts() -> None:
    log = (
        event("turn.start", "a")
        + event("turn.done", "a")
        + event("turn.start", "b")
        + event("turn.failed", "b")
        + event("turn.start", "c")
        + event("turn.aborted", "c")
    )
    report = check(log)
    assert report.clean
    assert report.turn_events == {
        "turn.start": 3,
        "turn.done": 1,
        "turn.failed": 1,
        "turn.aborted": 1,
    }


def test_turn_id_only_in_the_event_data_still_counts() -> None:
    start = line({"id": "s", "type": "event", "data": {"type": "turn.start", "turnId": "x"}})
    assert check(start).turn_in_progress == TurnInProgress("x", 1, 0, None)
    done = line({"id": "d", "type": "event", "data": {"type": "turn.done", "turnId": "x"}})
    assert check(start + done).clean


def test_entry_after_the_terminal_event() -> None:
    log = (
        event("turn.start", "a")
        + event("turn.done", "a")
        + message({"role": "assistant", "content": "late"}, "a")
        + event("turn.done", "a")
    )
    report = check(log)
    assert report.problems == (
        Problem(
            ProblemKind.ENTRY_AFTER_TURN_END,
            3,
            offset_of(3, log.splitlines(keepends=True)),
            "turn a ended at line 2, but this line still belongs to it (2 lines in all)",
            turn_id="a",
        ),
    )
    # Both terminal events are counted: the global balance shows it too.
    assert report.turn_events["turn.done"] == 2


def narrative(turn_id: str, entry_id: str = "n") -> bytes:
    # The shape of packages/narrative's entries is not in the seed; only type and turnId matter.
    return line({"id": entry_id, "type": "ishiki.narrative", "data": {"text": "阿岚笑了"},
                 "timestamp": 2, "turnId": turn_id})


def test_late_narrative_projections_are_information() -> None:
    # The seed: the narrative engine projects again "准备请求时" (while preparing the next
    # request), keeping the source assistant entry's turnId, so after that turn's turn.done.
    log = (
        event("turn.start", "a")
        + message({"role": "assistant", "content": "x"}, "a")
        + event("turn.done", "a")
        + narrative("a")
        + event("turn.start", "b")
        + narrative("a", "n2")
        + event("turn.done", "b")
        + narrative("b")
    )
    report = check(log)
    assert report.clean and report.problems == ()
    assert report.late_projections == {"ishiki.narrative": 3}
    assert report.turn_in_progress is None
    assert report.notes == [
        "late ishiki.narrative entries: 3 (written after their turn ended, as the seed allows)"
    ]
    assert report.to_json()["late_projections"] == {"ishiki.narrative": 3}


def test_narrative_inside_its_turn_is_not_counted_as_late() -> None:
    log = event("turn.start", "a") + narrative("a") + event("turn.done", "a")
    report = check(log)
    assert report.clean and report.late_projections == {}


def test_other_turn_entries_after_the_end_are_still_problems() -> None:
    # ishiki.images and ishiki.codemode.store are written in the same append as the turn's
    # assistant message, inside the turn: after its end they mean damage (see core/logcheck.py).
    for late_type in ("ishiki.images", "ishiki.codemode.store"):
        late = line({"id": "i", "type": late_type, "data": {}, "timestamp": 3, "turnId": "a"})
        report = check(event("turn.start", "a") + event("turn.done", "a") + late)
        assert kinds(report) == [("entry_after_turn_end", 3)], late_type
        assert report.late_projections == {}


def test_compaction_entries_belong_to_no_turn() -> None:
    # The seed: "ishiki.chat.shake、ishiki.chat.compact、ishiki.compact 不带 turnId", written
    # while preparing a request or at a turn's end: between turns or inside one, never damage.
    shake = line({"id": "s", "type": "ishiki.chat.shake", "data": {}, "timestamp": 4})
    log = (
        message({"role": "user", "content": "hi"})
        + event("turn.start", "a")
        + shake
        + event("turn.done", "a")
        + compact("ishiki.compact", "m")
    )
    assert check(log).clean


def test_an_unfinished_turn_followed_by_a_later_turn_is_damage() -> None:
    log = (
        event("turn.start", "a")
        + event("turn.start", "b")
        + event("turn.done", "b")
        + message({"role": "user", "content": "hi"})
    )
    report = check(log)
    assert [(p.kind.value, p.line, p.message) for p in report.problems] == [
        ("open_turn", 1, "turn a started but never ended (turn b started after it)"),
    ]
    assert report.turn_in_progress is None
    # ... and the turn started last, still open, is the one in progress.
    more = check(log + event("turn.start", "c", "c1"))
    assert kinds(more) == [("open_turn", 1)]
    assert more.turn_in_progress is not None and more.turn_in_progress.turn_id == "c"


def test_turn_in_progress_ends() -> None:
    checker = LogChecker()
    checker.feed(event("turn.start", "a"))
    assert checker.report().turn_in_progress is not None
    checker.feed(narrative("a") + event("turn.done", "a"))
    report = checker.report()
    assert report.clean and report.turn_in_progress is None and report.notes == []


def test_turn_start_must_be_the_first_entry_of_its_turn() -> None:
    log = message({"role": "user", "content": "hi"}, "a") + event("turn.start", "a")
    assert [(p.kind.value, p.line, p.message) for p in check(log).problems] == [
        (
            "turn_start_not_first",
            2,
            "turn.start of turn a comes after entries of that turn (the first at line 1)",
        ),
    ]
    assert check(log).turn_in_progress == TurnInProgress("a", 2, len(log.splitlines()[0]) + 1, 1)


def test_turns_without_a_start() -> None:
    entries_only = message({"role": "user", "content": "hi"}, "a")
    assert [(p.kind.value, p.message) for p in check(entries_only).problems] == [
        ("turn_without_start", "turn a has entries but no turn.start"),
    ]
    then_ended = entries_only + event("turn.done", "a")
    assert [(p.kind.value, p.line, p.message) for p in check(then_ended).problems] == [
        ("turn_without_start", 1, "turn a never started (it ended at line 2, turn.done)"),
    ]
    end_only = event("turn.aborted", "b")
    assert [(p.kind.value, p.line, p.message) for p in check(end_only).problems] == [
        ("turn_without_start", 1, "turn b ended (turn.aborted) but never started"),
    ]


def test_duplicate_turn_start() -> None:
    log = event("turn.start", "a") + event("turn.start", "a") + event("turn.done", "a")
    assert [(p.kind.value, p.line, p.message) for p in check(log).problems] == [
        ("duplicate_turn_start", 2, "turn a started again (first turn.start at line 1)"),
    ]


def test_entries_without_turn_id_are_outside_any_turn() -> None:
    assert check(message({"role": "custom", "type": "ishiki.message.created", "data": {}})).clean


def call_part(call_id: str, name: str = "read") -> dict[str, Any]:
    return {"type": "tool-call", "toolCallId": call_id, "toolName": name, "input": {}}


def result_part(call_id: str) -> dict[str, Any]:
    output = {"type": "text", "value": "ok"}
    return {"type": "tool-result", "toolCallId": call_id, "toolName": "read", "output": output}


def test_tool_call_paired_by_a_later_tool_message() -> None:
    call = message({"role": "assistant", "content": [call_part("c1")]})
    result = message({"role": "tool", "content": [result_part("c1")]})
    assert check(call + result).clean
    # A result must come later: one that precedes its call pairs nothing.
    assert kinds(check(result + call)) == [("unpaired_tool_call", 2)]


def test_tool_call_shapes_tolerated() -> None:
    calls = message(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "let me look"}, call_part("c1")],
            "toolCalls": [{"id": "c2", "name": "grep"}],
            "tool_calls": [{"id": "c3", "function": {"name": "ls"}}],
        },
        "t",
    )
    results = message({"role": "tool", "toolCallId": "c2", "content": "found"}) + message(
        {"role": "toolResult", "tool_call_id": "c3", "content": []}
    )
    unpaired = [
        (p.tool_call_id, p.message, p.turn_id)
        for p in check(calls + results).problems
        if p.kind is ProblemKind.UNPAIRED_TOOL_CALL
    ]
    assert unpaired == [("c1", "tool call c1 (read) has no later tool result", "t")]


def test_provider_executed_tool_answers_inside_the_assistant_message() -> None:
    both = message({"role": "assistant", "content": [call_part("web"), result_part("web")]})
    assert check(both).clean


def test_reused_tool_call_ids_are_answered_in_order() -> None:
    call = message({"role": "assistant", "content": [call_part("call_0")]})
    result = message({"role": "tool", "content": [result_part("call_0")]})
    assert check(call + result + call + result).clean
    assert kinds(check(call + call + result)) == [("unpaired_tool_call", 2)]


# -- the turn in progress: a step under way --------------------------------------------------


def test_a_tool_call_waiting_for_its_result_in_the_turn_in_progress_is_a_note() -> None:
    # The case: the bot waits on a tool; the assistant line is written, the result not.
    prefix = b"".join(CLEAN_LINES[:3])  # message, attachment, turn.start of T1
    call = message({"role": "assistant", "content": [call_part("c1"), call_part("c2", "grep")]},
                   T1)
    report = check(prefix + call)
    assert report.clean
    assert report.pending_tool_calls == (
        PendingCall("c1", "read", T1, 4, len(prefix)),
        PendingCall("c2", "grep", T1, 4, len(prefix)),
    )
    assert report.notes[1:] == [
        "tool call c1 (read) at line 4 waits for its result (its turn is in progress)",
        "tool call c2 (grep) at line 4 waits for its result (its turn is in progress)",
    ]
    # One result in: the other still waits, in any order.
    answered = check(prefix + call + message({"role": "tool", "content": [result_part("c2")]},
                                             T1))
    assert answered.clean and [p.tool_call_id for p in answered.pending_tool_calls] == ["c1"]


def test_many_pending_calls_are_summed_up_in_one_note() -> None:
    calls = [call_part(f"c{i}") for i in range(5)]
    report = check(event("turn.start", "t") + message({"role": "assistant", "content": calls}, "t"))
    assert report.clean
    assert report.notes[1:] == ["5 tool calls of the turn in progress wait for their results "
                                "(lines 2, 2, 2 ...)"]


def test_a_missing_result_is_damage_once_the_turn_ends_or_a_later_turn_starts() -> None:
    call = message({"role": "assistant", "content": [call_part("c1")]}, "a", entry_id="x")
    for ending in (event("turn.done", "a"), event("turn.aborted", "a"), event("turn.failed", "a"),
                   event("turn.start", "b")):
        report = check(event("turn.start", "a") + call + ending)
        assert report.pending_tool_calls == ()
        assert ("unpaired_tool_call", 2) in kinds(report), ending


def test_a_call_of_another_turn_is_not_pending() -> None:
    # Only calls of the turn in progress wait: one without a turn id, or of an ended turn, is
    # damage even while a turn runs.
    stray = message({"role": "assistant", "content": [call_part("c1")]})
    report = check(event("turn.start", "a") + stray)
    assert kinds(report) == [("unpaired_tool_call", 2)]


def images(shown: list[str], released: list[str], turn_id: str = "t",
           entry_id: str = "i") -> bytes:
    return line({"id": entry_id, "type": "ishiki.images",
                 "data": {"shown": shown, "released": released}, "timestamp": 1,
                 "turnId": turn_id})


def test_images_released_by_a_later_record_are_fine() -> None:
    log = (event("turn.start", "t") + images(["a:0"], ["a:0"]) + images(["b:0", "b:1"], [])
           + images(["c:0"], ["b:1"]) + images([], ["b:0"]))
    assert check(log).clean


def test_a_release_of_an_image_no_record_showed_means_a_deleted_record() -> None:
    # The record that showed b:0 was deleted by hand: restore would feed b:0 again.
    log = event("turn.start", "t") + images(["a:0"], ["a:0"]) + images([], ["b:0", "b:1"])
    report = check(log)
    assert [(p.kind.value, p.line, p.message) for p in report.problems] == [
        ("missing_images_record", 3, 'ishiki.images releases image "b:0" (and 1 more), which no '
         "ishiki.images record before it shows: the record that showed it is missing (a "
         "restart would feed it to the model again)")]
    # Saved and restored in between, the shown keys are remembered.
    checker = LogChecker()
    checker.feed(event("turn.start", "t") + images(["b:0", "b:1"], []))
    restored = LogChecker.from_state(checker.to_state())
    restored.feed(images([], ["b:0", "b:1"]))
    assert restored.report().clean


def compact(entry_type: str, anchor: Any, entry_id: str = "k") -> bytes:
    data = {"summary": "s"} if anchor is None else {"summary": "s", "lastEntryId": anchor}
    return line({"id": entry_id, "type": entry_type, "data": data, "timestamp": 1})


def test_compact_anchor_may_name_any_entry_of_the_file() -> None:
    target = message({"role": "user", "content": "x"}, entry_id="target")
    assert check(target + compact("ishiki.compact", "target")).clean
    # An anchor further down is unusual but still names an entry of the file.
    assert check(compact("ishiki.chat.compact", "target") + target).clean
    # data.id names the message, not the entry: it is no anchor.
    by_message_id = message({"id": "msg", "role": "user", "content": "x"}, entry_id="entry")
    assert kinds(check(by_message_id + compact("ishiki.compact", "msg"))) == [("missing_anchor", 2)]


def test_compact_without_an_anchor() -> None:
    report = check(compact("ishiki.compact", None))
    assert [(p.kind.value, p.message, p.anchor) for p in report.problems] == [
        ("missing_anchor", "ishiki.compact has no lastEntryId", None),
    ]


def test_counts_print_like_jq_for_odd_values() -> None:
    log = (
        line({"id": "1", "data": {}})
        + line({"id": "2", "type": 7})
        + message({"role": "custom", "type": "ishiki.attachment"})
        + message({"role": "assistant", "type": None, "content": "x"})
        + line({"id": "3", "type": "message", "data": "not an object"})
    )
    report = check(log)
    assert report.entry_types == {"7": 1, "message": 3, "null": 1}
    assert report.message_types == {"assistant": 1, "ishiki.attachment": 1, "null": 1}


def test_listed_problems_are_capped_but_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "MAX_LISTED", 3)
    report = check(b"{\n" * 5 + event("turn.start", "a") + event("turn.start", "b"))
    assert report.problem_counts == {"invalid_json": 5, "open_turn": 1}
    assert [p.line for p in report.problems] == [1, 2, 3, 6]
    assert report.problem_total == 6
    assert report.unlisted == 2


# -- incremental use ----------------------------------------------------------------------


def test_report_is_non_destructive_and_a_torn_tail_may_be_completed() -> None:
    whole = CLEAN_LINES[0]
    checker = LogChecker()
    checker.feed(whole[:50])
    first = checker.report()
    assert first == checker.report()
    assert kinds(first) == [("torn_tail", 1)]
    assert first.problems[0].message == (
        "torn tail: 50 bytes without a final newline (not valid JSON)"
    )
    checker.feed(whole[50:-1])
    assert checker.report().problems[0].message.endswith("(a JSON object)")
    checker.feed(b"\n")
    assert checker.report() == check(whole)


def test_feeding_one_byte_at_a_time() -> None:
    data = b"".join(CLEAN_LINES)
    checker = LogChecker()
    for index in range(len(data)):
        checker.feed(data[index : index + 1])
    assert checker.report() == check(data)


def test_state_round_trip_mid_line() -> None:
    data = (FIXTURES / "bad_line.jsonl").read_bytes()
    checker = LogChecker()
    checker.feed(data[:1000])  # inside the tool call of line 4: calls, turns and ids pending
    restored = LogChecker.from_state(checker.to_state())
    assert restored.report() == checker.report()
    restored.feed(data[1000:])
    assert restored.report() == check(data)


def test_state_of_another_version_is_refused() -> None:
    state = orjson.loads(LogChecker().to_state())
    state["version"] = 999
    with pytest.raises(ValueError, match="version"):
        LogChecker.from_state(orjson.dumps(state))


def test_report_json_is_plain_data() -> None:
    document = check(
        (FIXTURES / "open_turn.jsonl").read_bytes() + event("turn.start", "later")
    ).to_json()
    assert orjson.loads(orjson.dumps(document)) == document
    assert document["clean"] is False
    assert document["problems"] == [
        {
            "kind": "open_turn",
            "line": 10,
            "offset": offset_of(10),
            "message": f"turn {T2} started but never ended (turn later started after it)",
            "turn_id": T2,
        }
    ]
    assert document["turn_in_progress"] == {
        "turn_id": "later", "line": 12, "offset": len((FIXTURES / "open_turn.jsonl").read_bytes()),
        "timestamp": 1,
    }


# -- properties -----------------------------------------------------------------------------

# Real lines and damaged ones: every check has material, and cuts fall inside multi-byte text.
POOL = [
    *CLEAN_LINES,
    b"\n",
    b"  \n",
    b"[]\n",
    CLEAN_LINES[4][:40] + b"\n",
    event("turn.start", "z"),
    event("turn.done", T1),
    compact("ishiki.compact", "nowhere"),
    message({"role": "assistant", "content": [call_part("call_8Jq2dM1xV4")]}, T2),
    narrative(T1),
    narrative("z"),
    images(["a:0"], []),
    images([], ["a:0"]),
]

logs = st.builds(
    lambda picks, tail: b"".join(POOL[i] for i in picks) + tail,
    st.lists(st.integers(0, len(POOL) - 1), max_size=40),
    st.sampled_from([b"", b"{", CLEAN_LINES[0][:-1], "阿".encode()[:2]]),
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None)
@given(logs, st.lists(st.integers(0, 1 << 20), max_size=30))
def test_any_chunk_split_gives_the_same_report(data: bytes, cuts: list[int]) -> None:
    checker = LogChecker()
    for chunk in split(data, cuts):
        checker.feed(chunk)
    assert checker.report() == check(data)


@settings(max_examples=200, deadline=None)
@given(logs, st.integers(0, 1 << 20), st.lists(st.integers(0, 1 << 20), max_size=10))
def test_saving_and_restoring_anywhere_changes_nothing(
    data: bytes, pause: int, cuts: list[int]
) -> None:
    at = pause % (len(data) + 1)
    checker = LogChecker()
    for chunk in split(data[:at], cuts):
        checker.feed(chunk)
    restored = LogChecker.from_state(checker.to_state())
    assert restored.report() == checker.report()
    restored.feed(data[at:])
    assert restored.report() == check(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


def shaped(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Either a plausible value or any JSON at all, so odd shapes reach every branch."""
    return st.one_of(values, json_values)


odd_entries = st.fixed_dictionaries(
    {
        "id": shaped(st.sampled_from(["a", "b"])),
        "type": shaped(st.sampled_from(["message", "event", "ishiki.compact"])),
        "turnId": shaped(st.sampled_from(["t", "u"])),
        "data": shaped(
            st.fixed_dictionaries(
                {
                    "type": shaped(st.sampled_from(["turn.start", "turn.done", "x"])),
                    "role": shaped(st.sampled_from(["assistant", "tool", "custom"])),
                    "lastEntryId": shaped(st.sampled_from(["a", "b"])),
                    "toolCallId": shaped(st.just("c")),
                    "content": shaped(
                        st.lists(
                            st.fixed_dictionaries(
                                {
                                    "type": shaped(st.sampled_from(["tool-call", "tool-result"])),
                                    "toolCallId": shaped(st.just("c")),
                                }
                            ),
                            max_size=2,
                        )
                    ),
                    "toolCalls": shaped(st.lists(json_values, max_size=2)),
                }
            )
        ),
    }
)


@settings(max_examples=150, deadline=None)
@given(st.lists(odd_entries, max_size=12), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_odd_shapes_never_crash_the_checker(entries: list[Any], cuts: list[int]) -> None:
    data = b"".join(orjson.dumps(entry) + b"\n" for entry in entries)
    checker = LogChecker()
    for chunk in split(data, cuts):
        checker.feed(chunk)
    report = checker.report()
    assert report == check(data)
    assert report.entries == len(entries)
    assert LogChecker.from_state(checker.to_state()).report() == report
