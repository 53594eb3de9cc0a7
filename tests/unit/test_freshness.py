from __future__ import annotations

from syncd.core.frames import Channel, Frame, Item, Kind, Presence
from syncd.core.freshness import (
    ASK_RETRY,
    BEAT_INTERVAL,
    IDLE_BEAT,
    SLACK,
    STALE_AFTER,
    Confirmation,
    PeerStreams,
    ReplayGuard,
)

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


# --- PeerStreams: is what we know of a peer complete and recent? ------------------------------

T = 1_800_000_000.0


def confirmed_stream() -> PeerStreams:
    s = PeerStreams()
    s.frame("a", 5, 1, T)
    s.frame("a", 5, 2, T)
    s.restated("a", 1)  # its restatement began at lane 1, and every frame since reached us
    assert s.confirmation("a", T).confirmed
    return s


def test_a_peer_first_heard_is_asked_and_confirmed_by_a_whole_restatement() -> None:
    s = PeerStreams()
    s.frame("a", 5, 7, T)
    c = s.confirmation("a", T)
    assert c == Confirmation(False, T, "first heard: waiting for it to state its positions")
    assert s.asks_due(T, online={"a"}) == ["a"]
    assert s.asks_due(T + 0.1, online={"a"}) == []  # asked: not again at once
    assert "(asked again)" in str(s.confirmation("a", T).why)
    s.frame("a", 5, 8, T + 0.01)
    s.frame("a", 5, 9, T + 0.02)
    s.restated("a", 8)
    assert s.confirmation("a", T + 0.02).confirmed


def test_a_gap_is_doubt_until_a_restatement_after_it_arrives_whole() -> None:
    s = confirmed_stream()
    s.frame("a", 5, 6, T + 0.5)  # 3, 4 and 5 were dropped by the broker
    c = s.confirmation("a", T + 0.5)
    assert not c.confirmed and c.since == T + 0.5
    assert c.why is not None and c.why.startswith("3 of its frames did not reach us")
    assert s.asks_due(T + 0.5, online={"a"}) == ["a"]
    # A restatement that began before the gap (its first frames may be the lost ones) is not
    # enough; nor one whose own frames were cut by a new gap.
    s.frame("a", 5, 7, T + 0.6)
    s.restated("a", 4)
    assert not s.confirmation("a", T + 0.6).confirmed
    s.frame("a", 5, 9, T + 0.7)  # 8 lost: the restatement beginning at 8 ends here
    s.restated("a", 8)
    assert not s.confirmation("a", T + 0.7).confirmed
    s.frame("a", 5, 10, T + 0.8)
    s.frame("a", 5, 11, T + 0.9)
    s.restated("a", 10)
    assert s.confirmation("a", T + 0.9).confirmed


def test_silence_is_not_confirmation() -> None:
    s = confirmed_stream()
    assert s.confirmation("a", T + STALE_AFTER).confirmed
    c = s.confirmation("a", T + STALE_AFTER + 0.5)
    assert not c.confirmed and c.since == T
    assert c.why == "nothing heard from it for 1.2 s (a link or broker in trouble?)"
    # Frames after a silence may be old ones a broker held back (a partition that healed),
    # the next ones lost: only a restatement made after our ask confirms it again.
    s.frame("a", 5, 3, T + 2)
    assert s.confirmation("a", T + 2) == Confirmation(False, T, "nothing heard from it for 2.0 s")
    assert s.asks_due(T + 2, {"a"}) == ["a"]
    s.frame("a", 5, 4, T + 2.1)
    s.restated("a", 4)
    assert s.confirmation("a", T + 2.1).confirmed


def test_our_reconnection_doubts_every_peer_until_each_restates() -> None:
    s = confirmed_stream()
    s.frame("b", 1, 1, T)
    s.restated("b", 1)
    s.reconnected(T + 5, "12:00:05Z")
    for node in ("a", "b"):
        assert s.confirmation(node, T + 5).why == "we reconnected to the broker at 12:00:05Z"
    assert s.asks_due(T + 5, online={"a"}) == ["a"]  # only peers online are asked
    s.frame("a", 5, 3, T + 5.1)
    s.restated("a", 3)
    assert s.confirmation("a", T + 5.1).confirmed
    assert not s.confirmation("b", T + 5.1).confirmed


def test_an_unanswered_ask_is_sent_again() -> None:
    s = PeerStreams()
    s.frame("a", 5, 1, T)
    assert s.asks_due(T, {"a"}) == ["a"]
    assert s.asks_due(T + ASK_RETRY - 0.1, {"a"}) == []
    assert s.asks_due(T + ASK_RETRY, {"a"}) == ["a"]


def test_a_new_run_is_doubt_and_old_or_late_frames_say_nothing() -> None:
    s = confirmed_stream()
    s.frame("a", 5, 1, T + 1)  # late, or replayed: no gap, no news
    s.frame("a", 4, 9, T + 1)  # an earlier run
    assert s.confirmation("a", T + 0.5).confirmed
    s.frame("a", 6, 1, T + 2)
    assert s.confirmation("a", T + 2).why == ("it restarted: waiting for it to state its "
                                              "positions")
    assert s.confirmation("nobody", T) == Confirmation(False, None, "nothing heard from it yet")
    s.forget("a")
    assert not s.confirmation("a", T).confirmed


def test_publishes_of_ours_dropped_doubt_every_peer() -> None:
    s = confirmed_stream()
    s.doubt_all(T + 0.1, "3 publishes of ours were dropped (a congested link)")
    assert s.confirmation("a", T + 0.1) == Confirmation(
        False, T + 0.1, "3 publishes of ours were dropped (a congested link)")
    assert s.asks_due(T + 0.1, {"a"}) == ["a"]


def test_a_quiet_peer_promises_its_slower_pace_and_is_held_to_it() -> None:
    s = confirmed_stream()
    s.frame("a", 5, 3, T + 0.2, expect=IDLE_BEAT)  # a beat: "my next frame within 1 s"
    assert s.confirmation("a", T + 0.2 + IDLE_BEAT + SLACK).confirmed
    assert not s.confirmation("a", T + 0.3 + IDLE_BEAT + SLACK).confirmed
    s.frame("a", 5, 4, T + 1.4)  # a write: the fast pace again
    assert s.confirmation("a", T + 1.4 + STALE_AFTER).confirmed
    assert not s.confirmation("a", T + 1.5 + STALE_AFTER).confirmed
    assert STALE_AFTER == BEAT_INTERVAL + SLACK
