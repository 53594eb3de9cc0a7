from __future__ import annotations

from pathlib import Path

import pytest

from syncd.config import ConfigError, load_config

GOOD = """\
node = "host-a"
runtimes_dir = "/srv/runtimes"
state_dir = "state"
identity_file = "identity.key"

[mqtt]
host = "broker.local"
port = 1883
topic_prefix = "site/syncd"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "syncd.toml"
    p.write_text(text)
    return p


def test_minimal_config_and_defaults(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, GOOD))
    assert c.node == "host-a"
    assert c.key_dir("bot-1") == Path("/srv/runtimes/bot-1")  # one root: keys unprefixed
    assert c.state_dir == tmp_path / "state"  # relative to the config file
    assert c.mqtt.topic_prefix == "site/syncd"
    assert c.client_id == "syncd-host-a"
    assert c.files == ("events.jsonl",)
    assert c.chunk_bytes < 1 << 20  # below EMQX's default 1 MB packet cap
    # A catch-up's answers in larger frames, with room for their headers below 1 MiB.
    assert c.fill_bytes == 1000 * 1024 and c.fill_bytes + 8192 < 1 << 20
    assert c.fetch_window_bytes == 16 * c.fill_bytes
    assert c.wants_key("bot-1") and not c.wants_key("..") and not c.wants_key("a//b")
    assert c.wants_key(".x")  # the writer may create it: a name like any other
    assert c.identity_file == tmp_path / "identity.key"  # as given, relative to the config
    assert c.peers == {} and c.secret_file is None


def test_peers_and_the_default_identity_file(tmp_path: Path) -> None:
    from tests.support.cluster import node_identity

    key = node_identity("host-b").public
    text = GOOD.replace('identity_file = "identity.key"\n', "")
    c = load_config(write(tmp_path, text + f'[peers]\nhost-b = "{key}"\n'))
    assert c.identity_file == tmp_path / "state" / "identity.key"  # in state_dir
    assert c.peers == {"host-b": key}
    assert list(c.peer_keys()) == ["host-b"]


def test_include_exclude_and_per_key_files(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, GOOD.replace(
        '[mqtt]', 'include = ["bot-*"]\nexclude = ["bot-test*"]\n'
                  '[keys.special]\nfiles = ["events.jsonl", "extra.jsonl"]\n[mqtt]')))
    assert c.wants_key("bot-1")
    assert not c.wants_key("bot-test-1")
    assert not c.wants_key("other")
    assert c.wants_key("special")
    assert c.files_of("special") == ("events.jsonl", "extra.jsonl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace('node = "host-a"\n', ""), "syncd.toml: node: is required"),
        (GOOD.replace("port = 1883", "port = 99999"),
         "syncd.toml:8: mqtt.port: must be between 1 and 65535, got 99999"),
        (GOOD.replace("port = 1883", 'port = "1883"'),
         "syncd.toml:8: mqtt.port: must be an integer, got '1883'"),
        (GOOD.replace('topic_prefix = "site/syncd"', 'topic_prefix = "site/#"'),
         "syncd.toml:9: mqtt.topic_prefix: use letters"),
        (GOOD + "chunk_size = 5\n", "syncd.toml:10: mqtt.chunk_size: unknown key"),
        (GOOD + '[peers]\nhost-b = "not a key"\n',
         "syncd.toml:11: peers.host-b: not a public key: not base64"),
        (GOOD + '[peers]\nhost-b = "AAAA"\n',
         "syncd.toml:11: peers.host-b: not a public key: an Ed25519 public key is 32 bytes"),
        (GOOD + '[peers]\n"a b" = "AAAA"\n', "peers.a b: is not a valid node name"),
        (GOOD + "peers = 3\n", "mqtt.peers: unknown key"),
        ("chunk_size = 5\n" + GOOD, "syncd.toml:1: chunk_size: unknown key"),
        (GOOD.replace('node = "host-a"', 'node = "a/b"'), "syncd.toml:1: node: use letters"),
        (GOOD.replace("[mqtt]", "[mqtt"), "invalid TOML"),
        (GOOD.replace('state_dir = "state"', "state_dir = 3"),
         "syncd.toml:3: state_dir: must be a non-empty string"),
        ('files = ["../x"]\n' + GOOD, "syncd.toml:1: files: '../x' is not a plain file name"),
    ],
)
def test_errors_name_the_key_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert message in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_example_config_is_valid() -> None:
    example = Path(__file__).parents[2] / "config" / "syncd.example.toml"
    c = load_config(example)
    assert c.node
    # It shows the frame sizes' defaults without setting them (chunk_bytes set would bound
    # a catch-up's answers too).
    assert (c.chunk_bytes, c.fill_bytes, c.fetch_window_bytes) == (262144, 1024000, 16384000)


def test_tls_and_metrics(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, GOOD))
    assert not c.mqtt.tls and c.metrics.host is None
    text = GOOD.replace("port = 1883\n", "") + 'tls_ca_file = "ca.crt"\n'
    c = load_config(write(tmp_path, text + '[metrics]\nlisten = "[::1]:9100"\n'))
    assert c.mqtt.tls and c.mqtt.tls_ca_file == tmp_path / "ca.crt"
    assert c.mqtt.port == 8883  # the TLS port unless told otherwise
    assert (c.metrics.host, c.metrics.port) == ("::1", 9100)
    assert load_config(write(tmp_path, GOOD + "tls = true\n")).mqtt.tls_ca_file is None


@pytest.mark.parametrize(("text", "message"), [
    (GOOD + 'tls = false\ntls_ca_file = "ca.crt"\n',
     r"syncd.toml:\d+: mqtt.tls: is false, yet tls_\* files are set"),
    (GOOD + 'tls_key_file = "a.key"\n', r"syncd.toml:\d+: mqtt.tls_key_file: needs tls_cert_file"),
    (GOOD + 'tls = "yes"\n', r"mqtt.tls: must be true or false"),
    (GOOD + '[metrics]\nlisten = "9464"\n', r"syncd.toml:\d+: metrics.listen: must be HOST:PORT"),
    (GOOD + '[metrics]\nport = 9464\n', r"metrics.port: unknown key"),
])
def test_tls_and_metrics_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_resources_defaults_and_per_key_rules(tmp_path: Path) -> None:
    from syncd.core.resources import FileKind
    c = load_config(write(tmp_path, GOOD))
    rules = c.resources_of("any")
    assert rules is not None and rules.max_file_bytes == 32 << 20 and rules.max_depth == 32
    assert rules.kind("artifacts/t/x") is FileKind.ONCE
    c = load_config(write(tmp_path, GOOD + """
[resources]
include = ["artifacts/**"]
max_file_bytes = 1000
max_depth = 8

[keys.quiet.resources]
enabled = false

[keys.media.resources]
include = ["assets/**"]
"""))
    assert c.resources_of("other").max_file_bytes == 1000  # type: ignore[union-attr]
    assert c.resources_of("other").kind("assets/x") is None  # type: ignore[union-attr]
    assert c.resources_of("quiet") is None
    media = c.resources_of("media")
    assert media is not None and media.max_file_bytes == 1000 and media.max_depth == 8
    assert media.kind("assets/x") is FileKind.ONCE


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[resources]\nmax_file_bytes = -1\n", "resources.max_file_bytes: must be between"),
        ("[resources]\nmax_depth = 0\n", "resources.max_depth: must be between 1 and 256"),
        ("[resources]\nmax_depth = 1000\n", "resources.max_depth: must be between 1 and 256"),
        ("[resources]\ninclude = \"x\"\n", "resources.include: must be a list"),
        ("[resources]\nexlude = []\n", "resources.exlude: unknown key"),
        ("[resources]\nreplaced = [\"../*.json\"]\n", "resources.replaced: '../*.json'"),
        ("[keys.k.resources]\nenabled = 1\n", "keys.k.resources.enabled: must be true or false"),
        ("resources = 3\n", "resources: must be a table"),
    ],
)
def test_resources_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    body = GOOD if text.startswith("[") else text + GOOD
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, body + "\n" + text if text.startswith("[") else body))
    assert message in str(e.value)


def test_fill_bytes_follows_an_operators_chunk_bytes(tmp_path: Path) -> None:
    # chunk_bytes set for a broker's packet limit bounds a catch-up's answers too...
    c = load_config(write(tmp_path, GOOD.replace("[mqtt]", "chunk_bytes = 65536\n[mqtt]")))
    assert (c.chunk_bytes, c.fill_bytes, c.fetch_window_bytes) == (65536, 65536, 4 << 20)
    # ...unless fill_bytes says otherwise, never below chunk_bytes.
    c = load_config(write(tmp_path, GOOD.replace(
        "[mqtt]", "chunk_bytes = 65536\nfill_bytes = 131072\n[mqtt]")))
    assert (c.fill_bytes, c.fetch_window_bytes) == (131072, 4 << 20)
    with pytest.raises(ConfigError, match="fill_bytes: must be between 65536 and"):
        load_config(write(tmp_path, GOOD.replace(
            "[mqtt]", "chunk_bytes = 65536\nfill_bytes = 4096\n[mqtt]")))
