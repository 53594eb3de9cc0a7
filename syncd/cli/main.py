"""The command group; each command lives in its own module, imported only when it runs.

A failover script calls `syncd status --ready` and waits on its answer: importing every
command (the daemon, metrics, the resources machinery) cost it most of a second, so the group
names the modules and loads the one a command line asks for (`--help` loads them all)."""

from __future__ import annotations

import importlib

import click

# Command name -> module under syncd.cli whose `command` it is, in the order `--help` lists.
COMMANDS = {
    "run": "run",
    "reload": "reload",
    "status": "status",
    "adopt": "adopt",
    "forget": "forget",
    "verify": "verify",
    "inspect": "inspect",
    "check-config": "check_config",
    "keygen": "keygen",
    "demo": "demo",
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command = importlib.import_module(f"syncd.cli.{module}").command
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="syncd", prog_name="syncd")
def main() -> None:
    """Replicate append-only JSONL memory logs between hosts over MQTT."""
