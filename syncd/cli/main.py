"""The command group; each command lives in its own module and is registered here."""

from __future__ import annotations

import click

from syncd import __version__
from syncd.cli import (
    adopt,
    check_config,
    demo,
    forget,
    inspect,
    keygen,
    reload,
    run,
    status,
    verify,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="syncd")
def main() -> None:
    """Replicate append-only JSONL memory logs between hosts over MQTT."""


for _module in (run, reload, status, adopt, forget, verify, inspect, check_config, keygen, demo):
    main.add_command(_module.command)
