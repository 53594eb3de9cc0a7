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
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from syncd.errors import SyncdError

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


def load_identity(path: Path) -> Identity:
    """Read the private key, refusing a file others can read or write, or a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise IdentityError(f"identity_file {path} does not exist (create it with: "
                            "syncd keygen --config <this config>)") from None
    except OSError as e:
        raise IdentityError(f"identity_file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IdentityError(f"identity_file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise IdentityError(f"identity_file {path} is readable or writable by others "
                                f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            text = f.read(64 * 1024)
    except OSError as e:
        raise IdentityError(f"identity_file {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(text, password=None)
    except (ValueError, TypeError):
        raise IdentityError(f"identity_file {path} is not an unencrypted PEM private key "
                            "(make a new one with syncd keygen)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"identity_file {path} holds a {type(key).__name__}, not an "
                            "Ed25519 key (make a new one with syncd keygen)")
    return Identity(key)


def create_identity(path: Path) -> Identity:
    """Write a new private key to `path` (mode 600, never over an existing file)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    return Identity(key)


def identity_from_seed(seed: bytes) -> Identity:
    """A deterministic key (tests and the demo: 32 bytes of seed)."""
    return Identity(Ed25519PrivateKey.from_private_bytes(seed))


def write_identity(path: Path, identity: Identity) -> None:
    """Store a given key at `path`, mode 600 (tests and the demo)."""
    pem = identity.key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pem)
    path.chmod(0o600)
