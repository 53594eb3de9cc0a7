from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd import frames
from syncd.frames import Announce, Data, FrameError, Kind, Presence, Refuse, Request, Topic

P = "site/syncd"
D = bytes(range(32))


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (Kind.NODE, Presence(True)),
        (Kind.POS, Announce(123, D, None)),
        (Kind.POS, Announce(0, D, "diverged")),
        (Kind.LIVE, Data(10, D, b'{"a":1}\n')),
        (Kind.FILL, Data(0, D, b"x" * 1000 + b"\n")),
        (Kind.REQ, Request(5, D, 5, 4096)),
        (Kind.REFUSE, Refuse(7, D)),
    ],
)
def test_round_trip(kind: Kind, payload: frames.Payload) -> None:
    assert frames.decode(kind, frames.encode(payload), max_data=1 << 20) == payload


def test_topics_round_trip_and_subscriptions_cover_them() -> None:
    for t in [
        Topic(Kind.NODE, "a"),
        Topic(Kind.POS, "a", "bot-1", "events.jsonl"),
        Topic(Kind.LIVE, "a", "bot-1", "events.jsonl"),
        Topic(Kind.REQ, "b", "bot-1", "events.jsonl", to="a"),
        Topic(Kind.FILL, "b", "bot-1", "events.jsonl", to="a"),
    ]:
        text = frames.topic_for(P, t)
        assert frames.parse_topic(P, text) == t


@pytest.mark.parametrize(
    "topic",
    [
        "other/pos/a/k/events.jsonl",
        f"{P}/pos/a/../events.jsonl",
        f"{P}/pos/a/k/../../etc/passwd",
        f"{P}/pos/a/+/events.jsonl",
        f"{P}/pos/a/#",
        f"{P}/pos/a/k\x00/events.jsonl",
        f"{P}/pos/a/.hidden/events.jsonl",
        f"{P}/pos/a/k",
        f"{P}/nope/a/k/f",
        f"{P}/req/a/b/k",
    ],
)
def test_hostile_topics_are_rejected(topic: str) -> None:
    with pytest.raises(FrameError):
        frames.parse_topic(P, topic)


@pytest.mark.parametrize(
    ("kind", "raw", "reason"),
    [
        (Kind.POS, b"garbage", "preamble"),
        (Kind.POS, frames.PREAMBLE + b"\xff\xff\xff\xff{}", "header length"),
        (Kind.POS, frames.PREAMBLE + b"\x00\x00\x00\x02[]", "not an object"),
        (Kind.POS, frames.PREAMBLE + b'\x00\x00\x00\x16{"size":-1,"digest":1}', "size"),
        (Kind.REQ, frames.encode(Refuse(1, D)), "have"),
        (Kind.POS, frames.encode(Announce(1, D)) + b"extra", "unexpected bytes"),
        (Kind.LIVE, frames.encode(Data(0, D, b"x\n"))[:-2], "without data"),
    ],
)
def test_malformed_payloads_say_why(kind: Kind, raw: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        frames.decode(kind, raw, max_data=1 << 20)


def test_oversized_data_is_rejected() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        frames.decode(Kind.LIVE, frames.encode(Data(0, D, b"x" * 100 + b"\n")), max_data=50)


@settings(max_examples=500, deadline=None)
@given(kind=st.sampled_from(list(Kind)), raw=st.binary(max_size=200))
def test_random_bytes_only_ever_raise_frame_error(kind: Kind, raw: bytes) -> None:
    for payload in (raw, frames.PREAMBLE + raw):
        with contextlib.suppress(FrameError):
            frames.decode(kind, payload, max_data=1 << 20)


@settings(max_examples=300, deadline=None)
@given(topic=st.text(max_size=80))
def test_random_topics_only_ever_raise_frame_error(topic: str) -> None:
    try:
        t = frames.parse_topic(P, P + "/" + topic)
    except FrameError:
        return
    for name in (t.sender, t.key, t.file, t.to):
        assert "/" not in name and ".." not in name[:2] and "\x00" not in name


def test_pieces_end_at_line_ends_unless_a_line_is_too_long() -> None:
    buf = b"aaaa\nbbbb\ncccccccccccccccc\nd\n"
    assert frames.piece_end(buf, 0, len(buf), 12) == 10  # "aaaa\nbbbb\n"
    assert frames.piece_end(buf, 10, len(buf), 12) == 22  # a 17-byte line: cut at 12
    assert frames.piece_end(buf, 22, len(buf), 12) == len(buf)  # the rest fits
