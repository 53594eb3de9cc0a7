"""systemd integration without libsystemd: readiness, status line, watchdog, stopping.

The notification protocol (sd_notify(3)) is one datagram per message, newline-separated
`NAME=value` assignments, sent to the AF_UNIX socket named by $NOTIFY_SOCKET; a name that
starts with '@' lives in the abstract namespace (the '@' stands for a leading NUL byte).
Outside systemd NOTIFY_SOCKET is unset and every call here does nothing.

The watchdog is fed from the event loop itself (`keep_informed`), so a loop that is wedged,
not merely a process that is alive, stops the pings and gets restarted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("syncd.systemd")

STATUS_EVERY = 5.0  # seconds between checks of the status line (sent only when it changes)
# While files are still being checked at start (hashing gigabytes can outlast TimeoutStartSec),
# each check pushes systemd's start timeout this far ahead: several checks may be missed.
EXTEND_START_USEC = 30_000_000


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self._address = "\0" + address[1:] if address and address.startswith("@") else address
        self._sock: socket.socket | None = None
        self._failed = False
        self.sent_ready = False
        # systemd asks for a ping at least every WATCHDOG_USEC; twice as often leaves room.
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        # WATCHDOG_PID, when set, names the process the watchdog is meant for.
        meant_for_us = not pid or pid == str(os.getpid())
        watchdog = int(usec) if usec.isdigit() and int(usec) > 0 and meant_for_us else None
        return cls(environ.get("NOTIFY_SOCKET") or None, watchdog)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *assignments: str) -> bool:
        """Send `NAME=value` lines as one notification; never raises (False when not sent)."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            # Not connect(): systemd may re-create the socket (daemon-reexec); MSG_DONTWAIT so
            # a full queue drops a notification instead of stalling the event loop.
            self._sock.sendto(message, socket.MSG_DONTWAIT, self._address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at %s: %s", self._address.lstrip("\0"), e)
            return False
        return True

    def ready(self, status: str) -> bool:
        self.sent_ready = True
        return self.send("READY=1", f"STATUS={status}")

    def extend_start(self, usec: int) -> bool:
        return self.send(f"EXTEND_TIMEOUT_USEC={usec}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(status: Mapping[str, Any]) -> str:
    """The one line `systemctl status` shows: "12 files, 0 diverged, 1 behind, broker
    mqtt-1:8883 connected" (the broker in use, or being tried when DISCONNECTED)."""
    states = [f["state"] for f in status["files"]]
    parts = [_count(len(states), "file"), f"{states.count('diverged')} diverged",
             f"{states.count('behind')} behind"]
    for rare in ("reset", "paused", "error", "verifying"):
        if rare in states:
            parts.append(f"{states.count(rare)} {rare}")
    if skipped := len(status.get("skipped", [])):  # directories that cannot be replicated
        parts.append(f"{skipped} {'directory' if skipped == 1 else 'directories'} not "
                     "replicated")
    state = "connected" if status["connected"] else "DISCONNECTED"
    parts.append(f"broker {status['broker']} {state}")
    return ", ".join(parts)


async def keep_informed(notifier: Notifier, status: Callable[[], Mapping[str, Any]]) -> None:
    """Feed the watchdog and keep the status line current, until cancelled; before READY,
    extend the start timeout while files are being checked."""
    interval = min(STATUS_EVERY, notifier.watchdog_interval or STATUS_EVERY)
    last = ""
    while True:
        if notifier.watchdog_interval is not None:
            notifier.watchdog()
        now = status()
        # Only real work earns more time: a start stuck on an unreachable broker still fails
        # after TimeoutStartSec (or one extension after the last file was checked).
        if not notifier.sent_ready and any(f["state"] == "verifying" for f in now["files"]):
            notifier.extend_start(EXTEND_START_USEC)
        line = summary(now)
        if line != last:
            last = line
            notifier.status(line)
        await asyncio.sleep(interval)
