"""`syncd adopt KEY --from NODE`: resolve a divergence or reset by taking NODE's copy.

Run it on the host whose copy should lose, with the bot stopped there. The local copy is moved
into `<state_dir>/archive/` with a manifest (never deleted), NODE's whole copy is fetched and
verified by digest, and replication resumes. `--from` this host's own node name keeps the local
copy as it is now instead (after a deliberate reset, say).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from syncd.cli.common import config_option, load_or_exit
from syncd.control import ControlError, stream
from syncd.node import SOCKET_NAME


@click.command("adopt")
@click.argument("key")
@click.option("--from", "source", required=True, metavar="NODE",
              help="The node whose copy wins (this node's own name keeps the local copy).")
@config_option
def command(key: str, source: str, config_path: Path) -> None:
    """Archive this host's copy of KEY and take NODE's copy instead."""
    config = load_or_exit(config_path)
    bar = None
    shown = ""
    try:
        for reply in stream(config.state_dir / SOCKET_NAME, "adopt", timeout=60, key=key,
                            source=source):
            progress = reply.get("progress")
            if progress is None:
                break
            if progress["file"] != shown:
                if bar is not None:
                    bar.render_finish()
                shown = progress["file"]
                bar = click.progressbar(length=max(progress["total"], 1),
                                        label=f"{shown} from {source}", file=sys.stderr,
                                        show_pos=True)
            if bar is not None:
                bar.length = max(progress["total"], 1)
                bar.update(progress["done"] - bar.pos)
        else:
            raise ControlError("syncd closed the connection before adopting finished")
    except ControlError as e:
        if bar is not None:
            bar.render_finish()
        click.echo(f"syncd adopt: {e}", err=True)
        sys.exit(1 if "not running" not in str(e) else 2)
    if bar is not None:
        bar.render_finish()
    for result in reply["adopted"]:
        name = f"{key}/{result['file']}"
        if result["archive"]:
            click.echo(f"{name}: local copy archived at {result['archive']}; now identical to "
                       f"{source}'s copy ({result['size']} bytes)")
        else:
            click.echo(f"{name}: keeping the local copy ({result['size']} bytes); peers with "
                       "another history stay diverged until they adopt it")
