"""Pieces shared by the commands: the --config option and loading it with a clear error."""

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
