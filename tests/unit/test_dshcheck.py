"""dsh-session log checks (core/dshcheck.py through LogChecker): examples of each rule."""

from __future__ import annotations

import orjson
import pytest

from syncd.core.logcheck import LogChecker
from syncd.core.logreport import Report
from tests.support.dsh_histories import HEADER, Record, ev, lines, result


def check(records: list[Record] | list[bytes]) -> Report:
    c = LogChecker()
    for r in records:
        c.feed(r if isinstance(r, bytes) else orjson.dumps(r) + b"\n")
    return c.report()


def kinds(report: Report) -> list[tuple[str, int]]:
    return [(p.kind.value, p.line) for p in report.problems]


def session(*events: Record) -> list[bytes]:
    return lines([dict(HEADER), *events])


CALL = ev("tool/call", turn=1, step=1, callId="c1", name="bash", arguments="{}")


def test_a_live_writer_mid_tool_call_is_clean_with_notes() -> None:
    r = check(session(ev("turn/start", turn=1), ev("step/start", turn=1, step=1), CALL))
    assert r.clean
    assert r.dsh is not None and r.dsh["tool_calls"] == 1 and r.dsh["open_step"] == 1
    assert any("tool call c1 (bash) at line 4 waits" in n for n in r.notes)
    assert any("dsh turn 1 in progress" in n for n in r.notes)


def test_a_whole_session_counts_turns_steps_and_calls() -> None:
    r = check(session(ev("turn/start", turn=1), ev("step/start", turn=1, step=1), CALL,
                      result(1, 1, "c1"), ev("step/end", turn=1, step=1),
                      ev("turn/end", turn=1, reason={"kind": "completed"})))
    assert r.clean and not r.notes
    assert r.dsh is not None
    assert (r.dsh["turns_started"], r.dsh["turns_ended"], r.dsh["steps"],
            r.dsh["tool_calls"], r.dsh["tool_results"]) == (1, 1, 1, 1, 1)


def test_packed_chunk_rows_count_their_members() -> None:
    row = {"type": "text-chunks", "time0": 1,
           "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 1], "texts": ["a", "b", "c"]}}
    r = check(session(ev("turn/start", turn=1), ev("step/start", turn=1, step=1), row,
                      ev("step/end", turn=1, step=1)))
    assert r.clean and r.dsh is not None and r.dsh["events"] == 6


def test_the_librarys_crash_repair_closers_are_healthy() -> None:
    r = check(session(ev("turn/start", turn=1), ev("step/start", turn=1, step=1), CALL,
                      result(1, 1, "c1", "TOOL_OUTCOME_UNKNOWN"),
                      result(1, 1, "c9", "TOOL_NOT_STARTED"), ev("step/end", turn=1, step=1),
                      ev("turn/end", turn=1, reason={"kind": "interrupted"})))
    assert r.clean


def test_an_ishiki_log_is_not_a_dsh_session() -> None:
    r = check([{"type": "event", "turnId": "t", "data": {"type": "turn.start"}}])
    assert r.dsh is None


@pytest.mark.parametrize(("events", "expected"), [
    ([ev("turn/start", turn=2)], [("turn_number", 2)]),
    ([ev("turn/end", turn=1, reason={})], [("outside_turn", 2)]),
    ([ev("turn/start", turn=1), ev("step/start", turn=1, step=2)], [("step_number", 3)]),
    ([ev("turn/start", turn=1), ev("step/start", turn=1, step=1),
      ev("turn/end", turn=1, reason={})], [("open_step", 4)]),
    ([ev("turn/start", turn=1), CALL], [("outside_step", 3)]),
    ([ev("turn/start", turn=1), ev("step/start", turn=1, step=1), result(1, 1, "c1")],
     [("tool_result_without_call", 4)]),
    ([ev("request/header", header={}, reason="initial")], [("outside_turn", 2)]),
    ([ev("turn/start", turn=1), ev("turn/start", turn=2)], [("open_turn", 2)]),
])
def test_damage_is_a_problem_at_its_line(events: list[Record],
                                          expected: list[tuple[str, int]]) -> None:
    assert kinds(check(session(*events))) == expected


def test_seq_rules() -> None:
    data = session(ev("turn/start", turn=1), ev("turn/end", turn=1, reason={}))
    swapped = [data[0], data[2], data[1]]
    assert ("seq_not_increasing", 3) in kinds(check(swapped))
    assert ("seq_gap", 2) in kinds(check([data[0], data[2]]))
    assert kinds(check(data[1:]))[:1] == [("missing_header", 1)]
    assert kinds(check([*data, data[0]])) == [("header_not_first", 4)]
    assert kinds(check([*data, b'{"x":1}\n'])) == [("not_event", 4)]
