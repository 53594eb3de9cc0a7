"""Locating a divergence (syncd/core/filemachine/locating.py), driven directly: a Locator
against two in-memory copies, probes and answers passed by hand, no machine, no sockets."""

from __future__ import annotations

from syncd.core.events import FindLine, LineFound, ReadPlan, Send
from syncd.core.filemachine import serving
from syncd.core.filemachine.locating import Locator, with_line
from syncd.core.filemachine.state import LOCATE_RETRY
from syncd.core.frames import Kind, Probe, Probed, ProbeWhat
from syncd.core.ledger import BLOCK, Ledger
from syncd.core.records import Freeze
from tests.support.memfile import MemFile

LINE = b'{"id": "%05d"}\n'


def ledger_of(data: bytes) -> Ledger:
    ledger = Ledger()
    ledger.extend(data)
    return ledger


def answer(theirs: bytes, probe: Probe) -> Probed:
    """What the peer holding `theirs` answers (as serving.answer_probe does there)."""
    ledger, f = ledger_of(theirs), MemFile(theirs)
    plan = serving.probe_plan(ledger, probe) if probe.what is ProbeWhat.BYTES else ReadPlan()
    return serving.answer_probe(ledger, probe, f.read(plan), sums=4)


def locate(ours: bytes, theirs: bytes) -> tuple[Freeze, int]:
    """Run probes until the first differing byte is found; (the freeze, probes sent)."""
    loc, found = Locator(), Freeze("diverged", "differs", 1.0, peer="b", offset=0)
    out = loc.locate("b", found, knows=True, now=1.0, sums=4)
    assert len(out) == 1 and isinstance(out[0], Send) and out[0].kind is Kind.PROBE
    probe = out[0].payload
    sent = 1
    ledger, f = ledger_of(ours), MemFile(ours)
    while True:
        assert isinstance(probe, Probe)
        p = answer(theirs, probe)
        assert loc.asked("b", p)
        plan = ReadPlan(((p.start, p.start + len(p.data)),))
        effect, located = loc.narrow("b", p, ledger.chain, f.read(plan), found, sums=4)
        if located is not None:
            assert isinstance(effect, FindLine) and effect.offset == located.offset
            return located, sent
        assert isinstance(effect, Send)
        probe, sent = effect.payload, sent + 1


def test_the_first_differing_byte_is_found_through_block_digests_then_bytes() -> None:
    common = b"".join(LINE % i for i in range(9 * BLOCK // 16))
    at = len(common) + 3
    ours, theirs = common + b'{"ix": 1}\n', common + b'{"id": 2}\n'
    found, sent = locate(ours, theirs)
    assert found.offset == at
    assert found.ours == '{"ix": 1}' and found.theirs == '{"id": 2}'
    assert sent >= 3  # 9 full blocks, 4 sums a frame: sums, sums, sums, then the bytes


def test_one_copy_ending_where_the_other_goes_on_is_located_at_its_end() -> None:
    ours = b"".join(LINE % i for i in range(10))
    found, _ = locate(ours, ours + b"more\n")
    assert found.offset == len(ours)


def test_only_the_answer_to_the_last_probe_is_read() -> None:
    loc = Locator()
    loc.probe("b", ProbeWhat.SUMS, 8, 4)
    assert loc.asked("b", Probed(ProbeWhat.SUMS, 8, 100 * BLOCK, b""))
    assert not loc.asked("b", Probed(ProbeWhat.SUMS, 4, 100 * BLOCK, b""))  # a late one
    assert not loc.asked("b", Probed(ProbeWhat.BYTES, 8, 100 * BLOCK, b""))  # another kind
    assert not loc.asked("c", Probed(ProbeWhat.SUMS, 8, 100 * BLOCK, b""))  # never asked
    # Cut to the end of its copy (3 blocks): still the answer to ours.
    assert loc.asked("b", Probed(ProbeWhat.SUMS, 3, 3 * BLOCK, b""))


def test_a_refusal_is_resent_with_each_retry_until_the_peer_knows() -> None:
    loc = Locator()
    found = Freeze("diverged", "differs", 1.0, peer="b", offset=10, line=1)
    refusal = loc.refuse("b", 10, b"d" * 32)
    assert loc.wants("b", found, knows=False) and not loc.wants("b", found, knows=True)
    out = loc.locate("b", found, knows=False, now=5.0, sums=4)
    assert out == [Send(Kind.REFUSE, refusal, to="b")]  # the line is known: no probe
    assert not loc.due("b", 5.0 + LOCATE_RETRY - 0.1) and loc.due("b", 5.0 + LOCATE_RETRY)
    assert loc.retry_at("b") == 5.0 + LOCATE_RETRY
    assert loc.locate("b", found, knows=True, now=11.0, sums=4) == []


def test_forgetting_a_peer_drops_all_that_was_kept_for_it() -> None:
    loc = Locator()
    loc.refuse("b", 1, b"x")
    loc.refuse("c", 1, b"x")
    loc.locate("b", None, knows=False, now=1.0, sums=4)
    loc.forget("b")
    assert "b" not in loc.refusals and "b" not in loc.locating and "b" not in loc.probing
    assert "c" in loc.refusals
    loc.clear()
    assert not (loc.refusals or loc.locating or loc.probing)
    assert loc.due("b", 0.0)  # never asked: due at once


def test_a_line_number_is_kept_only_for_the_offset_it_was_asked_for() -> None:
    found = Freeze("diverged", "differs", 1.0, peer="b", offset=40)
    assert with_line(found, LineFound("b", 40, 3)) == Freeze(
        "diverged", "differs", 1.0, peer="b", offset=40, line=3)
    assert with_line(found, LineFound("b", 41, 3)) is None  # an older search
    assert with_line(None, LineFound("b", 40, 3)) is None
