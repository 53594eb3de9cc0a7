from __future__ import annotations

from syncd.frames import Kind, Stamp
from syncd.freshness import ReplayGuard


def test_frames_of_the_current_session_in_order_are_accepted_once() -> None:
    g = ReplayGuard()
    assert g.check(Kind.NODE, "a", "", "", Stamp("s1", 0, 1000)) is None
    assert g.check(Kind.LIVE, "a", "k", "f", Stamp("s1", 1, 1001)) is None
    assert g.check(Kind.REQ, "a", "k", "f", Stamp("s1", 2, 1001)) is None
    assert "already seen" in str(g.check(Kind.LIVE, "a", "k", "f", Stamp("s1", 1, 1001)))
    assert "already seen" in str(g.check(Kind.REQ, "a", "k", "f", Stamp("s1", 2, 5000)))


def test_frames_of_an_old_session_are_refused_after_a_restart() -> None:
    g = ReplayGuard()
    g.check(Kind.NODE, "a", "", "", Stamp("old", 0, 1000))
    g.check(Kind.LIVE, "a", "k", "f", Stamp("old", 5, 1001))
    assert g.check(Kind.NODE, "a", "", "", Stamp("new", 0, 2000)) is None  # restarted
    assert g.check(Kind.LIVE, "a", "k", "f", Stamp("new", 1, 2001)) is None  # seq starts over
    assert "session" in str(g.check(Kind.LIVE, "a", "k", "f", Stamp("old", 6, 1002)))
    # A replayed old presence cannot switch back to the old session.
    assert "older" in str(g.check(Kind.NODE, "a", "", "", Stamp("old", 0, 1000)))


def test_unknown_sender_is_refused_until_its_presence_arrives() -> None:
    g = ReplayGuard()
    assert "session" in str(g.check(Kind.FILL, "b", "k", "f", Stamp("s", 1, 1)))


def test_the_will_supersedes_its_own_presence_but_not_a_later_one() -> None:
    g = ReplayGuard()
    g.check(Kind.NODE, "a", "", "", Stamp("s1", 0, 1000))  # online
    assert g.check(Kind.NODE, "a", "", "", Stamp("s1", 1, 1001)) is None  # its will: offline
    g.check(Kind.NODE, "a", "", "", Stamp("s2", 0, 3000))  # back online
    assert g.check(Kind.NODE, "a", "", "", Stamp("s1", 1, 1001)) is not None  # replayed will


def test_positions_only_move_forward_in_time() -> None:
    g = ReplayGuard()
    assert g.check(Kind.POS, "a", "k", "f", Stamp("s", 3, 2000)) is None
    assert g.check(Kind.POS, "a", "k", "f", Stamp("s", 3, 2000)) is None  # retained again
    assert g.check(Kind.POS, "a", "k", "f", Stamp("s", 9, 1500)) is not None
    assert g.check(Kind.POS, "a", "k", "other", Stamp("s", 9, 1500)) is None
