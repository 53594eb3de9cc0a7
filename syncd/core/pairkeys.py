"""Pairwise keys between listed hosts (wire version 6), without any I/O.

Every host already has an Ed25519 identity listed in `[peers]`. Its X25519 key is derived from
it, as libsodium's `crypto_sign_ed25519_sk_to_curve25519` / `_pk_to_curve25519` do: the secret
is the clamped first half of SHA-512(seed) (the scalar Ed25519 itself signs with), the public
key the Montgomery u of the Edwards point, u = (1 + y) / (1 - y) mod 2^255 - 19. So no second
key needs to be listed, distributed or rotated: `[peers]` stays one line per host.

Each run (epoch) also makes an ephemeral X25519 key, published once in its presence, which is
signed with the identity (frames.py): the broker cannot swap it. The key for frames from S to
R is

    HKDF-SHA256(X25519(S static, R static) || X25519(S run, R run),
                info = "syncd pair v6" | S | R | S's epoch | R's epoch)

The static half authenticates (only S and R can compute it); the ephemeral half gives forward
secrecy: the run secrets live only in this process's memory and are dropped when the run ends
(and a peer's pair keys when it starts a newer run), so a recording of the broker's traffic
cannot be opened later, even by someone who steals both identity files.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from syncd.core.errors import SyncdError

KEY_SIZE = 32
_P = 2**255 - 19
_INFO = b"syncd pair v6"
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


class PairKeyError(SyncdError, ValueError):
    """A public key that cannot make a pair key (malformed, or a low-order point)."""


def x25519_secret(ed_seed: bytes) -> bytes:
    """The X25519 secret of an Ed25519 private key's 32-byte seed."""
    h = bytearray(hashlib.sha512(ed_seed).digest()[:32])
    h[0] &= 248
    h[31] &= 127
    h[31] |= 64
    return bytes(h)


def x25519_public(ed_public: bytes) -> bytes:
    """The X25519 public key of an Ed25519 public key (32 raw bytes each)."""
    if len(ed_public) != 32:
        raise PairKeyError(f"an Ed25519 public key is 32 bytes, not {len(ed_public)}")
    y = int.from_bytes(ed_public, "little") & ((1 << 255) - 1)  # the top bit is x's sign
    if y >= _P or y == 1:  # not canonical, or the neutral point (1 - y has no inverse)
        raise PairKeyError("not a usable Ed25519 public key")
    u = (1 + y) * pow(1 - y, _P - 2, _P) % _P
    return u.to_bytes(32, "little")


def ed_public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(*_RAW)


def static_of(identity_key: Ed25519PrivateKey) -> X25519PrivateKey:
    seed = identity_key.private_bytes(serialization.Encoding.Raw,
                                      serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
    return X25519PrivateKey.from_private_bytes(x25519_secret(seed))


def _dh(mine: X25519PrivateKey, theirs: bytes) -> bytes:
    try:
        return mine.exchange(X25519PublicKey.from_public_bytes(theirs))
    except ValueError:  # all-zero output: a low-order point, or a malformed key
        raise PairKeyError("a public key of low order (refused)") from None


def derive(shared: bytes, sender: str, recipient: str, sender_epoch: int,
           recipient_epoch: int) -> bytes:
    info = b"\x00".join((_INFO, sender.encode("utf-8", "surrogateescape"),
                         recipient.encode("utf-8", "surrogateescape"),
                         str(sender_epoch).encode(), str(recipient_epoch).encode()))
    return HKDF(hashes.SHA256(), KEY_SIZE, salt=None, info=info).derive(shared)


@dataclass(slots=True)
class _Peer:
    epoch: int
    run_public: bytes
    send: AESGCM  # our frames to it
    receive: AESGCM  # its frames to us


class PairKeys:
    """This run's keys and, per peer, the pair keys of its newest run announced."""

    def __init__(self, node: str, epoch: int, identity_key: Ed25519PrivateKey,
                 run_secret: bytes | None = None) -> None:
        self.node = node
        self.epoch = epoch
        self._static = static_of(identity_key)
        # Made here, never written anywhere: forward secrecy rests on it dying with the run.
        self._run = X25519PrivateKey.from_private_bytes(run_secret or os.urandom(KEY_SIZE))
        self.run_public = self._run.public_key().public_bytes(*_RAW)
        self._peers: dict[str, _Peer] = {}

    def learn(self, peer: str, epoch: int, ed_public: Ed25519PublicKey,
              run_public: bytes) -> bool:
        """A peer's run key, from a presence whose signature was checked against `ed_public`.
        Replaces (erases) the keys of its earlier run; False if not newer than the one held."""
        held = self._peers.get(peer)
        if held is not None and (held.epoch > epoch
                                 or (held.epoch == epoch and held.run_public == run_public)):
            return False
        if len(run_public) != KEY_SIZE:
            raise PairKeyError(f"a run key is {KEY_SIZE} bytes, not {len(run_public)}")
        shared = (_dh(self._static, x25519_public(ed_public_bytes(ed_public)))
                  + _dh(self._run, run_public))
        self._peers[peer] = _Peer(
            epoch, run_public,
            AESGCM(derive(shared, self.node, peer, self.epoch, epoch)),
            AESGCM(derive(shared, peer, self.node, epoch, self.epoch)))
        return True

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def epoch_of(self, peer: str) -> int | None:
        held = self._peers.get(peer)
        return None if held is None else held.epoch

    def sending(self, peer: str) -> tuple[int, AESGCM] | None:
        """(the peer's run, the key our frames to it are wrapped with), if its run is known."""
        held = self._peers.get(peer)
        return None if held is None else (held.epoch, held.send)

    def receiving(self, peer: str, epoch: int) -> AESGCM | None:
        """The key frames of `peer`'s run `epoch` to us are wrapped with, if that run is known."""
        held = self._peers.get(peer)
        return held.receive if held is not None and held.epoch == epoch else None
