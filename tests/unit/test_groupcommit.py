"""Group commit's decisions (core/groupcommit.py): when a file's changes are read and shipped."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.core.groupcommit import GroupCommit, cut


def test_a_change_with_nothing_in_flight_ships_at_once() -> None:
    g: GroupCommit[str] = GroupCommit()
    assert g.offer("a") is True
    assert g.offer("b") is True  # another file: its own commit, not behind a's
    assert g.counts.reads == 2 and g.counts.joined == 0


def test_changes_during_a_commit_go_together_in_the_next() -> None:
    g: GroupCommit[str] = GroupCommit()
    assert g.offer("a")
    assert [g.offer("a") for _ in range(5)] == [False] * 5
    assert g.waiting == 1
    assert g.done("a") is True  # the next commit starts at once, carrying all five
    assert g.counts.reads == 2 and g.counts.joined == 5 and g.counts.largest == 5
    assert g.done("a") is False  # nothing changed meanwhile: quiet
    assert g.in_flight == 0 and g.waiting == 0
    assert g.offer("a") is True  # quiet again: at once
    assert g.status()["changes_per_read"] == 2.33  # 7 notices, 3 reads


def test_done_for_a_commit_never_started_decides_nothing() -> None:
    g: GroupCommit[str] = GroupCommit()
    assert g.done("a") is False  # a look the sweep asked for, not the gate
    g.offer("a")
    g.offer("a")
    g.forget("a")  # no longer replicated
    assert g.in_flight == 0 and g.waiting == 0
    assert g.done("a") is False


# A run: offers and dones of a few files, in any order.
steps = st.lists(st.tuples(st.sampled_from(["offer", "done"]), st.sampled_from("abc")),
                 max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_no_change_is_ever_left_unshipped(run: list[tuple[str, str]]) -> None:
    """Whatever the order, a change is followed by a commit that starts after it, and at
    most one commit per file is in flight."""
    g: GroupCommit[str] = GroupCommit()
    flight: set[str] = set()
    unshipped: set[str] = set()  # changed since its last commit started
    at_offer = at_done = 0  # commits started by each
    for what, thing in run:
        if what == "offer":
            unshipped.add(thing)
            if g.offer(thing):
                assert thing not in flight
                flight.add(thing)
                unshipped.discard(thing)
                at_offer += 1
        elif thing in flight:  # a file's look ends only if one is under way
            flight.discard(thing)
            if g.done(thing):
                flight.add(thing)
                unshipped.discard(thing)
                at_done += 1
        assert g.in_flight == len(flight)
        # Whatever is unshipped is in flight: its commit's end starts the next one.
        assert unshipped <= flight
    # Let every commit end: nothing waits.
    while flight:
        thing = flight.pop()
        if g.done(thing):
            flight.add(thing)
            unshipped.discard(thing)
            at_done += 1
    assert not unshipped and g.waiting == 0
    c = g.counts
    assert c.changes == at_offer + c.joined and c.reads == at_offer + at_done


sizes = st.lists(st.integers(min_value=0, max_value=3000), max_size=200)


@settings(max_examples=300, deadline=None)
@given(sizes, st.integers(min_value=1, max_value=5000),
       st.one_of(st.none(), st.integers(min_value=1, max_value=20)))
def test_cut_keeps_every_record_in_order_within_the_bound(
        records: list[int], limit: int, max_items: int | None) -> None:
    runs = cut(records, limit, max_items)
    assert [i for r in runs for i in r] == list(range(len(records)))  # all, once, in order
    for r in runs:
        assert len(r) >= 1
        total = sum(records[i] for i in r)
        assert total <= limit or len(r) == 1  # only a record larger than the bound alone
        if max_items is not None:
            assert len(r) <= max_items


def test_cut_fills_each_run() -> None:
    assert cut([4, 4, 4, 9, 1], 8) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert cut([], 8) == []
    assert cut([1, 1, 1], 8, max_items=2) == [range(0, 2), range(2, 3)]


def test_the_metrics_count_reads_and_joined_changes() -> None:
    from syncd.ops import metrics

    status = {"connected": True, "rejected_frames": 0, "peers": {}, "files": [],
              "group_commit": {"reads": 7, "joined": 30}}
    found = {s.name: s.value for f in metrics.families(status) for s in f.samples}
    assert found["syncd_local_reads_total"] == 7
    assert found["syncd_local_changes_joined_total"] == 30
