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
from typing import IO

import click

from syncd.cli.common import config_option, load_or_exit
from syncd.config import ConfigError, load_config
from syncd.node import Node, StartupError


@click.command("run")
@config_option
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def command(config_path: Path, log_level: str) -> None:
    """Run the replicator in the foreground."""
    config = load_or_exit(config_path)
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if log_level != "debug":
        logging.getLogger("syncd.mqtt").setLevel(logging.WARNING)
    try:
        asyncio.run(_run(Node(config)))
    except StartupError as e:
        click.echo(f"syncd: {e}", err=True)
        sys.exit(2)


async def _run(node: Node) -> None:
    trace = os.environ.get("SYNCD_TRACE_FILE")
    if trace:
        node.on_durable(_tracer(Path(trace)))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_reload(node)))
    await node.run(ready=lambda: logging.getLogger("syncd").info("ready"))


def _tracer(path: Path) -> Callable[[str, str, int], None]:
    """For benchmarks: one line "key file size monotonic_ns" each time bytes become durable.

    CLOCK_MONOTONIC is shared by all processes on a host, so a benchmark can subtract the
    time it wrote the bytes from the time a replica made them durable.
    """
    out: IO[str] = path.open("a", buffering=1)

    def hook(key: str, file: str, size: int) -> None:
        out.write(f"{key} {file} {size} {time.monotonic_ns()}\n")

    return hook


async def _reload(node: Node) -> None:
    source = node.config.source
    assert source is not None
    try:
        config = load_config(source)
    except ConfigError as e:
        logging.getLogger("syncd").error("reload refused, keeping the running configuration: %s",
                                         e)
        return
    await node.reload(config)
