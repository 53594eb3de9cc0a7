from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd import frames
from syncd.frames import (
    Announce,
    Data,
    FrameError,
    Kind,
    Presence,
    Refuse,
    Request,
    Stamp,
    Topic,
)

P = "site/syncd"
D = bytes(range(32))
SECRET = b"a cluster secret of enough bytes"
STAMP = Stamp("0123456789abcdef", 7, 1793531049958)
T = f"{P}/pos/a/bot-1/events.jsonl"
HEAD = len(frames.PREAMBLE) + frames.TAG_SIZE  # preamble and tag


def enc(payload: frames.Payload, topic: str = T) -> bytes:
    return frames.encode(payload, STAMP, SECRET, topic)


def dec(kind: Kind, raw: bytes, max_data: int = 1 << 20, topic: str = T,
        secret: bytes = SECRET) -> frames.Payload:
    stamp, payload = frames.decode(kind, raw, max_data, secret, topic)
    assert stamp == STAMP
    return payload


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
    assert dec(kind, enc(payload)) == payload


def test_wrong_secret_altered_bytes_and_other_topics_are_rejected() -> None:
    raw = enc(Data(10, D, b'{"a":1}\n'))
    with pytest.raises(FrameError, match="authentication"):
        dec(Kind.LIVE, raw, secret=b"another secret, as long as it is")
    altered = bytearray(raw)
    altered[-3] ^= 1
    with pytest.raises(FrameError, match="authentication"):
        dec(Kind.LIVE, bytes(altered))
    # A valid frame replayed for another key (or file, sender, addressee) fails too.
    with pytest.raises(FrameError, match="authentication"):
        dec(Kind.LIVE, raw, topic=f"{P}/pos/a/bot-2/events.jsonl")


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


def signed(rest: bytes, topic: str = T) -> bytes:
    """A frame with a valid tag around arbitrary content: what a peer with the secret could
    send by mistake, so validation after the tag still matters."""
    return frames.PREAMBLE + frames._tag(SECRET, topic, rest) + rest


@pytest.mark.parametrize(
    ("kind", "raw", "reason"),
    [
        (Kind.POS, b"garbage", "preamble"),
        (Kind.POS, frames.PREAMBLE + b"short", "truncated"),
        (Kind.POS, signed(b"\xff\xff\xff\xff{}"), "header length"),
        (Kind.POS, signed(b"\x00\x00\x00\x02[]"), "not an object"),
        (Kind.POS, signed(b'\x00\x00\x00\x16{"size":-1,"digest":1}'), "sid"),
        (Kind.REQ, enc(Refuse(1, D)), "have"),
        (Kind.POS, signed(enc(Announce(1, D))[HEAD:] + b"extra"), "unexpected bytes"),
        (Kind.LIVE, signed(enc(Data(0, D, b"x\n"))[HEAD:-2]), "without data"),
    ],
)
def test_malformed_payloads_say_why(kind: Kind, raw: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        frames.decode(kind, raw, 1 << 20, SECRET, T)


def test_oversized_data_is_rejected() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        dec(Kind.LIVE, enc(Data(0, D, b"x" * 100 + b"\n")), max_data=50)


@settings(max_examples=500, deadline=None)
@given(kind=st.sampled_from(list(Kind)), raw=st.binary(max_size=200))
def test_random_bytes_only_ever_raise_frame_error(kind: Kind, raw: bytes) -> None:
    for payload in (raw, frames.PREAMBLE + raw, signed(raw)):
        with contextlib.suppress(FrameError):
            frames.decode(kind, payload, 1 << 20, SECRET, T)


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
