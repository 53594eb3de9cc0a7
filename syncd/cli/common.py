"""Pieces shared by the commands: the --config option and loading it with a clear error, and
KeyCommand, the command class of the commands that take KEYs (which may begin with `-`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from syncd.config import Config, ConfigError, load_config

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CONFIG = Path("/etc/syncd/syncd.toml")


def config_option(f: F) -> F:
    return click.option(
        "--config", "config_path", type=click.Path(path_type=Path), default=DEFAULT_CONFIG,
        show_default=True, help="The syncd TOML config file.",
    )(f)


def key_config_option(f: F) -> F:
    """--config for the offline commands: the same default as every other command, read only
    to name a KEY (a PATH needs no config at all)."""
    return click.option(
        "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
        default=DEFAULT_CONFIG, show_default=True,
        help="The syncd TOML config file; read only when naming an instance KEY.",
    )(f)


def load_or_exit(path: Path) -> Config:
    try:
        return load_config(path)
    except ConfigError as e:
        click.echo(f"syncd: config error: {e}", err=True)
        sys.exit(2)


class KeyCommand(click.Command):
    """A command whose arguments are KEYs or PATHs, which may begin with `-`: a dsh-session key
    is `--<normalized cwd>--/<session id>` (issue #27). Any word that is not one of this
    command's options (nor the value of one) is an argument, wherever it stands, so that
    `syncd status --ready --home-a-proj--/s1` and `syncd adopt --home-a-proj--/s1 --from b`
    work as typed; `--` still ends the options, as everywhere."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options: dict[str, click.Option] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                for name in (*param.opts, *param.secondary_opts):
                    options[name] = param
        front: list[str] = []
        words: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                words += args[i + 1:]
                break
            option = options.get(arg.split("=", 1)[0]) if arg.startswith("-") else None
            if option is not None:
                front.append(arg)
                takes_value = not option.is_flag and not option.count and "=" not in arg
                if takes_value and i + 1 < len(args):
                    front.append(args[i + 1])
                    i += 1
            else:
                words.append(arg)
            i += 1
        return super().parse_args(ctx, [*front, "--", *words] if words else front)
