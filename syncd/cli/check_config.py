"""`syncd check-config`: is this config usable? Checked without starting or changing anything.

Beyond what loading checks (syntax, keys, values), it looks at what `syncd run` will need:
runtimes_dir readable and writable, state_dir writable or creatable, the secret, password and
TLS files readable and well-formed. Permissions are those of the user running the check, so
run it as the service's user. With --broker it also connects and sends probes (brokercheck.py).
Exit 0 usable, 1 the broker check failed, 2 the config is not usable (every problem on its own
line).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import sys
from pathlib import Path

import click

from syncd import brokercheck, tls
from syncd.cli.common import config_option
from syncd.config import Config, ConfigError, _line_of, load_config
from syncd.secret import SecretError, load_secret

EXIT_OK = 0
EXIT_BROKER = 1
EXIT_UNUSABLE = 2

_RWX = os.R_OK | os.W_OK | os.X_OK
_LEADING_KEY = re.compile(r"([a-z_]+)(?:\.([a-z_]+))?[ :/]")


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _state_dir_problem(sd: Path) -> str | None:
    if sd.exists():
        if not sd.is_dir():
            return f"{sd} exists and is not a directory"
        return None if os.access(sd, _RWX) else f"{sd} is not writable by {_user()}"
    parent = sd.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{sd} does not exist and cannot be created: {parent} is not writable by {_user()}"
    return None


def problems(config: Config) -> list[str]:
    """What would stop `syncd run`, each message starting with the key it is about."""
    found = []
    rt = config.runtimes_dir
    if not rt.is_dir():
        found.append(f"runtimes_dir: {rt} does not exist or is not a directory")
    elif not os.access(rt, _RWX):
        found.append(f"runtimes_dir: {rt} is not readable and writable by {_user()}")
    state = _state_dir_problem(config.state_dir)
    if state:
        found.append(f"state_dir: {state}")
    try:
        load_secret(config.secret_file)
    except SecretError as e:
        found.append(str(e))
    for check in (config.password, lambda: tls.client_context(config.mqtt)):
        try:
            check()
        except ConfigError as e:
            found.append(str(e))
    return found


def located(message: str, source: Path) -> str:
    """Prefix a problem with `file:line:` of the key it starts with, as load errors are."""
    text = source.read_text(encoding="utf-8", errors="replace")
    m = _LEADING_KEY.match(message)
    line = None
    if m:
        table, key = ("", m.group(1)) if m.group(2) is None else (m.group(1), m.group(2))
        line = _line_of(text, table, key)
    return f"{source}:{line}: {message}" if line else f"{source}: {message}"


def keys_found(config: Config) -> int:
    try:
        return sum(1 for e in os.scandir(config.runtimes_dir)
                   if e.is_dir(follow_symlinks=False) and config.wants_key(e.name))
    except OSError:
        return 0


@click.command("check-config")
@config_option
@click.option("--broker", is_flag=True,
              help="Also connect to the broker as this node and check that it carries syncd's "
                   "traffic: credentials, TLS, ACL (probes published on this node's own topics "
                   "and read back), retained messages, packet limit.")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 120),
              help="Seconds to wait for each probe (with --broker).")
def command(config_path: Path, broker: bool, timeout: float) -> None:
    """Check a config file and the paths it names, without starting anything.

    \b
    Exit status:
      0  `syncd run` could start with it (and, with --broker, the broker carries its traffic)
      1  --broker: the broker check failed (with `brokers = [...]`: on any broker of the
         list; each is checked); the message starts with the cause:
         unreachable, credentials, tls, subscribe, acl, packet_limit or retained
      2  the config or a path, secret, password or TLS file it names is not usable
    """
    try:
        config = load_config(config_path)
    except ConfigError as e:
        click.echo(f"syncd: config error: {e}", err=True)
        sys.exit(EXIT_UNUSABLE)
    found = problems(config)
    for problem in found:
        click.echo(f"syncd: config error: {located(problem, config_path)}", err=True)
    if found:
        sys.exit(EXIT_UNUSABLE)
    click.echo(f"config OK: node {config.node}, {keys_found(config)} keys found under "
               f"{config.runtimes_dir}")
    if broker:
        results = asyncio.run(brokercheck.check_all(config, timeout))
        for _endpoint, result in results:
            if isinstance(result, brokercheck.BrokerProblem):
                click.echo(f"syncd: broker check failed: {result.cause}: {result}", err=True)
            else:
                click.echo(f"broker OK: {'; '.join(result)}")
        bad = [str(b) for b, r in results if isinstance(r, brokercheck.BrokerProblem)]
        if len(results) > 1:
            good = [str(b) for b, r in results if not isinstance(r, brokercheck.BrokerProblem)]
            click.echo(f"brokers: {len(good)} of {len(results)} reachable and usable"
                       f"{': ' + ', '.join(good) if good else ''}"
                       f"{'; NOT usable: ' + ', '.join(bad) if bad else ''}")
        if bad:
            sys.exit(EXIT_BROKER)
    if os.geteuid() == 0:
        click.echo("note: checked as root, who may read and write anything; to check the "
                   "service's permissions: sudo -u syncd syncd check-config --config "
                   f"{config_path}", err=True)
