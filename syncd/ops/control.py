"""Client side of the control socket (`<state_dir>/syncd.sock`): one JSON request, one reply."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from syncd.core.errors import SyncdError


class ControlError(SyncdError):
    """The daemon could not be asked (not running, wrong state_dir, permissions)."""


class Unreachable(ControlError):
    """Nothing answers at the socket (not running, starting, restarting) or the answer did
    not come in time: asking again later may work, unlike a refusal or a bad reply."""


def query(socket_path: Path, cmd: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    """Send one command and return its final reply (progress lines are skipped)."""
    replies = list(stream(socket_path, cmd, timeout, **args))
    if not replies:
        raise ControlError("syncd closed the connection without replying")
    return replies[-1]


def stream(socket_path: Path, cmd: str, timeout: float = 10.0,
           **args: Any) -> Iterator[dict[str, Any]]:
    """Send one command; yield every reply line (progress, then the final reply)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            _connect(s, str(socket_path), timeout)
            s.sendall(orjson.dumps({"cmd": cmd, **args}) + b"\n")
            buf = b""
            while chunk := s.recv(1 << 16):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield _parse(line)
            if buf.strip():
                yield _parse(buf)
    except FileNotFoundError:
        raise Unreachable(f"syncd is not running (no control socket at {socket_path})") from None
    except ConnectionRefusedError:
        raise Unreachable(f"syncd is not running (stale control socket at {socket_path})"
                          ) from None
    except (TimeoutError, BlockingIOError):
        raise Unreachable(f"syncd at {socket_path} did not answer within {timeout:g}s"
                          ) from None
    except PermissionError:
        raise ControlError(f"permission denied on {socket_path} (run as the syncd user or "
                           "root)") from None
    except OSError as e:
        raise ControlError(f"cannot talk to syncd at {socket_path}: {e}") from None


def _parse(line: bytes) -> dict[str, Any]:
    try:
        reply = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ControlError("syncd sent a malformed reply") from None
    if not isinstance(reply, dict):
        raise ControlError(f"syncd sent a malformed reply: {reply!r}")
    if "progress" not in reply and not reply.get("ok"):
        raise ControlError(str(reply.get("error")))
    return reply


def _connect(s: socket.socket, path: str, timeout: float) -> None:
    """Connect, waiting while the daemon's listen backlog is full: a Unix socket with a
    timeout fails at once with EAGAIN then (the kernel does not wait), and under a storm of
    other clients `status --ready` must wait its turn, not fail."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
