"""`syncd reload`: check the config, then have the running daemon re-read it.

This is the unit's ExecReload: it needs nothing outside the package (a minimal Debian has no
/bin/kill) and it fails visibly. A config that `syncd run` would refuse is reported here,
with its file, line and key, and the daemon is not touched; otherwise the daemon is asked
through its control socket (as the same user, inside the same sandbox, so no signal rights
or PID file are needed), re-reads the same file, and says what it applied.

Exit status: 0 reloaded; 1 the daemon could not be asked or refused; 2 the config is wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from syncd.cli.common import config_option, load_or_exit
from syncd.config import SOCKET_NAME, ConfigError
from syncd.core.safe_text import safe
from syncd.net import tls
from syncd.ops.control import ControlError, query


@click.command("reload")
@config_option
def command(config_path: Path) -> None:
    """Check the config file, then make the running daemon apply it."""
    config = load_or_exit(config_path)
    try:  # what `syncd run` checks at start, so that a reload never accepts less
        config.password()
        tls.client_context(config.mqtt)
    except ConfigError as e:
        click.echo(f"syncd: config error: {e}", err=True)
        sys.exit(2)
    try:
        reply = query(config.state_dir / SOCKET_NAME, "reload", timeout=60,
                      config=str(config_path.resolve()))
    except ControlError as e:
        message = str(e)
        click.echo(f"syncd: reload failed: {safe(message)}", err=True)
        # The daemon's own reading of the file can still fail (edited again meanwhile).
        sys.exit(2 if message.startswith("config error:") else 1)
    click.echo(f"syncd: reloaded {safe(reply['config'])} ({reply['files']} files)")
    if reply["needs_restart"]:
        click.echo(f"syncd: {safe(', '.join(reply['needs_restart']))} changed; that takes a "
                   "restart (systemctl restart syncd)", err=True)
