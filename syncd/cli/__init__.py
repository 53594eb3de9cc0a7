"""The `syncd` command line: one module per command, registered on one group here."""

from __future__ import annotations

import click

from syncd import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="syncd")
def main() -> None:
    """Replicate append-only JSONL memory logs between hosts over MQTT."""


def _register() -> None:
    # Imported here so that each command lives in its own module (cli/run.py, cli/status.py, …).
    from syncd.cli import run, status

    for module in (run, status):
        main.add_command(module.command)


_register()
