"""sealed.py: frames encrypted once, the key wrapped for each recipient, bound to the header."""

from __future__ import annotations

import hashlib
import struct

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from syncd.core import frames, sealed
from syncd.core.frames import Data, Frame, FrameError, Item, Kind
from syncd.core.pairkeys import PairKeys
from tests.support.cluster import node_identity

P = "syncd"
LINE = b'{"role": "user", "content": "a secret line"}\n'
BASE = hashlib.sha256(b"prefix").digest()


def keys(node: str, epoch: int) -> PairKeys:
    return PairKeys(node, epoch, node_identity(node).key)


@pytest.fixture()
def cluster() -> dict[str, PairKeys]:
    hosts = {"a": keys("a", 5), "b": keys("b", 6), "c": keys("c", 7)}
    for x in hosts.values():
        for y in hosts.values():
            if x is not y:
                x.learn(y.node, y.epoch, node_identity(y.node).key.public_key(), y.run_public)
    return hosts


def frame(seq: int = 1, lane: int = 1) -> Frame:
    return Frame("a", 5, seq, 1234, (Item(Kind.LIVE, Data(10, BASE, LINE), "bot-1",
                                          "events.jsonl"),), lane=lane)


def seal(hosts: dict[str, PairKeys], f: Frame, topic: str, to: tuple[str, ...] = ("b", "c")
         ) -> bytes:
    recipients = []
    for n in to:
        pair = hosts["a"].sending(n)
        assert pair is not None
        recipients.append((n, *pair))
    return sealed.encode(f, topic, recipients)


def open_as(hosts: dict[str, PairKeys], me: str, raw: bytes, topic: str,
            sender: str = "a") -> Frame:
    route = frames.parse_topic(P, topic)
    return sealed.decode(route, raw, sender, 1 << 20, topic, me, hosts[me].epoch,
                         lambda e: hosts[me].receiving(sender, e))


def test_each_recipient_opens_the_same_frame(cluster: dict[str, PairKeys]) -> None:
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic)
    for me in ("b", "c"):
        assert open_as(cluster, me, raw, topic) == frame()


def test_the_broker_sees_no_byte_nor_digest_nor_name(cluster: dict[str, PairKeys]) -> None:
    raw = seal(cluster, frame(), frames.all_topic(P, "a"))
    for secret in (LINE, LINE[:8], BASE, BASE.hex().encode(), hashlib.sha256(LINE).digest(),
                   b"bot-1", b"events.jsonl"):
        assert secret not in raw


def test_an_addressed_frame(cluster: dict[str, PairKeys]) -> None:
    topic = frames.to_topic(P, "b", "a")
    f = Frame("a", 5, 9, 1, (Item(Kind.FILL, Data(0, BASE, LINE), "k", "events.jsonl"),),
              to="b")
    assert open_as(cluster, "b", seal(cluster, f, topic, ("b",)), topic) == f


def test_an_unlisted_recipient_learns_nothing(cluster: dict[str, PairKeys]) -> None:
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic, ("b",))
    with pytest.raises(sealed.NotForUs, match="not sealed for this host"):
        open_as(cluster, "c", raw, topic)


def test_a_frame_for_an_earlier_run_or_from_an_unheard_run(cluster: dict[str, PairKeys]
                                                            ) -> None:
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic)
    route = frames.parse_topic(P, topic)
    with pytest.raises(sealed.NotForUs, match="run 6 of this host"):
        sealed.decode(route, raw, "a", 1 << 20, topic, "b", 8, lambda e: None)
    with pytest.raises(sealed.NotForUs, match="presence is not heard"):
        sealed.decode(route, raw, "a", 1 << 20, topic, "b", 6, lambda e: None)


def parts(raw: bytes) -> tuple[bytes, dict[str, object], bytes, bytes]:
    (hlen,) = struct.unpack_from(">I", raw, 3)
    head = raw[7 : 7 + hlen]
    n = len(orjson.loads(head)["rcpt"])
    wraps = raw[7 + hlen : 7 + hlen + 48 * n]
    return head, orjson.loads(head), wraps, raw[7 + hlen + 48 * n :]


def test_a_recipient_cannot_alter_the_body_for_the_others(cluster: dict[str, PairKeys]
                                                           ) -> None:
    """b learns the frame key from its wrap, re-encrypts another body under it and keeps the
    wraps: c's wrap binds the ciphertext's digest, so c refuses it."""
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic)
    head, _, wraps, ciphertext = parts(raw)
    b_pair = cluster["b"].receiving("a", 5)
    assert b_pair is not None
    aad = sealed._bound(topic, head, ciphertext)
    frame_key = b_pair.decrypt(struct.pack(">4xQ", 1), wraps[:48], aad)
    nonce = struct.pack(">4xQ", 1)
    plain = AESGCM(frame_key).decrypt(nonce, ciphertext, None)
    forged = AESGCM(frame_key).encrypt(nonce, plain.replace(b"secret", b"forged"), None)
    tampered = raw[: len(raw) - len(ciphertext)] + forged
    with pytest.raises(FrameError, match="bad seal"):
        open_as(cluster, "c", tampered, topic)


def test_a_listed_host_cannot_speak_for_another(cluster: dict[str, PairKeys]) -> None:
    """b seals a frame in a's name for c with the keys b holds: c refuses it."""
    topic = frames.all_topic(P, "a")
    pair = cluster["b"].sending("c")
    assert pair is not None
    forged = sealed.encode(Frame("a", 5, 1, 1, frame().items, lane=1), topic, [("c", *pair)])
    with pytest.raises(FrameError, match="bad seal"):
        open_as(cluster, "c", forged, topic)


def test_header_topic_and_recipients_are_bound(cluster: dict[str, PairKeys]) -> None:
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic)
    _, parsed, wraps, ciphertext = parts(raw)
    # Another topic (another addressee's, or a's positions): refused.
    with pytest.raises(FrameError):
        open_as(cluster, "b", raw, frames.to_topic(P, "b", "a"))
    for change in ({"seq": 2}, {"rcpt": [["b", 6]]}, {"epoch": 5, "seq": 1, "x": 1}):
        new = orjson.dumps({**parsed, **change})
        n = len(orjson.loads(new)["rcpt"])  # type: ignore[arg-type]
        altered = sealed.PREAMBLE + struct.pack(">I", len(new)) + new + wraps[: 48 * n] \
            + ciphertext
        with pytest.raises(FrameError, match="bad seal"):
            open_as(cluster, "b", altered, topic)


@pytest.mark.parametrize("cut", [2, 5, 9, 40])
def test_truncated_or_garbled_frames_are_refused(cluster: dict[str, PairKeys], cut: int) -> None:
    topic = frames.all_topic(P, "a")
    raw = seal(cluster, frame(), topic)
    with pytest.raises(FrameError):
        open_as(cluster, "b", raw[:cut], topic)
    with pytest.raises(FrameError):
        open_as(cluster, "b", raw[:-cut], topic)
    flipped = bytearray(raw)
    flipped[-cut] ^= 1
    with pytest.raises(FrameError):
        open_as(cluster, "b", bytes(flipped), topic)


def test_bounds_on_the_clear_header(cluster: dict[str, PairKeys]) -> None:
    topic = frames.all_topic(P, "a")

    def with_head(head: dict[str, object]) -> bytes:
        raw = orjson.dumps(head)
        return sealed.PREAMBLE + struct.pack(">I", len(raw)) + raw

    good = {"v": 6, "from": "a", "epoch": 5, "seq": 1}
    for head, why in [({**good, "rcpt": [["b", 6]] * 1025}, "at most 1024"),
                      ({**good, "rcpt": [["b", "6"]]}, "recipient must be"),
                      ({**good, "rcpt": [["b" * 201, 6]]}, "recipient must be"),
                      ({**good, "seq": -1, "rcpt": []}, "'seq'"),
                      ({**good, "v": 5, "rcpt": []}, "expected 6"),
                      ({**good, "from": "c", "rcpt": []}, "another sender"),
                      ({**good, "rcpt": [["b", 6]]}, "truncated")]:
        with pytest.raises(FrameError, match=why):
            open_as(cluster, "b", with_head(head), topic)


def test_body_keys_are_per_recipient_set_and_bounded(cluster: dict[str, PairKeys]) -> None:
    """One body key per set of recipients (and their runs): a host outside a set never holds
    the key of that set's frames, even when it reads the sender's other frames."""
    keys = sealed.BodyKeys()
    topic_all, topic_b = frames.all_topic(P, "a"), frames.to_topic(P, "b", "a")
    both = [(n, *cluster["a"].sending(n)) for n in ("b", "c")]  # type: ignore[misc]
    only_b = [("b", *cluster["a"].sending("b"))]  # type: ignore[misc]
    assert keys.for_set(both)[0] == keys.for_set(both)[0]
    assert keys.for_set(both)[0] != keys.for_set(only_b)[0]
    f = Frame("a", 5, 3, 1, (Item(Kind.FILL, Data(0, BASE, LINE), "k", "events.jsonl"),), to="b")
    raw = sealed.encode(f, topic_b, only_b, keys)
    assert open_as(cluster, "b", raw, topic_b) == f
    assert open_as(cluster, "b", sealed.encode(frame(4), topic_all, both, keys), topic_all)
    for i in range(sealed.MAX_KEYS + 5):
        keys.for_set([(f"n{i}", 1, both[0][2])])
    assert len(keys._keys) <= sealed.MAX_KEYS


def test_decode_any_reads_both_versions(cluster: dict[str, PairKeys]) -> None:
    topic = frames.all_topic(P, "a")
    route = frames.parse_topic(P, topic)
    signed = frames.encode(frame(), node_identity("a"), topic)
    for raw in (signed, seal(cluster, frame(), topic)):
        got = sealed.decode_any(route, raw, "a", 1 << 20, topic,
                                node_identity("a").key.public_key(), "b", 6,
                                lambda e: cluster["b"].receiving("a", e))
        assert got == frame()
    assert sealed.version_of(signed) == 5 and sealed.version_of(b"xx") == 0
