"""This host's private key file (`identity_file`): read it refusing what others could have
planted or read, create it without ever replacing one. The key itself: core/identity.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from syncd.core.identity import Identity, IdentityError
from syncd.disk import durable


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
    durable.create_file(path, pem, 0o600)  # its bytes, then its directory's entry
    return Identity(key)


def write_identity(path: Path, identity: Identity) -> None:
    """Store a given key at `path`, mode 600 (tests and the demo)."""
    pem = identity.key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pem)
    path.chmod(0o600)
