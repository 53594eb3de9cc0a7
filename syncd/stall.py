"""Say where the daemon is stuck: thread stacks on SIGUSR1, and when the event loop stalls.

Everything syncd does turns on one event loop; a call that blocks it (a hung disk, a bug)
stops replication, the control socket and the MQTT keepalive at once, and the daemon looks
dead from outside while its process is alive. Python's faulthandler can print every thread's
stack from a C thread of its own, which runs even when the loop does not: a heartbeat on the
loop re-arms it every second, so it fires only after `seconds` without a turn. The stacks go
to stderr (the journal under systemd).
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys

# Far above any turn of a healthy loop (a slow fsync: ~1 s), and before systemd's watchdog
# (WatchdogSec=30s in the unit) kills a stuck daemon: its journal then says where it was.
STALL_SECONDS = 20.0
BEAT = 1.0


def watch(loop: asyncio.AbstractEventLoop, seconds: float = STALL_SECONDS) -> None:
    """`kill -USR1 <pid>` prints the stacks; so does a loop that has not turned in `seconds`."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    def beat() -> None:
        faulthandler.dump_traceback_later(seconds, repeat=False, file=sys.stderr, exit=False)
        loop.call_later(BEAT, beat)

    beat()


def unwatch() -> None:
    faulthandler.cancel_dump_traceback_later()
    faulthandler.unregister(signal.SIGUSR1)
