"""versions.py: which wire version a frame goes out in while a cluster is upgraded."""

from __future__ import annotations

from syncd.core import versions
from syncd.core.frames import Item, Kind, Presence


def test_a_presence_without_speaks_is_a_version_5_release() -> None:
    assert versions.spoken([]) == (5,)
    assert versions.spoken([6, 5, 6]) == (5, 6)


def test_the_highest_version_both_speak() -> None:
    assert versions.common((5,)) == 5
    assert versions.common((5, 6)) == 6
    assert versions.common((6, 7)) == 6
    assert versions.common((3, 4)) is None
    assert versions.common((7,)) is None


def test_a_frame_for_everyone_is_read_by_every_peer_online() -> None:
    assert versions.for_everyone([]) == 6  # nobody to read it: the newest
    assert versions.for_everyone([(5, 6), (5, 6)]) == 6
    assert versions.for_everyone([(5, 6), (5,)]) == 5  # one host not upgraded yet
    assert versions.for_everyone([(5, 6), (4,)]) == 6  # one that cannot read us anyway
    assert versions.for_everyone([(6, 7), (5, 6)]) == 6


def test_presence_carries_the_versions_to_a_version_5_reader() -> None:
    """The fields ride in the signed presence item; a version-5 release ignores them."""
    from syncd.core import frames
    from tests.support.cluster import node_identity

    topic = frames.presence_topic("P", "a")
    p = Presence(True, speaks=versions.SPEAKS, run_key=bytes(range(32)))
    raw = frames.encode(frames.Frame("a", 1, 1, 1, (Item(Kind.NODE, p),)), node_identity("a"),
                        topic)
    got = frames.decode(frames.parse_topic("P", topic), raw, "a", 1 << 20,
                        node_identity("a").key.public_key(), topic)
    assert got.items[0].payload == p
