"""Say where the daemon is stuck: thread stacks on SIGUSR1, and when the event loop stalls.

Everything syncd does turns on one event loop; a call that blocks it (a hung disk, a bug)
stops replication, the control socket and the MQTT keepalive at once, and the daemon looks
dead from outside while its process is alive. A heartbeat on the loop notes the time every
10 s; a thread of ours looks at it every 5 s and, once it is `seconds` old, prints every
thread's stack (faulthandler) to stderr: the journal under systemd. Once per stall. Every
wake-up costs an idle daemon (faulthandler's own dump_traceback_later, re-armed every second,
cost ~0.8 % of a core: it starts a thread each time); these two cost nothing measurable.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
import threading
import time

# Far above any turn of a healthy loop (a slow fsync: ~1 s), and before systemd's watchdog
# (WatchdogSec=30s in the unit) kills a stuck daemon: its journal then says where it was.
STALL_SECONDS = 20.0
BEAT = 10.0  # seconds between heartbeats: each one wakes an idle daemon up


class _Watch:
    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop, self.seconds = loop, seconds
        self.beat_at = time.monotonic()
        self.stop = threading.Event()
        self.handle: asyncio.TimerHandle | None = None
        self.thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def beat(self) -> None:
        self.beat_at = time.monotonic()
        self.handle = self.loop.call_later(min(BEAT, self.seconds / 2), self.beat)

    def _watch(self) -> None:
        reported = 0.0  # the beat a stall was reported for: once per stall
        while not self.stop.wait(min(self.seconds / 4, 10.0)):
            beat_at = self.beat_at
            stalled = time.monotonic() - beat_at
            if stalled >= self.seconds and beat_at != reported:
                reported = beat_at
                print(f"syncd: the event loop has not turned for {stalled:.0f} s; the stack "
                      "of every thread follows", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


_watch: _Watch | None = None


def watch(loop: asyncio.AbstractEventLoop, seconds: float = STALL_SECONDS) -> None:
    """`kill -USR1 <pid>` prints the stacks; so does a loop that has not turned in `seconds`."""
    global _watch
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    _watch = _Watch(loop, seconds)
    _watch.beat()
    _watch.thread.start()


def unwatch() -> None:
    global _watch
    faulthandler.unregister(signal.SIGUSR1)
    if _watch is not None:
        _watch.stop.set()
        if _watch.handle is not None:
            _watch.handle.cancel()
        _watch = None
