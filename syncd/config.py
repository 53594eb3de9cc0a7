"""The TOML configuration: parsed once, validated completely, every error names key and line."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from syncd.core import recordkinds
from syncd.core.brokers import Broker, BrokerSyntaxError, parse_brokers
from syncd.core.budget import Limits
from syncd.core.errors import SyncdError
from syncd.core.identity import parse_public
from syncd.core.names import is_valid_name, key_problem, part_problem, printable
from syncd.core.resources import Rules
from syncd.core.roots import Layout, RootSpec
from syncd.core.spot import Spot


class ConfigError(SyncdError):
    """A configuration problem, with the file, key and line in its message."""


@dataclass(frozen=True)
class MqttConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    topic_prefix: str = "syncd"
    client_id: str = ""  # default: "syncd-<node>"
    username: str | None = None
    password_file: Path | None = None
    keepalive: int = 30
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    tls: bool = False
    tls_ca_file: Path | None = None  # None: the system's CA store
    tls_cert_file: Path | None = None  # client certificate, for brokers that ask for one
    tls_key_file: Path | None = None  # None: the key is inside tls_cert_file
    # Every broker to try, in order (`brokers = [...]`, or the one of host and port);
    # host and port above are then the first of them.
    brokers: tuple[Broker, ...] = ()
    # QoS of syncd's subscriptions (it always publishes at QoS 1). 0 for NATS: there each
    # QoS 1 subscription is a replicated JetStream consumer, refused while a member is down.
    subscribe_qos: int = 1
    # Published bytes not yet acknowledged by the broker, at most; past it publishes are
    # dropped (and repaired later by anti-entropy) instead of growing memory behind a slow
    # broker.
    max_queued_bytes: int = 64 << 20
    # Positions under one keyed level per file, not the key's and file's names (topics.py);
    # every host must run a release that reads that form first (docs/protocol.md).
    hide_names: bool = False

    @property
    def endpoints(self) -> tuple[Broker, ...]:
        return self.brokers or (Broker(self.host, self.port),)


@dataclass(frozen=True)
class MetricsConfig:
    host: str | None = None  # None: no Prometheus endpoint
    port: int = 9464


ROLES = ("symmetric", "source", "replica")
# dsh-session rolls a failed batch back (truncates to the previous length): its files' new
# records wait until the file held still this long (docs/design.md, "A writer's rollback").
SETTLE_DEFAULTS: tuple[tuple[str, float], ...] = (("session.jsonl", 0.05),
                                                  ("session.jsonl.zstd", 0.05))
SETTLE_MAX = 5.0
# Default largest frame of bytes answering a fetch: a catch-up pays per frame, so answers go
# in frames four times chunk_bytes' default, yet with room for the header, the key wrap and
# the topic below the 1 MiB packet limits of the shipped Mosquitto config, NATS and EMQX.
FILL_BYTES = 1000 * 1024


@dataclass(frozen=True)
class KeyConfig:
    files: tuple[str, ...]
    role: str = "symmetric"
    writers: tuple[str, ...] | None = None  # None: every listed host
    resources: Rules | None = field(default_factory=Rules)  # None: resources/ not replicated
    records: str | None = None  # every file of the key: "lines" or "zstd-frames"; None: [records]
    settle: float | None = None  # every file of the key; None: [settle]


# The daemon's control socket, in state_dir: `status`, `reload`, `adopt` talk to it.
SOCKET_NAME = "syncd.sock"


@dataclass(frozen=True)
class Config:
    node: str
    roots: Layout  # runtimes_dir and [roots]: where instances live, and how keys name them
    state_dir: Path
    identity_file: Path
    mqtt: MqttConfig
    peers: dict[str, str] = field(default_factory=dict)  # node -> public key (base64)
    secret_file: Path | None = None  # protocol 2's shared secret: no longer used
    files: tuple[str, ...] = ("events.jsonl",)
    role: str = "symmetric"
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    keys: dict[str, KeyConfig] = field(default_factory=dict)
    chunk_bytes: int = 256 * 1024
    # Largest frame of bytes answering a fetch (a catch-up): FILL_BYTES unless chunk_bytes is
    # set, then chunk_bytes (an operator who sized frames for a broker keeps that bound).
    fill_bytes: int = FILL_BYTES
    fetch_window_bytes: int = 4 * 1024 * 1024
    watch: bool = True
    sweep_interval: float = 1.0
    scrub_bytes_per_second: int = 16 * 1024 * 1024
    scrub_interval: float = 300.0
    persist_interval: float = 5.0
    request_timeout: float = 3.0
    # Extra seconds a busy writer's appends gather before they are read and shipped, on top of
    # the group commit (daemon/window.py); 0: none.
    batch_window: float = 0.0
    metrics: MetricsConfig = MetricsConfig()
    # Who may change things through the control socket (adopt, reload), besides root and the
    # daemon's own user; `status` is for anyone who can open the socket.
    admin_group: str = "syncd-admin"
    limits: Limits = field(default_factory=Limits)  # serving peers: syncd/core/budget.py
    resources: Rules | None = field(default_factory=Rules)  # [resources]; None: disabled
    source: Path | None = None
    # [records]: (file name pattern, record kind), first match first; then `*.zstd` is frames
    records: tuple[tuple[str, str], ...] = ()
    # [settle]: (file name pattern, seconds), first match first; then SETTLE_DEFAULTS
    settle: tuple[tuple[str, float], ...] = ()

    def wants_key(self, key: str) -> bool:
        """Whether this node replicates instance `key` (`onebot_123/group_456`).

        include/exclude are matched against the whole key with fnmatch: `*` and `?` match `/`
        too, so `onebot_123/*` is every channel of that bot and `*` every key.
        """
        if key_problem(key) is not None:
            return False
        if key in self.keys:
            return True
        return any(fnmatch.fnmatchcase(key, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(key, p) for p in self.exclude
        )

    def files_of(self, key: str) -> tuple[str, ...]:
        """File names replicated inside a key's directory."""
        k = self.keys.get(key)
        return k.files if k else self.files

    def role_of(self, key: str) -> str:
        """symmetric (default), source (never takes remote bytes) or replica (never ships)."""
        k = self.keys.get(key)
        return k.role if k else self.role

    def records_of(self, key: str, file: str) -> str:
        """What one record of `file` is (core/recordkinds.py): the key's `records`, else the
        first `[records]` pattern matching the file name, else frames for `*.zstd`, else
        lines."""
        k = self.keys.get(key)
        if k is not None and k.records is not None:
            return k.records
        return recordkinds.kind_for(file, self.records)

    def settle_of(self, key: str, file: str) -> float:
        """Seconds the writer's file must hold still before its new records ship (a writer
        that rolls failed batches back: docs/design.md): the key's `settle`, else the first
        `[settle]` pattern matching the file name, else SETTLE_DEFAULTS, else 0."""
        k = self.keys.get(key)
        if k is not None and k.settle is not None:
            return k.settle
        for pattern, seconds in (*self.settle, *SETTLE_DEFAULTS):
            if fnmatch.fnmatchcase(file, pattern):
                return seconds
        return 0.0

    def resources_of(self, key: str) -> Rules | None:
        """Which files of the key's resources/ replicate, by which rule (None: none)."""
        k = self.keys.get(key)
        return k.resources if k else self.resources

    def may_write(self, key: str, node: str) -> bool:
        """Whether bytes (and positions) of `node` count for `key`: its `writers`, if set."""
        k = self.keys.get(key)
        return k is None or k.writers is None or node in k.writers
    def key_dir(self, key: str) -> Path:
        """The directory of instance `key`: the one mapping from keys to paths (core/roots.py).
        Raises KeyPathError (a ValueError) saying why when `key` names none."""
        return self.roots.folder(key)

    def key_spot(self, key: str) -> Spot:
        """The directory of instance `key` as the daemon opens it: from its root's trusted
        directory, one component at a time (disk/tree.py). KeyPathError as key_dir."""
        return self.roots.spot(key)

    def key_files(self, key: str) -> list[Path]:
        """Existing files of a key under its root (for the offline commands)."""
        d = self.key_dir(key)
        return [d / f for f in self.files_of(key) if (d / f).is_file()]

    def peer_keys(self) -> dict[str, Ed25519PublicKey]:
        """[peers] parsed (every entry was checked when the config was read)."""
        return {node: parse_public(text) for node, text in self.peers.items()}
    def all_files(self) -> frozenset[str]:
        """Every configured file name, of any key."""
        return frozenset(self.files).union(*(k.files for k in self.keys.values()))

    @property
    def client_id(self) -> str:
        return self.mqtt.client_id or f"syncd-{self.node}"

    def password(self) -> str | None:
        if self.mqtt.password_file is None:
            return None
        try:
            return self.mqtt.password_file.read_text().strip()
        except OSError as e:
            raise ConfigError(f"mqtt.password_file: cannot read {self.mqtt.password_file}: "
                              f"{e.strerror}") from None


_TOP = {
    "node", "runtimes_dir", "state_dir", "secret_file", "identity_file", "peers", "files",
    "include", "exclude",
    "chunk_bytes", "fill_bytes", "fetch_window_bytes", "sweep_interval", "scrub_bytes_per_second",
    "scrub_interval", "persist_interval", "request_timeout", "mqtt", "keys", "role", "watch",
    "metrics", "roots", "admin_group", "limits", "resources", "batch_window", "records",
    "settle",
}
_MQTT = {
    "host", "port", "brokers", "topic_prefix", "client_id", "username", "password_file",
    "keepalive", "reconnect_min", "reconnect_max", "tls", "tls_ca_file", "tls_cert_file",
    "tls_key_file", "subscribe_qos", "max_queued_bytes", "hide_names",
}
_KEY = {"files", "role", "writers", "resources", "records", "settle"}
_RESOURCES = {"enabled", "include", "exclude", "replaced", "max_file_bytes", "max_depth"}
_LIMITS = {"requests_per_second", "request_burst", "bytes_per_second", "byte_burst",
           "max_keys", "min_free_bytes", "max_peer_bytes", "max_resource_files"}
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
_PREFIX = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")
_LISTEN = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})")


class _Reader:
    """Typed access to one table that reports errors as 'file:line: key: problem'."""

    def __init__(self, path: Path, text: str, table: dict[str, Any], dotted: str) -> None:
        self.path, self.source, self.table, self.dotted = path, text, table, dotted

    def error(self, key: str, problem: str) -> ConfigError:
        name = f"{self.dotted}.{key}" if self.dotted else key
        line = _line_of(self.source, self.dotted, key)
        where = f"{self.path}:{line}" if line else str(self.path)
        return ConfigError(f"{where}: {name}: {problem}")

    def check_known(self, known: set[str]) -> None:
        for key in self.table:
            if key not in known:
                raise self.error(key, f"unknown key (known: {', '.join(sorted(known))})")

    def text(
        self, key: str, default: str | None = None, *, required: bool = False
    ) -> str | None:
        if key not in self.table:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.table[key]
        if not isinstance(value, str) or not value:
            raise self.error(key, "must be a non-empty string")
        return value

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        value = self.table.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, f"must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self.error(key, f"must be between {lo} and {hi}, got {value}")
        return value

    def number(self, key: str, default: float, lo: float, hi: float) -> float:
        value = self.table.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(key, f"must be a number, got {value!r}")
        if not lo <= value <= hi:
            raise self.error(key, f"must be between {lo} and {hi}, got {value}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.table.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.table.get(key, default)
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    def globs(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.table.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, "must be a list of non-empty strings")
        return tuple(value)

    def path_(self, key: str, base: Path, *, required: bool = False) -> Path | None:
        value = self.text(key, required=required)
        if value is None:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else (base / p)


def _line_of(text: str, table: str, key: str) -> int | None:
    """Line number of `key = ` inside `[table]` (best effort: tomllib gives no positions)."""
    header = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")
    assign = re.compile(r"^\s*(\"?)" + re.escape(key) + r"\1\s*=")
    want = table.replace('"', "")
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            current = m.group(1).replace('"', "").replace(" ", "")
            if not table and current.split(".")[0] == key:
                return n  # the key is itself a table, e.g. [mqtt]
            continue
        if current == want and assign.match(line):
            return n
    return None


def load_config(path: Path) -> Config:
    """Read and validate a config file. Raises ConfigError naming file, line and key."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return parse_config(data, path, text)


def parse_config(data: dict[str, Any], path: Path, text: str = "") -> Config:
    base = path.parent.resolve()
    top = _Reader(path, text, data, "")
    top.check_known(_TOP)
    node = top.text("node", required=True)
    assert node is not None
    if not is_valid_name(node):
        raise top.error("node", "use letters, digits, '.', '_' or '-' (at most 128)")
    roots = _roots(top, _Reader(path, text, data.get("roots", {}), "roots"), base)
    state_dir = top.path_("state_dir", base, required=True)
    assert state_dir is not None
    # Default: in state_dir, which the service's user owns (the config's directory is not
    # writable by it), so `sudo -u syncd syncd keygen` can create it.
    identity_file = top.path_("identity_file", base) or state_dir / "identity.key"
    peers = _peers(top, data.get("peers", {}), _Reader(path, text, {}, "peers"))

    mqtt_table = data.get("mqtt", {})
    if not isinstance(mqtt_table, dict):
        raise top.error("mqtt", "must be a table ([mqtt])")
    m = _Reader(path, text, mqtt_table, "mqtt")
    m.check_known(_MQTT)
    prefix = m.text("topic_prefix", "syncd")
    assert prefix is not None
    if not _PREFIX.fullmatch(prefix):
        raise m.error("topic_prefix", "use letters, digits, '_', '-' and '/' between levels "
                                      "(no wildcards, no leading or trailing '/')")
    client_id = m.text("client_id", "") or ""
    reconnect_min = m.number("reconnect_min", 0.5, 0.01, 3600)
    tls_files = {k: m.path_(k, base) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file")}
    tls = m.flag("tls", any(tls_files.values()))
    if not tls and any(tls_files.values()):
        raise m.error("tls", "is false, yet tls_* files are set (remove them, or tls = true)")
    if tls_files["tls_key_file"] and not tls_files["tls_cert_file"]:
        raise m.error("tls_key_file", "needs tls_cert_file (the certificate of that key)")
    brokers = _brokers(m, 8883 if tls else 1883)
    mqtt = MqttConfig(
        host=brokers[0].host,
        port=brokers[0].port,
        brokers=brokers,
        topic_prefix=prefix,
        client_id=client_id,
        username=m.text("username"),
        password_file=m.path_("password_file", base),
        keepalive=m.integer("keepalive", 30, 1, 3600),
        reconnect_min=reconnect_min,
        reconnect_max=m.number("reconnect_max", 30.0, reconnect_min, 3600),
        tls=tls,
        tls_ca_file=tls_files["tls_ca_file"],
        tls_cert_file=tls_files["tls_cert_file"],
        tls_key_file=tls_files["tls_key_file"],
        subscribe_qos=m.integer("subscribe_qos", 1, 0, 1),
        max_queued_bytes=m.integer("max_queued_bytes", 64 << 20, 1 << 20, 1 << 40),
        hide_names=m.flag("hide_names", False),
    )
    metrics = _metrics(top, _Reader(path, text, data.get("metrics", {}), "metrics"))
    limits = _limits(top, _Reader(path, text, data.get("limits", {}), "limits"))
    admin_group = top.text("admin_group", "syncd-admin")
    assert admin_group is not None
    if not _GROUP.fullmatch(admin_group):
        raise top.error("admin_group", f"{admin_group!r} is not a group name")

    files = top.globs("files", ("events.jsonl",))
    role = top.choice("role", "symmetric", ROLES)
    for f in files:
        if (problem := part_problem(f)) is not None:
            raise top.error("files", f"'{printable(f)}' is not a plain file name inside the key "
                                     f"directory: {problem}")
    resources = _resources(top, data.get("resources", {}), path, text, "resources", Rules())
    records_table = data.get("records", {})
    if not isinstance(records_table, dict):
        raise top.error("records", 'must be a table of file name patterns ("*.zstd" = '
                                   '"zstd-frames")')
    rec = _Reader(path, text, records_table, "records")
    records = tuple((pattern, rec.choice(pattern, recordkinds.LINES, recordkinds.KINDS))
                    for pattern in records_table)
    settle_table = data.get("settle", {})
    if not isinstance(settle_table, dict):
        raise top.error("settle", 'must be a table of file name patterns ("session.jsonl" = '
                                  '0.05)')
    held = _Reader(path, text, settle_table, "settle")
    settle = tuple((pattern, held.number(pattern, 0, 0, SETTLE_MAX)) for pattern in settle_table)
    keys_table = data.get("keys", {})
    if not isinstance(keys_table, dict):
        raise top.error("keys", "must be a table of tables ([keys.<name>])")
    keys: dict[str, KeyConfig] = {}
    for name, table in keys_table.items():
        if (problem := roots.shape_problem(name)) is not None:
            raise top.error("keys", f"'{printable(name)}' is not a valid instance key: {problem}")
        if not isinstance(table, dict):
            raise top.error("keys", f"keys.{name} must be a table")
        k = _Reader(path, text, table, f"keys.{name}")
        k.check_known(_KEY)
        key_files = k.globs("files", files)
        for f in key_files:
            if (problem := part_problem(f)) is not None:
                raise k.error("files", f"'{printable(f)}' is not a plain file name: {problem}")
        writers = None
        if "writers" in table:
            writers = k.globs("writers", ())
            for w in writers:
                if not is_valid_name(w):
                    raise k.error("writers", f"{w!r} is not a node name")
        key_resources = _resources(k, table.get("resources", {}), path, text,
                                   f"keys.{name}.resources", resources)
        key_records = (k.choice("records", recordkinds.LINES, recordkinds.KINDS)
                       if "records" in table else None)
        key_settle = k.number("settle", 0, 0, SETTLE_MAX) if "settle" in table else None
        keys[name] = KeyConfig(files=key_files, role=k.choice("role", role, ROLES),
                               writers=writers, resources=key_resources, records=key_records,
                               settle=key_settle)

    chunk = top.integer("chunk_bytes", 256 * 1024, 4096, 16 * 1024 * 1024)
    fill = top.integer("fill_bytes", chunk if "chunk_bytes" in top.table else FILL_BYTES,
                       chunk, 16 * 1024 * 1024)
    return Config(
        node=node,
        roots=roots,
        state_dir=state_dir,
        identity_file=identity_file,
        peers=peers,
        secret_file=top.path_("secret_file", base),
        mqtt=mqtt,
        files=files,
        role=role,
        include=top.globs("include", ("*",)),
        exclude=top.globs("exclude", ()),
        keys=keys,
        chunk_bytes=chunk,
        fill_bytes=fill,
        fetch_window_bytes=top.integer("fetch_window_bytes", max(16 * fill, 4 << 20), chunk,
                                   1 << 30),
        watch=top.flag("watch", True),
        sweep_interval=top.number("sweep_interval", 1.0, 0.05, 3600),
        scrub_bytes_per_second=top.integer("scrub_bytes_per_second", 16 << 20, 0, 1 << 40),
        scrub_interval=top.number("scrub_interval", 300.0, 1, 86400 * 7),
        persist_interval=top.number("persist_interval", 5.0, 0.05, 3600),
        request_timeout=top.number("request_timeout", 3.0, 0.1, 3600),
        batch_window=top.number("batch_window", 0.0, 0, 0.5),
        records=records,
        settle=settle,
        metrics=metrics,
        admin_group=admin_group,
        limits=limits,
        resources=resources,
        source=path,
    )


def _brokers(m: _Reader, default_port: int) -> tuple[Broker, ...]:
    """`brokers = ["host:port", ...]`, or the single `host` and `port` (not both forms)."""
    if "brokers" not in m.table:
        host = m.text("host", "127.0.0.1") or "127.0.0.1"
        return (Broker(host.strip("[]"), m.integer("port", default_port, 1, 65535)),)
    single = [k for k in ("host", "port") if k in m.table]
    if single:
        lines = [f"{k} on line {n}" if (n := _line_of(m.source, m.dotted, k)) else k
                 for k in single]
        raise m.error("brokers", f"cannot be combined with {' and '.join(lines)}: list "
                                 "every broker in brokers (\"host:port\"), or use host and "
                                 "port alone for one broker")
    value = m.table["brokers"]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise m.error("brokers", 'must be a list of "host:port" strings, such as '
                                 '["mqtt-1.internal:8883", "[::1]:1883"]')
    try:
        return parse_brokers(value, default_port)
    except BrokerSyntaxError as e:
        raise m.error("brokers", str(e)) from None


def _peers(top: _Reader, table: Any, p: _Reader) -> dict[str, str]:
    """[peers]: node = "public key", one line per host allowed in the cluster."""
    if not isinstance(table, dict):
        raise top.error("peers", 'must be a table ([peers], lines of node = "public key")')
    p.table = table
    peers: dict[str, str] = {}
    for node, text in table.items():
        if not is_valid_name(node):
            raise p.error(node, "is not a valid node name")
        if not isinstance(text, str):
            raise p.error(node, 'must be the public key text `syncd keygen` prints, in quotes')
        try:
            parse_public(text)
        except ValueError as e:
            raise p.error(node, f"not a public key: {e}") from None
        peers[node] = text.strip()
    return peers
def _roots(top: _Reader, table: _Reader, base: Path) -> Layout:
    """runtimes_dir (a path, a glob, or a list of them) and [roots] (name = path): see core/roots.py
    for how each names its keys."""
    raw = top.table.get("runtimes_dir")
    if raw is None and "roots" not in top.table:
        raise top.error("runtimes_dir", "is required (or name the roots in a [roots] table)")
    specs: list[RootSpec] = []
    listed = isinstance(raw, list)
    if raw is not None:
        entries = raw if isinstance(raw, list) else [raw]
        if not entries or not all(isinstance(e, str) and e for e in entries):
            raise top.error("runtimes_dir", "must be a path, a glob with one '*' (a root per "
                                            "match), or a non-empty list of them")
        for entry in entries:
            spec = RootSpec(_absolute(entry, base))
            if (problem := spec.problem()) is not None:
                raise top.error("runtimes_dir", f"{entry!r}: {problem}")
            if listed and not spec.is_glob:
                # In a list every root prefixes its keys; a plain path by its own name.
                spec = RootSpec(spec.pattern, spec.pattern.name)
                if (bad := part_problem(spec.pattern.name)) is not None:
                    raise top.error("runtimes_dir", f"{entry!r}: its last component cannot "
                                                    f"name a root: {bad}")
            specs.append(spec)
    if not isinstance(table.table, dict):
        raise top.error("roots", "must be a table ([roots], one name = \"path\" per root)")
    for name, value in table.table.items():
        if not isinstance(value, str) or not value:
            raise table.error(name, "must be the path of a directory")
        if "*" in value:
            raise table.error(name, "a [roots] entry is one directory (for a glob, use "
                                    "runtimes_dir)")
        if (problem := part_problem(name)) is not None:
            raise table.error(name, f"'{printable(name)}' cannot name a root: {problem}")
        specs.append(RootSpec(_absolute(value, base), name, in_table=True))
    names = [s.name for s in specs if s.name is not None]
    for name in names:
        if names.count(name) > 1:
            raise top.error("roots" if name in table.table else "runtimes_dir",
                            f"two roots are named {name!r}: keys would collide (name them "
                            "in [roots])")
    patterns = [s.pattern for s in specs]
    for p in patterns:
        if patterns.count(p) > 1:
            raise top.error("runtimes_dir", f"{p} is listed twice")
    if not specs:
        raise top.error("roots", "names no root")
    prefixed = not (isinstance(raw, str) and len(specs) == 1 and not specs[0].is_glob)
    return Layout(tuple(specs), prefixed)


def _absolute(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _metrics(top: _Reader, m: _Reader) -> MetricsConfig:
    if not isinstance(m.table, dict):
        raise top.error("metrics", "must be a table ([metrics])")
    m.check_known({"listen"})
    listen = m.text("listen")
    if listen is None:
        return MetricsConfig()
    found = _LISTEN.fullmatch(listen)
    if not found or not 1 <= int(found.group(2)) <= 65535:
        raise m.error("listen", f"must be HOST:PORT such as 127.0.0.1:9464 or [::1]:9464, "
                                f"got {listen!r}")
    return MetricsConfig(found.group(1).strip("[]"), int(found.group(2)))


def _resources(parent: _Reader, table: Any, path: Path, text: str, dotted: str,
               default: Rules | None) -> Rules | None:
    """[resources] (or [keys."k".resources], whose defaults are [resources])."""
    if not isinstance(table, dict):
        raise parent.error("resources", "must be a table ([resources])")
    r = _Reader(path, text, table, dotted)
    r.check_known(_RESOURCES)
    base = default or Rules()
    if not r.flag("enabled", default is not None):
        return None
    globs = {}
    for name in ("include", "exclude", "replaced"):
        globs[name] = r.globs(name, getattr(base, name))
        for g in globs[name]:
            if g.startswith("/") or ".." in g.split("/"):
                raise r.error(name, f"{g!r}: patterns are relative to resources/ "
                                    "(no leading '/', no '..')")
    return Rules(include=globs["include"], exclude=globs["exclude"],
                 replaced=globs["replaced"],
                 max_file_bytes=r.integer("max_file_bytes", base.max_file_bytes, 0, 1 << 40),
                 max_depth=r.integer("max_depth", base.max_depth, 1, 256))


def _limits(top: _Reader, lim: _Reader) -> Limits:
    if not isinstance(lim.table, dict):
        raise top.error("limits", "must be a table ([limits])")
    lim.check_known(_LIMITS)
    d = Limits()
    return Limits(
        requests_per_second=lim.number("requests_per_second", d.requests_per_second, 0, 1e6),
        request_burst=lim.integer("request_burst", d.request_burst, 1, 1 << 30),
        bytes_per_second=lim.integer("bytes_per_second", d.bytes_per_second, 0, 1 << 40),
        byte_burst=lim.integer("byte_burst", d.byte_burst, 1, 1 << 40),
        max_keys=lim.integer("max_keys", d.max_keys, 1, 1 << 24),
        min_free_bytes=lim.integer("min_free_bytes", d.min_free_bytes, 0, 1 << 50),
        max_peer_bytes=lim.integer("max_peer_bytes", d.max_peer_bytes, 1 << 20, 1 << 40),
        max_resource_files=lim.integer("max_resource_files", d.max_resource_files, 1,
                                       1 << 24),
    )
