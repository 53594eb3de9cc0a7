"""Writing and comparing copies of a replicated file, the way the end-to-end tests do."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.support.cluster import Daemon, wait_until

KEY = "bot-1"


def append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)  # one write(2), like the reference writer's appendFile
    finally:
        os.close(fd)


def content(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def wait_equal(expected: bytes, *daemons: Daemon, key: str = KEY, timeout: float = 15) -> None:
    def same() -> bool:
        return all(content(d.path(key)) == expected for d in daemons)

    wait_until(same, timeout, f"copies on {[d.node for d in daemons]} to equal "
                              f"{len(expected)} bytes")
    digest = hashlib.sha256(expected).hexdigest()
    for d in daemons:
        assert hashlib.sha256(content(d.path(key))).hexdigest() == digest


def wait_state(d: Daemon, state: str, key: str = KEY, timeout: float = 15) -> dict[str, object]:
    found: dict[str, object] = wait_until(
        lambda: (f := d.file_status(key)) and f["state"] == state and f,
        timeout, f"{d.node} to report {key} {state}")
    return found
