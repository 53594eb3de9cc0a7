"""A stuck daemon says where it is stuck: stacks on SIGUSR1, and after a stalled loop."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

from tests.support.cluster import Broker, Daemon, wait_until


def test_a_loop_that_stops_turning_prints_every_threads_stack() -> None:
    program = textwrap.dedent("""
        import asyncio, time
        from syncd.ops import stall

        def stuck_in_a_blocking_call():
            time.sleep(2.0)

        async def main():
            stall.watch(asyncio.get_running_loop(), seconds=0.5)
            await asyncio.sleep(0.2)  # turns of a healthy loop: nothing printed
            print("healthy", flush=True)
            stuck_in_a_blocking_call()
            stall.unwatch()

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "healthy\n"
    assert "the event loop has not turned for" in done.stderr
    assert "stuck_in_a_blocking_call" in done.stderr


def test_sigusr1_prints_the_stacks_of_a_running_daemon(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    d = make_daemon("a", broker)
    assert d.proc is not None
    d.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: "most recent call first" in d.read_log(), 10, "the stacks in the log")
    assert "syncd/daemon/host.py" in d.read_log() or "asyncio" in d.read_log()
    assert d.status()["connected"]  # and it runs on
