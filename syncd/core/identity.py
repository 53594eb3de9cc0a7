"""Per-host signing keys: this host's private key (`identity_file`) and the peers' public keys.

Every frame is signed with Ed25519 by the host that sends it and checked against the public
key listed for that host in the config's `[peers]` table. A host can therefore speak only as
itself: holding one host's files lets you forge that host's frames, nobody else's.

Key texts: the private key is a PKCS#8 PEM file (what `openssl genpkey -algorithm ed25519`
writes, mode 600); a public key is the base64 of its 32 raw bytes, one line, as `syncd keygen`
prints it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from syncd.core.errors import SyncdError

SIGNATURE_SIZE = 64


class IdentityError(SyncdError):
    """The identity file is missing, unsafe or not a key (the message never contains it)."""


def public_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def parse_public(text: str) -> Ed25519PublicKey:
    """A peer's public key from its base64 text; ValueError says what is wrong."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64 (use the text `syncd keygen` prints)") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this one is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class Identity:
    """This host's private key; `sign` is the only thing done with it."""

    key: Ed25519PrivateKey

    @property
    def public(self) -> str:
        return public_text(self.key.public_key())

    def sign(self, data: bytes) -> bytes:
        return self.key.sign(data)


def verify(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def identity_from_seed(seed: bytes) -> Identity:
    """A deterministic key (tests and the demo: 32 bytes of seed)."""
    return Identity(Ed25519PrivateKey.from_private_bytes(seed))
