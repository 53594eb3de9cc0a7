"""`syncd demo`: see replication work in a few seconds, with no broker and no config.

Exit status: 0 the copies are identical, 1 they are not, 2 the demo could not run.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from syncd.cli.status import render
from syncd.ops import demo


class LiveLine:
    """One line of sizes and lag while the bot writes: redrawn in place on a terminal, once a
    second otherwise. `say` ends it before a step is told."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self._last = -1.0
        self._drawn = False

    def show(self, elapsed: float, writer: str, sizes: dict[str, int],
             down: frozenset[str]) -> None:
        if not self.tty and elapsed - self._last < 1.0:
            return
        self._last = elapsed
        others = ", ".join(f"{n} lag {sizes[writer] - s} B{' (down)' if n in down else ''}"
                           for n, s in sizes.items() if n != writer)
        line = f"  {elapsed:5.1f}s    bot writes on {writer}: {sizes[writer]} B, {others}"
        if self.tty:
            # Cut to the terminal's width: a wrapped line could not be redrawn in place.
            width = shutil.get_terminal_size().columns - 1
            click.echo(f"\r{line[:width]}\x1b[K", nl=False)
            self._drawn = True
        else:
            click.echo(line)

    def say(self, elapsed: float, text: str) -> None:
        self.done()
        click.echo(f"  {elapsed:5.1f}s  {text}" if not text.startswith("    ")
                   else f"         {text}")

    def done(self) -> None:
        if self.tty and self._drawn:
            click.echo("\r\x1b[K", nl=False)
            self._drawn = False


def _root(directory: Path | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="syncd-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        click.echo(f"syncd demo: {directory} is not empty; name a new or empty directory",
                   err=True)
        sys.exit(2)
    return directory.resolve()


@click.command("demo")
@click.option("--seconds", default=10.0, show_default=True, type=click.FloatRange(0.5, 3600),
              help="How long the bot writes, in all (half on each host).")
@click.option("--dir", "directory", type=click.Path(path_type=Path, file_okay=False),
              help="Where the demo's hosts live (default: a new temporary directory).")
def command(seconds: float, directory: Path | None) -> None:
    """Failover with nothing lost, and a fork refused: two syncd nodes on this machine, an
    embedded broker and a bot writing memory. Needs nothing else running.

    \b
    Exit status:
      0  the story went as told and the copies are identical
      1  the copies differ at the end
      2  the demo could not run, or a step did not happen in time (the output says which)
    """
    root = _root(directory)
    a, b = demo.NODES
    click.echo(f"syncd demo: a bot's memory ({demo.KEY}/{demo.FILE}) replicated between {a} "
               f"and {b} over MQTT, all on this machine; hosts live in {root}")
    live = LiveLine(sys.stdout.isatty())
    started = time.monotonic()
    try:
        outcome = asyncio.run(demo.run(root, seconds, live.show, live.say))
    except demo.DemoError as e:
        live.done()
        click.echo(f"syncd demo: {e}", err=True)
        sys.exit(2)
    live.done()
    took = time.monotonic() - started
    click.echo(f"\nafter {took:.1f}s:")
    first = outcome.files[0]
    if outcome.identical:
        click.echo(f"  {demo.KEY}/{demo.FILE}: identical on {a} and {b} "
                   f"({demo.line_count(first)} lines, {demo.size(first)} bytes, sha256 "
                   f"{demo.sha256(first)[:16]}…)")
    else:
        sizes = ", ".join(f"{n} {demo.size(p)} B" for n, p in zip(demo.NODES, outcome.files,
                                                                   strict=True))
        click.echo(f"  {demo.KEY}/{demo.FILE}: copies DIFFER ({sizes})")
    if outcome.archive:
        click.echo(f"  {a}'s losing copy, kept: {outcome.archive} (and .manifest.json)")
    if b in outcome.statuses:
        click.echo(f"\nwhat {b} said before stopping (syncd status):")
        click.echo("\n".join(f"  {line}".rstrip() for line in render(outcome.statuses[b])
                             .splitlines()))
    click.echo(f"\nthe files stay in {root} (remove it when done):")
    click.echo(f"  check a copy as the runbook does:  syncd verify {outcome.files[-1]}")
    click.echo(f"  node logs: {root}/<host>/syncd.log, broker log: {root}/broker.log")
    if not outcome.identical:
        sys.exit(1)
