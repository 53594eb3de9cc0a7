"""`syncd keygen`: make this host's signing key (once) and print its line for [peers].

Idempotent: an existing identity_file is read, never replaced, so running it again prints the
same line. The private key never leaves the file; the one printed line is public and goes into
the `[peers]` table of every host's config (this one included).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from syncd.cli.common import config_option, load_or_exit
from syncd.core.identity import IdentityError
from syncd.disk.keyfile import create_identity, load_identity


@click.command("keygen")
@config_option
def command(config_path: Path) -> None:
    """Create identity_file when missing; print `<node> <public key>` (one line).

    \b
    The line goes into [peers] on every host, as:  <node> = "<public key>"
    Exit status: 0 printed; 2 the config or the identity file is not usable.
    """
    config = load_or_exit(config_path)
    path = config.identity_file
    try:
        if os.path.lexists(path):
            identity = load_identity(path)
        else:
            identity = create_identity(path)
            click.echo(f"syncd keygen: created {path} (mode 600; keep it private, back it up "
                       "with the host's config)", err=True)
    except (IdentityError, OSError) as e:
        click.echo(f"syncd keygen: {e}", err=True)
        sys.exit(2)
    click.echo(f"{config.node} {identity.public}")
