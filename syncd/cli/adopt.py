"""`syncd adopt KEY --from NODE`: resolve a divergence or reset by taking NODE's copy.

Run it on the host whose copy should lose, with the bot stopped there. The local copy is moved
into `<state_dir>/archive/` with a manifest (never deleted), NODE's whole copy is fetched and
verified by digest, and replication resumes. `--from` this host's own node name keeps the local
copy as it is now instead (after a deliberate reset, say).

It asks before archiving, unless --yes: the local copy stops being the file the bot uses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from syncd.cli.common import KeyCommand, config_option, load_or_exit
from syncd.config import SOCKET_NAME
from syncd.core.safe_text import safe
from syncd.ops.control import ControlError, stream


@click.command("adopt", cls=KeyCommand)
@click.argument("key")
@click.option("--from", "source", required=True, metavar="NODE",
              help="The node whose copy wins (this node's own name keeps the local copy).")
@config_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask before archiving the local copy.")
def command(key: str, source: str, config_path: Path, yes: bool) -> None:
    """Archive this host's copy of KEY and take NODE's copy instead.

    \b
    Exit status:
      0  adopted (or, with --from this node, the local copy kept)
      1  refused or not confirmed (unknown or offline NODE, not a replicated key, no
         progress for 60 s), or failed; the message says which
      2  the daemon could not be asked, or the config is not usable
    """
    config = load_or_exit(config_path)
    if source != config.node and not yes:
        question = (f"Archive this host's copy of {key} (into {config.state_dir}/archive/) and "
                    f"replace it with {source}'s? Stop the bot on this host first.")
        if not sys.stdin.isatty():
            click.echo(f"syncd adopt: {question}\nsyncd adopt: not a terminal, nothing "
                       "changed: confirm with --yes", err=True)
            sys.exit(1)
        if not click.confirm(question, default=False, err=True):
            click.echo("syncd adopt: nothing changed", err=True)
            sys.exit(1)
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
                                        label=safe(f"{shown} from {source}"), file=sys.stderr,
                                        show_pos=True)
            if bar is not None:
                bar.length = max(progress["total"], 1)
                bar.update(progress["done"] - bar.pos)
        else:
            raise ControlError("syncd closed the connection before adopting finished")
    except ControlError as e:
        if bar is not None:
            bar.render_finish()
        click.echo(f"syncd adopt: {safe(e)}", err=True)
        sys.exit(1 if "not running" not in str(e) else 2)
    if bar is not None:
        bar.render_finish()
    for result in reply["adopted"]:
        name = safe(f"{key}/{result['file']}")
        if result["archive"]:
            click.echo(f"{name}: local copy archived at {safe(result['archive'])}; now identical "
                       f"to {safe(source)}'s copy ({result['size']} bytes)")
        else:
            click.echo(f"{name}: keeping the local copy ({result['size']} bytes); peers with "
                       "another history stay diverged until they adopt it")
