"""Client side of the control socket (`<state_dir>/syncd.sock`): one JSON request, one reply."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson


class ControlError(Exception):
    """The daemon could not be asked (not running, wrong state_dir, permissions)."""


def query(socket_path: Path, cmd: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(socket_path))
            s.sendall(orjson.dumps({"cmd": cmd, **args}) + b"\n")
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
    except FileNotFoundError:
        raise ControlError(f"syncd is not running (no control socket at {socket_path})") from None
    except ConnectionRefusedError:
        raise ControlError(f"syncd is not running (stale control socket at {socket_path})"
                           ) from None
    except PermissionError:
        raise ControlError(f"permission denied on {socket_path} (run as the syncd user or "
                           "root)") from None
    except OSError as e:
        raise ControlError(f"cannot talk to syncd at {socket_path}: {e}") from None
    try:
        reply = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise ControlError("syncd sent a malformed reply") from None
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ControlError(str(reply.get("error") if isinstance(reply, dict) else reply))
    return reply
