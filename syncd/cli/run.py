"""`syncd run`: the daemon in the foreground, logging to stderr, stopping on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from syncd.cli.common import config_option, load_or_exit
from syncd.config import ConfigError
from syncd.daemon import logoutput
from syncd.daemon.host import Host, StartupError
from syncd.net import tls
from syncd.ops import allocator, collector, stall, systemd
from syncd.ops.controlserver import ControlServer

if TYPE_CHECKING:
    from syncd.ops.metrics import Endpoint


@click.command("run")
@config_option
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="text", show_default=True,
              type=click.Choice(logoutput.FORMATS),
              help="text (without timestamps under journald, which adds its own) or json "
                   "(one object per line).")
def command(config_path: Path, log_level: str, log_format: str) -> None:
    """Run the replicator in the foreground.

    \b
    Exit status:
      0  stopped by SIGTERM or SIGINT
      1  an internal error (logged; systemd restarts the service)
      2  a config or setup problem (directories, identity, TLS files, metrics port): fix it,
         restarting cannot (syncd check-config names it)
    """
    config = load_or_exit(config_path)
    try:  # read now, so that a bad file stops the start rather than every connection attempt
        config.password()
        tls.client_context(config.mqtt)
    except ConfigError as e:
        click.echo(f"syncd: config error: {e}", err=True)
        sys.exit(2)
    logoutput.setup(log_level, log_format)
    allocator.tune()  # frames come from the heap, not from fresh mappings (ops/allocator.py)
    if log_level != "debug":
        logging.getLogger("syncd.mqtt").setLevel(logging.WARNING)
    try:
        node = Host(config)
        node.services.append(ControlServer(node))  # syncd status, adopt, reload
        asyncio.run(_run(node))
    except StartupError as e:
        click.echo(f"syncd: {e}", err=True)
        sys.exit(2)


async def _run(node: Host) -> None:
    trace = os.environ.get("SYNCD_TRACE_FILE")
    if trace:
        node.on_durable(_tracer(Path(trace)))
    loop = asyncio.get_running_loop()
    notifier = systemd.Notifier.from_env()

    def stop(name: str) -> None:
        logging.getLogger("syncd").info("%s: stopping", name)
        notifier.stopping()
        node.stop()

    def ready() -> None:
        logging.getLogger("syncd").info("ready")
        # The summary only for systemd: a status of every file costs ~0.1 s at 1000 keys.
        notifier.ready(systemd.summary(node.status()) if notifier.enabled else "")
        # What loading every file freed (parsed records and log-check states, the
        # start-up's sorts and reads) goes back now, not kept below TRIM_THRESHOLD for
        # good: 1000 idle keys kept ~20 MiB of it resident.
        collector.settle()  # the start-up's objects, out of the collector's walks
        allocator.trim()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig.name)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(node.reload_from_source()))
    endpoint = _metrics_endpoint(node, loop)
    # Outside systemd there is nobody to inform.
    informer = (loop.create_task(systemd.keep_informed(notifier, node.status))
                if notifier.enabled else None)
    if os.environ.get("SYNCD_TRACEMALLOC"):  # snapshots on SIGUSR2 (ops/memtrace.py)
        from syncd.ops import memtrace  # tracemalloc and pickle, imported only to trace

        memtrace.install()
    if os.environ.get("SYNCD_MEMLOG"):  # a line of memory figures every 0.2 s (ops/memtrace.py)
        from syncd.ops import memtrace

        memtrace.log_memory(node, Path(os.environ["SYNCD_MEMLOG"]))
    if os.environ.get("SYNCD_TURNPEAK"):  # the callbacks that swing the heap (ops/memtrace.py)
        from syncd.ops import memtrace

        memtrace.trace_turn_peaks(Path(os.environ["SYNCD_TURNPEAK"]),
                                  snaps=int(os.environ.get("SYNCD_TURNPEAK_SNAPS", "0")),
                                  depth=int(os.environ.get("SYNCD_TURNPEAK_FRAMES", "1")))
    trimmer = loop.create_task(allocator.keep_trimmed())  # free heap pages back (ops/allocator.py)
    stall.watch(loop)  # a loop that stops turning prints where it is stuck (ops/stall.py)
    try:
        await node.run(ready=ready)
    finally:
        stall.unwatch()
        trimmer.cancel()
        if informer is not None:
            informer.cancel()
        notifier.close()
        if endpoint is not None:
            endpoint.close()


def _metrics_endpoint(node: Host, loop: asyncio.AbstractEventLoop) -> Endpoint | None:
    m = node.config.metrics
    if m.host is None:
        return None
    # Imported only when metrics are served: prometheus_client and the HTTP server it
    # brings cost every start-up ~30 ms and ~3 MB of resident memory otherwise.
    from syncd.ops import metrics

    try:
        endpoint = metrics.Endpoint(m.host, m.port, metrics.snapshot_from(node, loop))
    except OSError as e:
        raise StartupError(f"metrics.listen {m.host}:{m.port}: {e.strerror or e}") from None
    base = f"http://{f'[{m.host}]' if ':' in m.host else m.host}:{m.port}"
    logging.getLogger("syncd").info("status page on %s/, metrics on %s/metrics", base, base)
    return endpoint


def _tracer(path: Path) -> Callable[[str, str, int], None]:
    """For benchmarks: one line "key file size monotonic_ns" each time bytes become durable.

    CLOCK_MONOTONIC is shared by all processes on a host, so a benchmark can subtract the
    time it wrote the bytes from the time a replica made them durable.
    """
    # A bare descriptor: one write(2) per line, without a text stream's layers on the way.
    out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def hook(key: str, file: str, size: int) -> None:
        os.write(out, f"{key} {file} {size} {time.monotonic_ns()}\n".encode())

    return hook
