"""READY over generated dsh-session histories (issue #27): yes at every record boundary a
healthy writer passes through, no (naming the record) for every damage.

Histories are tests/support/dsh_histories.py's, written as `session.jsonl` (a line per record)
and as `session.jsonl.zstd` (a frame per batch of records, as the JSONL backend writes them).
For every record-boundary prefix (a line, or a whole frame) the log checks find no problem and
`readiness.decide` says READY for a copy in sync with its writer: an open turn, a step under
way, a tool call waiting for its result are notes. For each damage the answer is no, and the
reason names the damaged line (in a frames file, the line of the decompressed stream).
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncd.core.framecheck import FrameChecker, checker_for
from syncd.core.logcheck import LogChecker
from syncd.core.readiness import decide
from tests.support import zstd
from tests.support.dsh_histories import DAMAGES, Record, histories, lines
from tests.unit.test_ready_property import in_sync

EXAMPLES = 400


def frames(data: list[bytes], cuts: list[int]) -> list[bytes]:
    """The lines as frames: a batch ends after each line whose index is in `cuts`."""
    out, batch = [], b""
    for i, line in enumerate(data):
        batch += line
        if i == 0 or i in cuts or i == len(data) - 1:  # the header is a frame of its own
            out.append(zstd.frame(batch))
            batch = b""
    return out


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.lists(st.integers(0, 200), max_size=20), st.booleans())
def test_every_record_boundary_prefix_is_ready(records: list[Record], cuts: list[int],
                                               compressed: bool) -> None:
    pieces = frames(lines(records), cuts) if compressed else lines(records)
    checker = FrameChecker() if compressed else LogChecker()
    size = 0
    for n, piece in enumerate(pieces, start=1):
        checker.feed(piece)
        size += len(piece)
        report = checker.report()
        verdict = decide(in_sync(report, size))
        assert report.clean and verdict.ready, (n, verdict.not_ready, report.problems)
        assert report.dsh is not None
    # The saved state carries the trace: a restored checker reports the same.
    kind = "zstd-frames" if compressed else "jsonl-lines"
    again = type(checker).from_state(checker.to_state())  # type: ignore[attr-defined]
    assert again.report() == checker.report()
    assert type(checker_for(kind)) is type(checker)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.integers(0, len(DAMAGES) - 1), st.integers(0, 1 << 16), st.booleans())
def test_every_damage_is_not_ready_and_named(records: list[Record], which: int, pick: int,
                                             compressed: bool) -> None:
    damage = DAMAGES[which](records, pick)
    if damage is None:
        return
    checker = FrameChecker() if compressed else LogChecker()
    data = frames(damage.data, []) if compressed else damage.data
    for piece in data:
        checker.feed(piece)
    report = checker.report()
    verdict = decide(in_sync(report, sum(map(len, data))))
    assert not verdict.ready, damage.name
    at = [p.line for p in report.problems if p.kind == damage.kind]
    assert damage.line in at, (damage.name, damage.line,
                               [(p.kind.value, p.line, p.message) for p in report.problems])
    reason = next(r for r in verdict.not_ready if r.startswith("log check found"))
    named = re.search(rf"{damage.kind} \d+ \(at lines? ([\d, .]+)\)", reason)
    assert named is not None, reason
    if at.index(damage.line) < 3:
        assert damage.line in [int(n) for n in re.findall(r"\d+", named.group(1))], reason


def test_every_damage_applies_to_some_history() -> None:
    """Each damage has a place in a history with two turns of two steps with tool calls."""
    from tests.support.dsh_histories import HEADER, ev, result
    records: list[Record] = [dict(HEADER)]
    for turn in (1, 2):
        records.append(ev("turn/start", turn=turn))
        for step in (1, 2):
            records += [ev("step/start", turn=turn, step=step),
                        ev("tool/call", turn=turn, step=step, callId=f"c{turn}{step}",
                           name="bash", arguments="{}"),
                        result(turn, step, f"c{turn}{step}"),
                        ev("step/end", turn=turn, step=step)]
        records.append(ev("turn/end", turn=turn, reason={"kind": "completed"}))
    for damage in DAMAGES:
        assert damage(records, 3) is not None, damage.__name__
