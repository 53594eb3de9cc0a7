from __future__ import annotations

import contextlib
import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub

from syncd.core import frames
from syncd.core.frames import (
    Announce,
    Channel,
    Data,
    Frame,
    FrameError,
    Item,
    Kind,
    Presence,
    Probe,
    Probed,
    ProbeWhat,
    Refuse,
    Request,
)
from tests.support.cluster import node_identity as identity_of

P = "site/syncd"
D = bytes(range(32))
A = identity_of("a")
A_KEY = A.key.public_key()
POS_TOPIC = frames.position_topic(P, "a", "bot-1", "events.jsonl")
ALL_TOPIC = frames.all_topic(P, "a")
TO_TOPIC = frames.to_topic(P, "b", "a")


def frame(*items: Item, to: str = "") -> Frame:
    return Frame("a", 7, 12, 1793531049958, items, to, conn=2)


def enc(f: Frame, topic: str) -> bytes:
    return frames.encode(f, A, topic)


def dec(raw: bytes, topic: str, max_data: int = 1 << 20) -> Frame:
    return frames.decode(frames.parse_topic(P, topic), raw, "a", max_data, A_KEY, topic)


def item(kind: Kind, payload: frames.Payload, key: str = "bot-1") -> Item:
    return Item(kind, payload, key, "events.jsonl")


@pytest.mark.parametrize(
    ("topic", "f"),
    [
        (frames.presence_topic(P, "a"), frame(Item(Kind.NODE, Presence(True)))),
        (POS_TOPIC, frame(item(Kind.POS, Announce(123, D, None)))),
        (POS_TOPIC, frame(item(Kind.POS, Announce(0, D, "diverged", answers=3)))),
        (POS_TOPIC, frame(item(Kind.POS, Announce(9, D, None, diverged=("b", "host-c"))))),
        (ALL_TOPIC, frame(item(Kind.LIVE, Data(10, D, b'{"a":1}\n')),
                          item(Kind.LIVE, Data(0, D, b"x\n"), key="onebot_1/group 2"),
                          item(Kind.LIVE, Data(5, D, b"\xe5\xa4\xa7\n"), key="大厅"))),
        (TO_TOPIC, frame(item(Kind.FILL, Data(0, D, b"x" * 1000 + b"\n")),
                         item(Kind.REQ, Request(5, D, 5, 4096, force=True, ask=4)),
                         item(Kind.REFUSE, Refuse(7, D)),
                         item(Kind.PROBE, Probe(ProbeWhat.SUMS, 0, 16)),
                         item(Kind.PROBED, Probed(ProbeWhat.BYTES, 64, 900, b"abc")),
                         to="b")),
        # The numbered stream: a heartbeat, the end of a restatement, a request for one.
        (ALL_TOPIC, dataclasses.replace(frame(Item(Kind.BEAT, frames.Beat())), lane=41)),
        (ALL_TOPIC, dataclasses.replace(frame(Item(Kind.BEAT, frames.Beat(every_ms=1000))),
                                        lane=42)),
        (ALL_TOPIC, dataclasses.replace(frame(item(Kind.POS, Announce(9, D, None)),
                                              Item(Kind.BEAT, frames.Beat(40))), lane=41)),
        (TO_TOPIC, frame(Item(Kind.ASK, frames.Ask()), to="b")),
    ],
)
def test_batches_round_trip(topic: str, f: Frame) -> None:
    assert dec(enc(f, topic), topic) == f


def test_only_frames_on_the_batch_topic_are_numbered() -> None:
    raw = enc(dataclasses.replace(frame(Item(Kind.ASK, frames.Ask()), to="b"), lane=3), TO_TOPIC)
    with pytest.raises(FrameError, match="lane"):
        dec(raw, TO_TOPIC)
    raw = enc(frame(Item(Kind.BEAT, frames.Beat()), to="b"), TO_TOPIC)
    with pytest.raises(FrameError, match="wrong topic"):
        dec(raw, TO_TOPIC)


def test_another_key_altered_bytes_and_other_topics_are_rejected() -> None:
    raw = enc(frame(item(Kind.POS, Announce(10, D))), POS_TOPIC)
    other = identity_of("b").key.public_key()
    route = frames.parse_topic(P, POS_TOPIC)
    with pytest.raises(FrameError, match="signature"):
        frames.decode(route, raw, "a", 1 << 20, other, POS_TOPIC)
    altered = bytearray(raw)
    altered[-3] ^= 1
    with pytest.raises(FrameError, match="signature"):
        dec(bytes(altered), POS_TOPIC)
    # A valid frame replayed for another key (or file, sender, addressee) fails too.
    moved = frames.position_topic(P, "a", "bot-2", "events.jsonl")
    with pytest.raises(FrameError, match="signature"):
        dec(raw, moved)


def test_a_signed_frame_must_agree_with_its_topic() -> None:
    # Signed by a, but naming another key than its position topic: refused.
    raw = enc(frame(item(Kind.POS, Announce(10, D), key="bot-2")), POS_TOPIC)
    with pytest.raises(FrameError, match="another key"):
        dec(raw, POS_TOPIC)
    # An addressed batch whose header names another addressee than the topic.
    raw = enc(frame(item(Kind.REQ, Request(1, D, 1, 2)), to="c"), TO_TOPIC)
    with pytest.raises(FrameError, match="addressee"):
        dec(raw, TO_TOPIC)
    # Live bytes on an addressed topic, or a request for everyone: wrong topic.
    raw = enc(frame(item(Kind.REQ, Request(1, D, 1, 2))), ALL_TOPIC)
    with pytest.raises(FrameError, match="wrong topic"):
        dec(raw, ALL_TOPIC)


def test_names_become_safe_levels_and_come_back() -> None:
    for name in ["host-a", "main", "events.jsonl", "onebot_123/group_456", "x+y#z",
                 "onebot_123 456", "UPPER.lower", "cross_大厅",
                 "matrix_@bot_example.org_!room_example.org"]:
        lvl = frames.level(name)
        assert all(c.isascii() and (c.isalnum() or c in "_-~") for c in lvl), lvl
        assert frames.name_of_level(lvl) == name
    long = "长" * 40  # 120 bytes of UTF-8
    lvl = frames.level(long)
    assert lvl.startswith("~~") and len(lvl) <= frames.LEVEL_MAX
    assert frames.name_of_level(lvl) is None  # hashed: the name travels in the frame
    assert frames.level("abc") != frames.level("~abc") != frames.level("~~abc")


def test_topics_parse_and_subscriptions_cover_them() -> None:
    assert frames.parse_topic(P, POS_TOPIC) == frames.Route(
        Channel.POSITION, "a", key="bot-1", file=frames.level("events.jsonl"))
    assert frames.parse_topic(P, TO_TOPIC) == frames.Route(Channel.TO, "a", to="b")
    assert frames.parse_topic(P, ALL_TOPIC) == frames.Route(Channel.ALL, "a")
    subs = frames.subscriptions(P, "b", ["a", "b", "长"])
    far = frames.level("长")
    assert subs == [f"{P}/n/+", f"{P}/t/b/+", f"{P}/a/a", f"{P}/p/a/+/+", f"{P}/p/a/+",
                    f"{P}/a/{far}", f"{P}/p/{far}/+/+", f"{P}/p/{far}/+",
                    f"{P}/p/b/+"]  # ours under keyed levels: left by a run with hide_names

    def heard(topic: str) -> bool:
        return any(topic_matches_sub(sub, topic) for sub in subs)

    assert heard(POS_TOPIC) and heard(TO_TOPIC) and heard(ALL_TOPIC)
    assert heard(frames.presence_topic(P, "stranger"))  # refused by name, so it is seen
    # Our own batches and positions do not come back; nor does what is addressed to others.
    assert not heard(frames.all_topic(P, "b"))
    assert not heard(frames.position_topic(P, "b", "bot-1", "events.jsonl"))
    assert not heard(frames.to_topic(P, "a", "长"))
    assert not heard(frames.all_topic(P, "stranger"))


@pytest.mark.parametrize(
    "topic",
    [
        "other/p/a/k/f",
        f"{P}/p/a/k",
        f"{P}/p/a//f",
        f"{P}/nope/a",
        f"{P}/t/a",
        f"{P}/a/" + "x" * 200,
        f"{P}/live/a/k/events.jsonl",  # protocol 2
    ],
)
def test_hostile_topics_are_rejected(topic: str) -> None:
    with pytest.raises(FrameError):
        frames.parse_topic(P, topic)


def signed(rest: bytes, topic: str = ALL_TOPIC) -> bytes:
    """A frame with a valid signature around arbitrary content: what a listed peer could
    send by mistake, so validation after the signature still matters."""
    return frames.PREAMBLE + A.sign(frames.signed_part(topic, rest)) + rest


def head(h: object, body: bytes = b"") -> bytes:
    raw = orjson.dumps(h)
    return len(raw).to_bytes(4, "big") + raw + body


GOOD = {"v": frames.VERSION, "from": "a", "epoch": 1, "seq": 1, "ts": 1}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"garbage", "preamble"),
        (b"sd\x04" + bytes(40), "protocol version 4 frame; this host speaks versions 5 and 6"),
        (frames.PREAMBLE + b"short", "truncated"),
        (signed(b"\xff\xff\xff\xff{}"), "header length"),
        (signed(head([])), "not an object"),
        (signed(head({**GOOD, "v": 4, "items": []})), "version"),
        (signed(head({**GOOD, "from": "b", "items": []})), "another sender"),
        (signed(head({**GOOD, "items": []})), "items"),
        (signed(head({**GOOD, "items": [{"k": "live", "key": "k", "file": "f", "n": 5,
                                         "offset": 0, "base": D.hex()}]}, b"ab")),
         "past the end"),
        (signed(head({**GOOD, "items": [{"k": "live", "key": "../x", "file": "f", "n": 2,
                                         "offset": 0, "base": D.hex()}]}, b"ab")),
         "unusable name"),
        (signed(head({**GOOD, "items": [{"k": "live", "key": "k", "file": "f", "n": 2,
                                         "offset": -1, "base": D.hex()}]}, b"ab")),
         "offset"),
        (signed(head({**GOOD, "items": [{"k": "live", "key": "k", "file": "f", "n": 1,
                                         "offset": 0, "base": D.hex()}]}, b"ab")),
         "after the last item"),
        (signed(head({**GOOD, "epoch": "1", "items": [
            {"k": "live", "key": "k", "file": "f", "n": 1, "offset": 0, "base": D.hex()}]},
            b"a")), "epoch"),
    ],
)
def test_malformed_payloads_say_why(raw: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        dec(raw, ALL_TOPIC)


@pytest.mark.parametrize("bad", ["b", [1], ["x" * 201], [""], ["n"] * 1025])
def test_a_positions_divergences_must_be_a_short_list_of_names(bad: object) -> None:
    pos = {"k": "pos", "key": "bot-1", "file": "events.jsonl", "size": 1, "digest": D.hex(),
           "frozen": None, "diverged": bad}
    with pytest.raises(FrameError, match="'diverged'"):
        dec(signed(head({**GOOD, "items": [pos]}), POS_TOPIC), POS_TOPIC)


def test_oversized_data_is_rejected() -> None:
    raw = enc(frame(item(Kind.LIVE, Data(0, D, b"x" * 100 + b"\n"))), ALL_TOPIC)
    with pytest.raises(FrameError, match="exceeds"):
        dec(raw, ALL_TOPIC, max_data=50)


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=200))
def test_random_bytes_only_ever_raise_frame_error(raw: bytes) -> None:
    for payload in (raw, frames.PREAMBLE + raw, signed(raw)):
        with contextlib.suppress(FrameError):
            dec(payload, ALL_TOPIC)


@settings(max_examples=300, deadline=None)
@given(topic=st.text(max_size=80))
def test_random_topics_only_ever_raise_frame_error(topic: str) -> None:
    with contextlib.suppress(FrameError):
        frames.parse_topic(P, P + "/" + topic)


def test_resource_items_round_trip_on_their_channels() -> None:
    e = frames.ResEntry("artifacts/shake/shake-1.log", 5, D, 0, "")
    s = frames.ResEntry("artifacts/shake/shake-1.log.json", 9, D, 3, "a")
    res = frames.RESOURCES
    everyone = frame(Item(Kind.RSUM, frames.ResSum(D, 2), "bot-1", res),
                     Item(Kind.RHAVE, frames.res_have(False, (e, s)), "bot-1", res))
    assert dec(enc(everyone, ALL_TOPIC), ALL_TOPIC).items == everyone.items
    addressed = frame(Item(Kind.RLIST, frames.ResList(D), "bot-1", res),
                      Item(Kind.RHAVE, frames.res_have(True, (e,)), "bot-1", res),
                      Item(Kind.RREQ, frames.ResAsk(e.name, D, 0, 4096), "bot-1", res),
                      Item(Kind.RDATA, frames.ResChunk(e.name, D, 5, 0, b"abcde"), "bot-1", res),
                      Item(Kind.RREFUSE, frames.ResRefuse(e.name, D, None, "not held here"),
                           "bot-1", res),
                      to="b")
    assert dec(enc(addressed, TO_TOPIC), TO_TOPIC).items == addressed.items
    assert frames.channel_of(Kind.RHAVE) is frames.Channel.ALL
    assert frames.channel_of(Kind.RHAVE, "b") is frames.Channel.TO


@pytest.mark.parametrize(
    ("item", "body", "reason"),
    [
        ({"k": "rshiny", "key": "k", "file": "resources"}, b"", "unknown item kind 'rshiny'"),
        ({"k": "rreq", "key": "k", "file": "resources", "name": "../../etc/passwd",
          "digest": D.hex(), "offset": 0, "length": 1}, b"", "unusable resource name"),
        ({"k": "rreq", "key": "k", "file": "resources", "name": "/etc/passwd",
          "digest": D.hex(), "offset": 0, "length": 1}, b"", "absolute"),
        ({"k": "rhave", "key": "k", "file": "resources", "full": False, "n": 7}, b'[["a"]]',
         "manifest entry"),
        ({"k": "rhave", "key": "k", "file": "resources", "full": False, "n": 30},
         b'[["a/../b", 1, "' + D.hex().encode() + b'", 0, ""]]'[:30], "not JSON"),
        ({"k": "rdata", "key": "k", "file": "resources", "name": "a", "digest": D.hex(),
          "size": 1, "offset": 0, "n": 0}, b"", "without data"),
    ],
)
def test_malformed_resource_items_say_why(item: dict[str, object], body: bytes,
                                          reason: str) -> None:
    raw = signed(head({**GOOD, "to": "b", "items": [item]}, body), TO_TOPIC)
    with pytest.raises(FrameError, match=reason):
        dec(raw, TO_TOPIC)


def _rhave(body: bytes) -> bytes:
    item = {"k": "rhave", "key": "k", "file": "resources", "full": False, "n": len(body)}
    return signed(head({**GOOD, "to": "b", "items": [item]}, body), TO_TOPIC)


def test_a_manifest_item_is_bounded_before_it_is_parsed() -> None:
    """#23 case 2: a manifest item holds at most MAX_ENTRIES_PER_ITEM entries in at most
    MAX_ENTRIES_BODY bytes, and a body of tiny JSON values is refused before parsing (it
    would cost ~50 bytes of memory per value)."""
    entry = b'["a/%d", 1, "' + D.hex().encode() + b'", 0, ""]'
    ok = b"[" + b",".join(entry % i for i in range(frames.MAX_ENTRIES_PER_ITEM)) + b"]"
    assert len(dec(_rhave(ok), TO_TOPIC, max_data=16 << 20).items[0].payload.entries) == \
        frames.MAX_ENTRIES_PER_ITEM
    more = b"[" + b",".join(entry % i for i in range(frames.MAX_ENTRIES_PER_ITEM + 1)) + b"]"
    with pytest.raises(FrameError, match="at most 4096"):
        dec(_rhave(more), TO_TOPIC, max_data=16 << 20)
    with pytest.raises(FrameError, match="too many values"):
        dec(_rhave(b"[" + b",".join([b"0"] * 100_000) + b"]"), TO_TOPIC, max_data=16 << 20)
    with pytest.raises(FrameError, match="exceeds 2097152"):
        dec(_rhave(b" " * (3 << 20)), TO_TOPIC, max_data=16 << 20)


def test_a_resource_name_is_at_most_256_levels_deep() -> None:
    """#23: each level is a directory a peer's name makes us create ([resources] max_depth,
    at most 256, says how many a host takes: test_resources.py)."""
    assert frames.resource_name_problem("a/" * 255 + "f") is None
    assert frames.resource_name_problem("a/" * 256 + "f") == "more than 256 levels deep"
