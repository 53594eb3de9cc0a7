"""topics.py and topicnames.py: positions under one keyed level (`[mqtt] hide_names`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from paho.mqtt.client import topic_matches_sub

from syncd.config import load_config
from syncd.core import frames, sealed
from syncd.core.frames import Announce, Channel, Frame, FrameError, Item, Kind
from syncd.core.pairkeys import PairKeys
from syncd.core.topicnames import PositionTopics, names_secret
from tests.support.cluster import node_identity

P = "syncd"
A = node_identity("a")
SECRET = names_secret(A.key)
POS = Announce(120, hashlib.sha256(b"x").digest())
NAMES = [("bot-1", "events.jsonl"), ("onebot_123/group 456", "session.jsonl.zstd"),
         ("cross_大厅", "events.jsonl"), ("x" * 300, "y.jsonl"), ("a", "bc"), ("ab", "c")]


def position(key: str = "bot-1", file: str = "events.jsonl") -> Frame:
    return Frame("a", 5, 3, 1, (Item(Kind.POS, POS, key, file),))


def test_a_keyed_level_is_one_short_opaque_level_safe_on_every_broker() -> None:
    levels = {frames.keyed_level(SECRET, k, f) for k, f in NAMES}
    assert len(levels) == len(NAMES)  # ("a", "bc") and ("ab", "c") differ too
    for (k, f), lvl in zip(NAMES, [frames.keyed_level(SECRET, k, f) for k, f in NAMES],
                           strict=True):
        assert re.fullmatch(r"~k[0-9a-f]{32}", lvl)
        assert len(lvl) <= frames.LEVEL_MAX  # and no '.', space, '+', '#', '/' (NATS, MQTT)
        if len(k) > 3:  # the names, raw or as levels, are not in it
            assert k.encode().hex()[:8] not in lvl and frames.level(k)[:8] not in lvl
        assert frames.name_of_level(lvl) is None
        assert frames.keyed_level(SECRET, k, f) == lvl  # the same every time
    # Another host's secret gives other levels: nobody else can recompute them.
    other = names_secret(node_identity("b").key)
    assert frames.keyed_level(other, "bot-1", "events.jsonl") != frames.keyed_level(
        SECRET, "bot-1", "events.jsonl")


def test_the_secret_comes_from_the_identity_and_survives_a_restart() -> None:
    assert names_secret(node_identity("a").key) == SECRET  # the same key file, read again
    assert len(SECRET) == 32 and names_secret(node_identity("a", "2").key) != SECRET


def test_position_topics_in_either_form() -> None:
    plain = PositionTopics(P, "a", A.key, hide=False)
    hidden = PositionTopics(P, "a", A.key, hide=True)
    assert plain.of("bot-1", "events.jsonl") == frames.position_topic(
        P, "a", "bot-1", "events.jsonl")
    topic = hidden.of("bot-1", "events.jsonl")
    assert topic == f"{P}/p/a/{frames.keyed_level(SECRET, 'bot-1', 'events.jsonl')}"
    assert "bot-1" not in topic and "events" not in topic and "~mv3gk" not in topic
    assert hidden.of("bot-1", "events.jsonl") is topic  # made once
    hidden.drop("bot-1", "events.jsonl")
    assert hidden.of("bot-1", "events.jsonl") == topic


def test_a_keyed_topic_parses_and_only_a_well_formed_one() -> None:
    topic = frames.keyed_position_topic(P, "a", SECRET, "bot-1", "events.jsonl")
    route = frames.parse_topic(P, topic)
    assert route.channel is Channel.POSITION and route.sender == "a" and route.keyed
    assert not frames.parse_topic(P, frames.position_topic(P, "a", "k", "f")).keyed
    for bad in ["~k" + "0" * 31, "~k" + "0" * 33, "~k" + "A" * 32, "~kzz" + "0" * 30,
                "k" + "0" * 33, "bot-1", "~~" + "0" * 32]:
        with pytest.raises(FrameError, match="neither a key and a file nor a keyed level"):
            frames.parse_topic(P, f"{P}/p/a/{bad}")
    with pytest.raises(FrameError, match="3 or 2 levels"):
        frames.parse_topic(P, f"{P}/p/a")


def test_subscriptions_hear_both_forms_of_peers_and_our_own_other_form() -> None:
    for hide in (False, True):
        subs = frames.subscriptions(P, "b", ["a", "b"], hide)

        def heard(topic: str, subs: list[str] = subs) -> bool:
            return any(topic_matches_sub(s, topic) for s in subs)

        assert heard(frames.position_topic(P, "a", "bot-1", "events.jsonl"))
        assert heard(frames.keyed_position_topic(P, "a", SECRET, "bot-1", "events.jsonl"))
        ours_plain = frames.position_topic(P, "b", "bot-1", "events.jsonl")
        ours_keyed = frames.keyed_position_topic(P, "b", SECRET, "bot-1", "events.jsonl")
        # The form we publish never comes back (no echo per retained position); the other
        # one brings back only what a run with the other setting left, to be cleared.
        assert heard(ours_plain) == hide and heard(ours_keyed) == (not hide)
        for topic, stale in ((ours_plain, hide), (ours_keyed, not hide)):
            route = frames.parse_topic(P, topic)
            assert frames.own_stale_position(route, "b", hide) == stale
        # Not the broker check's probes, one level deeper than any position.
        assert not heard(f"{P}/p/b/syncd-check/0123abcd/retained")
        assert not heard(f"{P}/p/a/syncd-check/0123abcd/retained")
    assert not frames.own_stale_position(
        frames.parse_topic(P, frames.keyed_position_topic(P, "a", SECRET, "k", "f")), "b", False)


def test_a_signed_keyed_position_takes_its_names_from_the_body_and_stays_put() -> None:
    topic = frames.keyed_position_topic(P, "a", SECRET, "bot-1", "events.jsonl")
    raw = frames.encode(position(), A, topic)
    got = frames.decode(frames.parse_topic(P, topic), raw, "a", 1 << 20, A.key.public_key(),
                        topic)
    assert got.items[0].key == "bot-1" and got.items[0].file == "events.jsonl"
    # Moved to another keyed level, or to the plain topic of another file: refused.
    for moved in (frames.keyed_position_topic(P, "a", SECRET, "bot-2", "events.jsonl"),
                  frames.position_topic(P, "a", "bot-2", "events.jsonl")):
        with pytest.raises(FrameError, match="bad signature"):
            frames.decode(frames.parse_topic(P, moved), raw, "a", 1 << 20,
                          A.key.public_key(), moved)
    # A plain topic still has to name the body's key and file.
    plain = frames.position_topic(P, "a", "bot-2", "events.jsonl")
    with pytest.raises(FrameError, match="another key or file"):
        frames.decode(frames.parse_topic(P, plain), frames.encode(position(), A, plain), "a",
                      1 << 20, A.key.public_key(), plain)


def test_a_sealed_keyed_position_opens_and_cannot_be_moved() -> None:
    a, b = PairKeys("a", 5, A.key), PairKeys("b", 6, node_identity("b").key)
    a.learn("b", 6, node_identity("b").key.public_key(), b.run_public)
    b.learn("a", 5, A.key.public_key(), a.run_public)
    topic = frames.keyed_position_topic(P, "a", SECRET, "bot-1", "events.jsonl")
    pair = a.sending("b")
    assert pair is not None
    raw = sealed.encode(position(), topic, [("b", *pair)])
    assert b"bot-1" not in raw and b"events" not in raw

    def open_on(t: str) -> Frame:
        return sealed.decode(frames.parse_topic(P, t), raw, "a", 1 << 20, t, "b", 6,
                             lambda e: b.receiving("a", e))

    assert open_on(topic) == position()
    with pytest.raises(FrameError, match="bad seal"):
        open_on(frames.keyed_position_topic(P, "a", SECRET, "bot-1", "other.jsonl"))


def test_hide_names_in_the_config(tmp_path: Path) -> None:
    base = f'node = "a"\nruntimes_dir = "{tmp_path}"\nstate_dir = "{tmp_path}/s"\n[mqtt]\n'
    path = tmp_path / "syncd.toml"
    path.write_text(base)
    assert load_config(path).mqtt.hide_names is False
    path.write_text(base + "hide_names = true\n")
    assert load_config(path).mqtt.hide_names is True
