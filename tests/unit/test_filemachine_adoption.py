"""Adoption (syncd/core/filemachine/adoption.py): its decisions driven directly (may it
start, superseding, when it is done, the answers), then through the machine as the shell
drives it (the operator's request, the archive, the fetch and the answers)."""

from __future__ import annotations

import pytest

from syncd.core.events import (
    AdoptDone,
    AdoptRequested,
    AppendFailed,
    Archive,
    Archived,
    Drained,
    Log,
    Look,
    PeerData,
    PeerPos,
    ScrubMismatch,
    Tick,
)
from syncd.core.filemachine import Mode, Tuning, adoption
from syncd.core.filemachine.state import Adoption, LogPeer
from syncd.core.frames import Announce, Data, Kind, Request
from syncd.core.ledger import Position, digest_of
from syncd.core.reconcile import PeerState
from syncd.core.records import Freeze
from tests.support.memfile import feed, live, sent

LINE = b'{"id": "1"}\n'
D = b"d" * 32


def test_a_reset_copy_cannot_be_adopted_and_the_answer_says_what_to_do() -> None:
    why = adoption.refusal("k/f", "k", "a", "b", LogPeer(Position(9, D), "reset"))
    assert why is not None and "reset" in why and "syncd adopt k --from b" in why
    assert adoption.refusal("k/f", "k", "a", "b", LogPeer(Position(9, D), "diverged")) is None
    assert adoption.refusal("k/f", "k", "a", "a", None) is None  # keep ours: always


def test_a_second_request_answers_the_first_and_goes_on_only_for_the_same_copy() -> None:
    ad = Adoption("b", "t1", archive="/x", ask=5, fresh=Position(3, D))
    kept, out = adoption.supersede(ad, "b", "t2", wall=1.0, name="k/f", same_source=True)
    assert kept is ad and ad.ticket == "t2" and ad.fresh is None and ad.ask == 1000
    assert out[0] == AdoptDone("t1", {"error": "superseded: a later request for the same "
                                               "copy takes it over"})
    assert isinstance(out[1], Log)
    other = Adoption("b", "t1", ask=5)
    kept, out = adoption.supersede(other, "c", "t2", wall=1.0, name="k/f", same_source=False)
    assert kept is None and isinstance(out[0], AdoptDone) and "c's copy" in str(out[0].result)


def test_done_only_on_a_position_announced_in_reply() -> None:
    ad = Adoption("b", "t", ask=7)
    here = Position(10, D)
    assert not adoption.done(ad, here)
    assert not adoption.answered(ad, "b", 6) and not adoption.answered(ad, "c", 7)
    assert adoption.answered(ad, "b", 7)
    ad.fresh = here
    assert adoption.done(ad, here) and not adoption.done(ad, Position(11, D))
    assert not adoption.answered(Adoption("b", "t"), "b", 0)  # not asked yet
    assert adoption.asks_again(Adoption("b", "t", ask=7), here, online=True)
    assert not adoption.asks_again(Adoption("b", "t", ask=7), here, online=False)
    assert not adoption.asks_again(ad, here, online=True)  # its answer describes us


def test_the_archive_says_why_and_the_answers_what() -> None:
    why = adoption.archive_reason(Freeze("reset", "file deleted", 1.0),
                                  {"c": Freeze("diverged", "other bytes", 1.0)}, "b")
    assert why == {"reason": "file deleted; diverged from c: other bytes", "adopted_from": "b"}
    assert adoption.archive_reason(None, {}, "b")["reason"] == "operator adopted another copy"
    assert adoption.finished("t", "f", None, 5) == AdoptDone("t", {"file": "f", "archive": None,
                                                                 "size": 5})
    assert adoption.first_ask(0.0) == 1 and adoption.first_ask(2.5) == 2500
    views = {"b": LogPeer(Position(40, D), None)}
    assert adoption.progress(Adoption("b", "t"), 10, views) == (10, 40)
    assert adoption.progress(None, 10, views) == (10, 0)


# --- through the machine ---------------------------------------------------------------------


def test_adopt_is_done_only_on_a_position_announced_in_reply_to_our_request() -> None:
    """#10 case 5: a retained (older) position of the winner does not finish an adoption."""
    m, f = live(LINE)
    winner = LINE + b'{"id": "w"}\n'
    feed(m, f, PeerPos("b", Announce(12, digest_of(winner[:12]), "diverged")))
    out = feed(m, f, AdoptRequested("b", "ticket"))
    assert any(isinstance(e, Archive) for e in out)
    f.data, f.inode = bytearray(), 3
    out = feed(m, f, Archived("archive/1"))
    request = sent(out, Kind.REQ)[0].payload
    assert isinstance(request, Request) and request.force and request.ask
    # The winner's old retained position says 12 bytes; we fetch them...
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, winner[:12])))
    feed(m, f, Drained())
    out = feed(m, f, PeerPos("b", Announce(12, digest_of(winner[:12]))))
    assert not any(isinstance(e, AdoptDone) for e in out)  # ...but that is not a reply
    feed(m, f, PeerData("b", Data(12, digest_of(winner[:12]), winner[12:])))
    feed(m, f, Drained())
    out = feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), None,
                                            request.ask)))
    done = [e for e in out if isinstance(e, AdoptDone)]
    assert done and done[0].result["size"] == len(winner) and m.mode is Mode.LIVE


def test_an_adoption_asks_again_until_an_answer_describes_the_copy_it_holds() -> None:
    """The winner's answer described another history than the bytes it served (its copy was
    re-described meanwhile): holding as much as it announced, we ask again, not wait forever."""
    m, f = live(LINE)
    feed(m, f, PeerPos("b", Announce(12, digest_of(b'{"id": "w"}\n'), "diverged")))
    feed(m, f, AdoptRequested("b", "ticket"))
    f.data, f.inode = bytearray(), 3
    ask = sent(feed(m, f, Archived("archive/1")), Kind.REQ)[0].payload.ask
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, LINE)))
    feed(m, f, Drained())
    out = feed(m, f, PeerPos("b", Announce(12, digest_of(b'{"id": "w"}\n'), None, ask)))
    assert not [e for e in out if isinstance(e, AdoptDone)] and m.mode is Mode.ADOPTING
    out = feed(m, f, Tick(), now=1.0 + Tuning().request_timeout)
    [again] = sent(out, Kind.REQ)
    assert again.payload.force and again.payload.ask == ask and again.payload.have == 12
    out = feed(m, f, PeerPos("b", Announce(12, digest_of(LINE), None, ask)), now=5.0)
    assert [e for e in out if isinstance(e, AdoptDone)] and m.mode is Mode.LIVE


def test_a_second_adoption_request_answers_the_first_and_adopts_the_copy_it_names() -> None:
    """Simulator seed 4001713: a request for another source while an adoption is under way
    used to leave the first requester waiting forever. It is answered (superseded), the
    copy taken so far is archived, and the new source's copy is fetched from byte 0."""
    m, f = live(LINE, peers=("b", "c"))
    other = b'{"id": "c"}\n'
    feed(m, f, PeerPos("b", Announce(12, digest_of(b'{"id": "w"}\n'), "diverged")))
    feed(m, f, PeerPos("c", Announce(len(other), digest_of(other), "diverged")))
    feed(m, f, AdoptRequested("b", "first"))
    f.data, f.inode = bytearray(), 3
    feed(m, f, Archived("archive/1"))
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, b'{"id": "w"}\n')))
    feed(m, f, Drained())
    out = feed(m, f, AdoptRequested("c", "second"))
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert done.ticket == "first" and "superseded" in done.result["error"]
    assert "c's copy instead of b's" in done.result["error"]
    assert any(isinstance(e, Archive) for e in out)  # the partial copy of b's is kept aside
    f.data, f.inode = bytearray(), 4
    out = feed(m, f, Archived("archive/2"))
    [request] = sent(out, Kind.REQ)
    assert request.to == "c" and request.payload.have == 0
    feed(m, f, PeerData("c", Data(0, Position.empty().digest, other)))
    feed(m, f, Drained())
    out = feed(m, f, PeerPos("c", Announce(len(other), digest_of(other), None,
                                            request.payload.ask)))
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert done.ticket == "second" and done.result["size"] == len(other)
    assert bytes(f.data) == other and m.mode is Mode.LIVE


def test_asking_again_for_the_same_copy_takes_the_adoption_over_without_starting_over(
) -> None:
    """An operator re-runs `syncd adopt` after a stalled one: the first request is answered,
    the bytes taken so far stay, and only an answer to the new request ends the adoption."""
    m, f = live(LINE)
    winner = b'{"id": "w"}\n' + LINE
    feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), "diverged")))
    feed(m, f, AdoptRequested("b", "first"))
    f.data, f.inode = bytearray(), 3
    first_ask = sent(feed(m, f, Archived("archive/1")), Kind.REQ)[0].payload.ask
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, winner[:12])))
    feed(m, f, Drained())
    out = feed(m, f, AdoptRequested("b", "second"))
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert done.ticket == "first" and "superseded" in done.result["error"]
    assert not any(isinstance(e, Archive) for e in out) and bytes(f.data) == winner[:12]
    assert m.adoption is not None and m.adoption.ask > first_ask
    feed(m, f, PeerData("b", Data(12, digest_of(winner[:12]), winner[12:])))
    feed(m, f, Drained())
    # An answer to the first request does not end the second...
    out = feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), None, first_ask)))
    assert not any(isinstance(e, AdoptDone) for e in out) and m.mode is Mode.ADOPTING
    out = feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), None,
                                            m.adoption.ask)))
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert done.ticket == "second" and done.result["size"] == len(winner)


def test_a_local_writer_during_an_adoption_ends_it_with_an_error() -> None:
    m, f = live(LINE)
    winner = LINE + b'{"id": "w"}\n'
    feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), "diverged")))
    feed(m, f, AdoptRequested("b", "ticket"))
    f.data, f.inode = bytearray(), 3
    feed(m, f, Archived("archive/1"))
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, LINE)))
    feed(m, f, Drained())
    out = feed(m, f, AppendFailed("concurrent", "size 30, expected 12"))
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert "another process wrote" in done.result["error"]
    assert m.mode is Mode.FROZEN and m.adoption is None


@pytest.mark.parametrize("found_by", ["look", "scrub"])
def test_an_edit_during_an_adoption_ends_it_and_no_peer_stays_in_sync_over_it(
        found_by: str) -> None:
    """Seed 2007537: an adopting copy served what it took (c holds it, in_sync), the source
    never answered, and an operator edited the bytes taken so far. The adoption ends with an
    error and the copy is judged again as a live one: c is not in_sync over bytes we lost."""
    m, f = live(LINE, peers=("b", "c"))
    winner = LINE + b'{"id": "w"}\n'
    feed(m, f, PeerPos("b", Announce(len(winner), digest_of(winner), "diverged")))
    feed(m, f, AdoptRequested("b", "ticket"))
    f.data, f.inode = bytearray(), 3
    feed(m, f, Archived("archive/1"))
    feed(m, f, PeerData("b", Data(0, Position.empty().digest, LINE)))
    feed(m, f, Drained())
    feed(m, f, PeerPos("c", Announce(len(LINE), digest_of(LINE))))
    assert m.mode is Mode.ADOPTING and m.peers["c"].state is PeerState.IN_SYNC
    f.data[3] = ord("E")  # the operator's edit of a byte we took (and c holds)
    f.mtime += 1
    if found_by == "look":
        out = feed(m, f, Look(), now=2.0)
    else:
        f.write(b'{"id": "bot"}\n')  # grown too: a look sees growth only; the scrub finds it
        out = feed(m, f, ScrubMismatch(), now=2.0)
    [done] = [e for e in out if isinstance(e, AdoptDone)]
    assert "error" in done.result
    assert m.mode is Mode.LIVE and m.adoption is None
    assert m.position.digest != digest_of(LINE)  # the edited bytes are announced as ours
    feed(m, f, PeerPos("c", Announce(len(LINE), digest_of(LINE))), now=3.0)
    assert m.peers["c"].state is PeerState.DIVERGED
