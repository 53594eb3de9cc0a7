from __future__ import annotations

from syncd.core.frames import Channel, Frame, Item, Kind, Presence
from syncd.core.freshness import ReplayGuard

ALL = "p/a/a"


def presence(online: bool, epoch: int, conn: int) -> Frame:
    return Frame("a", epoch, 0, 0, (Item(Kind.NODE, Presence(online)),), conn=conn)


def batch(epoch: int, seq: int, conn: int = 1) -> Frame:
    return Frame("a", epoch, seq, 0, (), conn=conn)


def test_batches_of_the_newest_run_in_order_are_accepted_once() -> None:
    g = ReplayGuard()
    assert g.check(Channel.PRESENCE, "n", presence(True, 5, 1)).reason is None
    assert g.check(Channel.ALL, ALL, batch(5, 1)).reason is None
    assert g.check(Channel.TO, "t", batch(5, 2)).reason is None
    assert "already seen" in str(g.check(Channel.ALL, ALL, batch(5, 1)).reason)
    assert "already seen" in str(g.check(Channel.TO, "t", batch(5, 2)).reason)


def test_an_earlier_run_is_refused_whatever_the_clocks_said() -> None:
    g = ReplayGuard()
    g.check(Channel.PRESENCE, "n", presence(True, 5, 1))
    g.check(Channel.ALL, ALL, batch(5, 9))
    # Restarted: epoch 6 (its clock may now be behind: timestamps play no part).
    assert g.check(Channel.PRESENCE, "n", presence(True, 6, 1)).reason is None
    assert g.check(Channel.ALL, ALL, batch(6, 1)).reason is None  # seq starts over
    assert "earlier run" in str(g.check(Channel.ALL, ALL, batch(5, 10)).reason)
    # A replayed old presence cannot switch back to the old run.
    assert g.check(Channel.PRESENCE, "n", presence(False, 5, 1)).reason is not None


def test_the_will_ends_its_own_connection_but_not_a_later_one() -> None:
    g = ReplayGuard()
    assert g.check(Channel.PRESENCE, "n", presence(True, 5, 1)).online is True
    assert g.check(Channel.PRESENCE, "n", presence(False, 5, 1)).online is False  # its will
    assert g.check(Channel.PRESENCE, "n", presence(True, 5, 2)).online is True  # reconnected
    assert g.check(Channel.PRESENCE, "n", presence(False, 5, 1)).reason is not None  # replay


def test_a_newer_connection_proves_the_sender_online_despite_an_old_offline() -> None:
    g = ReplayGuard()
    # A restarting host is handed an old, authentic "offline" (replayed as retained) ...
    assert g.check(Channel.PRESENCE, "n", presence(False, 5, 1)).online is False
    # ... then a position from the live run: the sender is online.
    assert g.check(Channel.POSITION, "p1", batch(7, 3)).online is True
    # A position from the connection that the offline ended proves nothing.
    g2 = ReplayGuard()
    g2.check(Channel.PRESENCE, "n", presence(False, 5, 1))
    assert g2.check(Channel.POSITION, "p1", batch(5, 3)).online is None


def test_positions_only_move_forward() -> None:
    g = ReplayGuard()
    assert g.check(Channel.POSITION, "p1", batch(5, 3)).reason is None
    assert g.check(Channel.POSITION, "p1", batch(5, 3)).reason is None  # retained again
    assert g.check(Channel.POSITION, "p1", batch(5, 2)).reason is not None
    assert g.check(Channel.POSITION, "p1", batch(4, 99)).reason is not None
    assert g.check(Channel.POSITION, "p2", batch(5, 1)).reason is None  # its own order


def test_a_position_heard_batched_is_not_undone_by_an_older_retained_copy() -> None:
    g = ReplayGuard()
    assert g.newest_position("a", "k", "events.jsonl", 7, 100)  # batched, at once
    assert not g.newest_position("a", "k", "events.jsonl", 7, 90)  # retained, sealed earlier
    assert g.newest_position("a", "k", "other.jsonl", 7, 90)  # another file: its own order
    assert g.newest_position("a", "k", "events.jsonl", 8, 1)  # a new run of the sender


def test_a_position_from_an_earlier_run_than_the_senders_newest_is_refused() -> None:
    # Issue #23, case 11: an authentic retained position of run 5, re-published (with the
    # sender's broker login) after the sender's run 6 was heard, on a topic that has seen
    # nothing yet (this host just restarted, or the broker lost run 6's copy).
    g = ReplayGuard()
    assert g.check(Channel.PRESENCE, "n", presence(True, 6, 1)).reason is None
    assert "earlier run" in str(g.check(Channel.POSITION, "p1", batch(5, 3)).reason)
    assert g.check(Channel.POSITION, "p1", batch(6, 3)).reason is None
    # A position of a newer run is a new run: that run's positions and batches only, then.
    assert g.check(Channel.POSITION, "p2", batch(7, 1)).reason is None
    assert "earlier run" in str(g.check(Channel.POSITION, "p3", batch(6, 9)).reason)
    assert "earlier run" in str(g.check(Channel.ALL, ALL, batch(6, 10)).reason)


def test_the_newest_runs_outlive_a_restart_of_this_host() -> None:
    g = ReplayGuard()
    g.check(Channel.PRESENCE, "n", presence(True, 6, 1))
    kept = g.epochs()
    assert kept == {"a": 6}
    # Restarted, handed only what the broker retains, which that login may have replaced:
    # run 5's position and run 5's presence.
    again = ReplayGuard(kept)
    assert "earlier run" in str(again.check(Channel.POSITION, "p1", batch(5, 3)).reason)
    assert again.check(Channel.PRESENCE, "n", presence(False, 5, 1)).reason is not None
    assert again.check(Channel.POSITION, "p1", batch(6, 3)).reason is None
    # Without what was kept, the old position would have been taken (what the fix is for).
    assert ReplayGuard().check(Channel.POSITION, "p1", batch(5, 3)).reason is None
