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

from syncd import demo
from syncd.cli.status import render


class LiveLine:
    """One line of sizes and lag: redrawn in place on a terminal, once a second otherwise."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self._last = -1.0

    def show(self, elapsed: float, copies: list[demo.Copy]) -> None:
        if not self.tty and elapsed - self._last < 1.0:
            return
        self._last = elapsed
        parts = []
        for key in demo.BOTS:
            writer = next(c for c in copies if c.key == key and c.writer)
            others = ", ".join(f"{c.node} lag {writer.size - c.size} B" for c in copies
                               if c.key == key and not c.writer)
            parts.append(f"{key} on {writer.node} {writer.size} B, {others}")
        line = f"  {elapsed:5.1f}s  " + " | ".join(parts)
        if self.tty:
            # Cut to the terminal's width: a wrapped line could not be redrawn in place.
            width = shutil.get_terminal_size().columns - 1
            click.echo(f"\r{line[:width]}\x1b[K", nl=False)
        else:
            click.echo(line)

    def done(self) -> None:
        if self.tty:
            click.echo()


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
              help="How long the bots write.")
@click.option("--dir", "directory", type=click.Path(path_type=Path, file_okay=False),
              help="Where the demo's hosts live (default: a new temporary directory).")
def command(seconds: float, directory: Path | None) -> None:
    """Two syncd nodes on this machine, an embedded broker, bots writing memory: watch the
    copies follow, then check that they are identical. Needs nothing else running.

    \b
    Exit status:
      0  the story went as told and the copies are identical
      1  it did not (the output says where)
      2  the demo could not run (no embedded broker, directory in use)
    """
    root = _root(directory)
    click.echo("syncd demo: two hosts replicating agent memory logs over MQTT, all on this "
               "machine.")
    click.echo(f"  {', '.join(f'{k} runs on {h}' for k, h in demo.BOTS.items())}; each appends "
               "whole turns and syncd copies every line to the other host as it is written.")
    click.echo(f"  hosts live in {root}")
    live = LiveLine(sys.stdout.isatty())
    started = time.monotonic()
    try:
        outcome = asyncio.run(demo.run(root, seconds, live.show, lambda s: click.echo(f"  {s}")))
    except demo.DemoError as e:
        live.done()
        click.echo(f"syncd demo: {e}", err=True)
        sys.exit(2)
    live.done()
    took = time.monotonic() - started
    click.echo(f"\nafter {took:.1f}s:")
    for key, paths in outcome.files.items():
        hosts = " and ".join(demo.NODES)
        if len({demo.sha256(p) for p in paths}) == 1:
            click.echo(f"  {key}/{demo.FILE}: identical on {hosts} ({demo.line_count(paths[0])} "
                       f"lines, {demo.size(paths[0])} bytes, sha256 {demo.sha256(paths[0])[:16]}…)")
        else:
            sizes = ", ".join(f"{n} {demo.size(p)} B" for n, p in zip(demo.NODES, paths,
                                                                       strict=True))
            click.echo(f"  {key}/{demo.FILE}: copies DIFFER ({sizes})")
    standby = demo.NODES[-1]
    if standby in outcome.statuses:
        click.echo(f"\nwhat {standby} said before stopping (syncd status):")
        click.echo("\n".join(f"  {line}".rstrip() for line in render(outcome.statuses[standby])
                             .splitlines()))
    first = outcome.files[next(iter(demo.BOTS))][-1]
    click.echo(f"\nthe files stay in {root} (remove it when done):")
    click.echo(f"  check a copy as the runbook does:  syncd verify {first}")
    click.echo(f"  node logs: {root}/<host>/syncd.log, broker log: {root}/broker.log")
    if not outcome.identical:
        sys.exit(1)
