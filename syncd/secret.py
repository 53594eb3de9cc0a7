"""The cluster secret: read once at start, checked for safe permissions, never printed."""

from __future__ import annotations

import stat
from pathlib import Path

from syncd.errors import SyncdError

MIN_BYTES = 16


class SecretError(SyncdError):
    """The secret file is missing, unsafe or too short (the message never contains it)."""


def load_secret(path: Path) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SecretError(f"secret_file {path} does not exist (create it with: "
                          f"head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path}; "
                          "and copy it to every host)") from None
    except OSError as e:
        raise SecretError(f"secret_file {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"secret_file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise SecretError(f"secret_file {path} is readable or writable by others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
    try:
        secret = path.read_bytes().strip()
    except OSError as e:
        raise SecretError(f"secret_file {path}: {e.strerror}") from None
    if len(secret) < MIN_BYTES:
        raise SecretError(f"secret_file {path} holds fewer than {MIN_BYTES} bytes; use a long "
                          "random secret")
    return secret
