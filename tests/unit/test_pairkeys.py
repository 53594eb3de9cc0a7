"""pairkeys.py: X25519 keys from the Ed25519 identities, and pair keys per pair of runs."""

from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from syncd.core import pairkeys
from syncd.core.pairkeys import PairKeyError, PairKeys
from tests.support.cluster import node_identity

RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def seed_of(node: str) -> bytes:
    return node_identity(node).key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption())


@pytest.mark.parametrize("node", ["a", "b", "host-c", "x"])
def test_the_derived_public_key_is_the_public_key_of_the_derived_secret(node: str) -> None:
    ed_public = pairkeys.ed_public_bytes(node_identity(node).key.public_key())
    secret = pairkeys.x25519_secret(seed_of(node))
    expected = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes(*RAW)
    assert pairkeys.x25519_public(ed_public) == expected


def test_the_secret_is_clamped() -> None:
    s = pairkeys.x25519_secret(seed_of("a"))
    assert s[0] & 7 == 0 and s[31] & 128 == 0 and s[31] & 64 == 64


def test_unusable_public_keys_are_refused() -> None:
    with pytest.raises(PairKeyError):
        pairkeys.x25519_public(bytes(31))
    with pytest.raises(PairKeyError):  # y = 1: the neutral point
        pairkeys.x25519_public((1).to_bytes(32, "little"))
    with pytest.raises(PairKeyError):  # y = p: not canonical
        pairkeys.x25519_public((2**255 - 19).to_bytes(32, "little"))


def keys(node: str, epoch: int) -> PairKeys:
    return PairKeys(node, epoch, node_identity(node).key)


def pair(a: PairKeys, b: PairKeys) -> None:
    a.learn(b.node, b.epoch, node_identity(b.node).key.public_key(), b.run_public)
    b.learn(a.node, a.epoch, node_identity(a.node).key.public_key(), a.run_public)


def test_both_ends_derive_the_same_key_for_each_direction() -> None:
    a, b = keys("a", 3), keys("b", 7)
    pair(a, b)
    sent = a.sending("b")
    assert sent is not None and sent[0] == 7
    nonce = bytes(12)
    wrapped = sent[1].encrypt(nonce, b"k" * 32, b"aad")
    receive = b.receiving("a", 3)
    assert receive is not None and receive.decrypt(nonce, wrapped, b"aad") == b"k" * 32
    back = b.sending("a")
    assert back is not None
    # Each direction has its own key: b's frames to a never open with a's key to b.
    with pytest.raises(InvalidTag):
        sent[1].decrypt(nonce, back[1].encrypt(nonce, b"k" * 32, b"aad"), b"aad")
    assert b.receiving("a", 2) is None  # another run of a: no key


def test_a_new_run_replaces_the_keys_of_the_last() -> None:
    a, b1 = keys("a", 1), keys("b", 1)
    pair(a, b1)
    old = a.sending("b")
    b2 = keys("b", 2)
    assert a.learn("b", 2, node_identity("b").key.public_key(), b2.run_public)
    assert not a.learn("b", 1, node_identity("b").key.public_key(), b1.run_public)
    new = a.sending("b")
    assert old is not None and new is not None and new[0] == 2 and new[1] is not old[1]


def test_a_third_host_with_the_run_key_but_not_the_identity_gets_another_key() -> None:
    """The static half: the broker may see (and a listed host may copy) a run key, but the
    pair key also needs one of the two identities."""
    a, b = keys("a", 1), keys("b", 1)
    pair(a, b)
    mallory = PairKeys("b", 1, node_identity("mallory").key, run_secret=bytes(range(32)))
    mallory.learn("a", 1, node_identity("a").key.public_key(), a.run_public)
    sent = a.sending("b")
    forged = mallory.sending("a")
    assert sent is not None and forged is not None
    with pytest.raises(InvalidTag):
        sent[1].decrypt(bytes(12), forged[1].encrypt(bytes(12), b"k" * 32, b""), b"")


def test_a_low_order_run_key_is_refused() -> None:
    a = keys("a", 1)
    with pytest.raises(PairKeyError):
        a.learn("b", 1, node_identity("b").key.public_key(), bytes(32))
    assert a.sending("b") is None
