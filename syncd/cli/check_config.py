"""`syncd check-config`: is this config usable? Checked without starting or changing anything.

Beyond what loading checks (syntax, keys, values), it looks at what `syncd run` will need:
runtimes_dir readable and writable, state_dir writable or creatable, the identity file private
and matching [peers], the password and TLS files readable and well-formed. It then counts the
instance keys found under the roots (nested up to roots.MAX_DEPTH levels) and names every
directory that cannot be replicated, with the reason (a name that is not UTF-8, a symbolic
link, too deep, unreadable), and the directories the watcher will watch against the kernel's
inotify limits, warning with the sysctl to raise when they are too low (core/oslimits.py).
Permissions are those of the user running the check, so run it as the service's user. With
--broker it also connects and sends probes (ops/brokercheck.py). Exit 0 usable (warnings
included), 1 the broker check failed, 2 the config is not usable (every problem on its own
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

from syncd.cli.common import config_option
from syncd.config import Config, ConfigError, _line_of, load_config
from syncd.core.identity import IdentityError
from syncd.core.names import printable
from syncd.core.oslimits import INSTANCES, WATCHES, shortfalls
from syncd.core.roots import MAX_DEPTH
from syncd.daemon.host import watch_depth
from syncd.disk.discovery import Scanner, root_problems
from syncd.disk.keyfile import load_identity
from syncd.disk.oslimits import count_directories, inotify_limits
from syncd.net import tls
from syncd.ops import brokercheck

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
    found = [f"{where}: {problem}" for where, problem in root_problems(config.roots, _user())]
    state = _state_dir_problem(config.state_dir)
    if state:
        found.append(f"state_dir: {state}")
    found.extend(identity_problems(config))
    for check in (config.password, lambda: tls.client_context(config.mqtt)):
        try:
            check()
        except ConfigError as e:
            found.append(str(e))
    return found


def identity_problems(config: Config) -> list[str]:
    """The host's key is usable, [peers] lists somebody, and lists this host's key right."""
    try:
        identity = load_identity(config.identity_file)
    except IdentityError as e:
        return [str(e)]
    listed = config.peers.get(config.node)
    if listed is not None and listed != identity.public:
        return [f"peers: lists another public key for {config.node} than identity_file "
                f"{config.identity_file} holds ({identity.public})"]
    if not set(config.peers) - {config.node}:
        return ["peers: lists no other host: add one line per host, node = \"<public key>\" "
                "(syncd keygen prints each host's line)"]
    return []


def located(message: str, source: Path) -> str:
    """Prefix a problem with `file:line:` of the key it starts with, as load errors are."""
    text = source.read_text(encoding="utf-8", errors="replace")
    m = _LEADING_KEY.match(message)
    line = None
    if m:
        table, key = ("", m.group(1)) if m.group(2) is None else (m.group(1), m.group(2))
        line = _line_of(text, table, key)
    return f"{source}:{line}: {message}" if line else f"{source}: {message}"


# How much deeper than the daemon looks, to name instances too deep to be replicated.
PROBE_DEPTH = 4


def survey(config: Config) -> list[str]:
    """What the daemon would find: keys, roots, and every directory it would skip."""
    scan = Scanner(config.roots, config.files_of, config.all_files(), PROBE_DEPTH).scan()
    keys = [i.key for i in scan.instances if config.wants_key(i.key)]
    excluded = len(scan.instances) - len(keys)
    lines = [f"{len(keys)} {'key' if len(keys) == 1 else 'keys'} found under "
             f"{config.roots.describe()}, up to {MAX_DEPTH} levels deep"
             + (f" ({excluded} more excluded by include/exclude)" if excluded else "")]
    if not scan.instances:
        lines += no_keys_hint(config)
    if config.roots.prefixed:
        roots = ", ".join(f"{r.name} = {r.path}" for r in scan.roots)
        lines.append(f"roots (each key starts with its root's name): {roots or 'none yet'}")
    if scan.skipped:
        n = len(scan.skipped)
        lines.append(f"{n} {'directory' if n == 1 else 'directories'} skipped, not replicated:")
        lines += [f"  {printable(str(s.folder))}" + (f" (key {s.key})" if s.key else "")
                  + f": {s.reason}" for s in scan.skipped]
    return lines


# Bounds of the look for file names when no key is found (a root may be a huge tree).
NAMES_SCANNED = 20_000  # directory entries looked at, at most
NAMES_SHOWN = 8


def names_under(dirs: list[Path], depth: int) -> dict[str, int]:
    """File names of the regular files under `dirs` (at most `depth` levels down), by count:
    what a writer there writes, for a root whose configured names match nothing."""
    counts: dict[str, int] = {}
    seen = 0
    todo = [(d, 0) for d in dirs]
    while todo and seen < NAMES_SCANNED:
        folder, level = todo.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    seen += 1
                    if seen > NAMES_SCANNED:
                        break
                    if entry.is_dir(follow_symlinks=False):
                        if level < depth:
                            todo.append((Path(entry.path), level + 1))
                    elif entry.is_file(follow_symlinks=False):
                        counts[entry.name] = counts.get(entry.name, 0) + 1
        except OSError:
            continue
    return counts


def no_keys_hint(config: Config) -> list[str]:
    """Why no key was found: the file names looked for, and the names there are."""
    wanted = ", ".join(sorted(config.all_files()))
    found = names_under(config.roots.watch_dirs(), PROBE_DEPTH + 1)
    top = sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))[:NAMES_SHOWN]
    there = ", ".join(f"{printable(name)} ({n})" for name, n in top)
    more = f" and {len(found) - len(top)} more names" if len(found) > len(top) else ""
    lines = [f"no key: syncd looks for directories holding a file named {wanted} "
             "(`files`, or [keys.\"KEY\"] files)",
             f"  files under the roots: {there + more if found else 'none'}"]
    if any(n.startswith("session.jsonl") for n in found):
        lines.append('  dsh-session roots: files = ["session.jsonl.zstd", "session.jsonl"] '
                     "(see config/dsh-session.example.toml)")
    return lines


def watch_survey(config: Config) -> tuple[str, list[str]]:
    """The directories the watcher needs a watch for, the limits, and any shortfall."""
    directories = count_directories(config.roots.watch_dirs(), watch_depth(config))
    limits = inotify_limits()

    def shown(value: int | None) -> str:
        return "unknown" if value is None else str(value)

    line = (f"inotify: {directories} director{'y' if directories == 1 else 'ies'} to watch "
            f"under the roots (one watch each); {WATCHES} = {shown(limits.max_user_watches)}, "
            f"{INSTANCES} = {shown(limits.max_user_instances)}")
    return line, shortfalls(limits, directories)


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
      2  the config or a path, identity, password or TLS file it names is not usable
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
    report = survey(config)
    click.echo(f"config OK: node {config.node}, {report[0]}")
    for line in report[1:]:
        click.echo(line)
    if config.watch:
        line, warnings = watch_survey(config)
        click.echo(line)
        for warning in warnings:
            click.echo(f"syncd: warning: {warning}", err=True)
    if config.secret_file is not None:
        click.echo(f"note: secret_file is no longer used (frames are signed with each host's "
                   f"identity_file since protocol 3); remove it from {config_path}", err=True)
    if config.mqtt.hide_names:
        click.echo("note: [mqtt] hide_names is on: this host's positions go under keyed topic "
                   "levels, which hosts of an earlier release never hear; every host must run "
                   "this release (docs/protocol.md, Compatibility)", err=True)
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
