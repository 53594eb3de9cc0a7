"""`syncd check-config`: what an operator reads before the first start."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
from pathlib import Path

import aiomqtt
from click.testing import CliRunner, Result

from syncd.cli.main import main
from syncd.disk.keyfile import write_identity
from syncd.disk.oslimits import inotify_limits
from syncd.ops.brokercheck import classify_connect_error
from tests.support.certs import CA
from tests.support.cluster import Broker, free_port, node_identity


def setup(tmp_path: Path, extra: str = "", mqtt: str = "") -> Path:
    for key in ("bot-1", "bot-2", "scratch"):
        (tmp_path / "runtimes" / key).mkdir(parents=True)
        (tmp_path / "runtimes" / key / "events.jsonl").write_bytes(b"")
    (tmp_path / "runtimes" / "no-memory-yet").mkdir()  # not an instance (yet)
    write_identity(tmp_path / "identity.key", node_identity("host-a"))
    config = tmp_path / "syncd.toml"
    config.write_text(
        'node = "host-a"\n'
        'runtimes_dir = "runtimes"\n'
        'state_dir = "state/syncd"\n'
        'identity_file = "identity.key"\n'
        'exclude = ["scratch"]\n'
        f"{extra}"
        "[mqtt]\n"
        'host = "broker.internal"\n'
        f"{mqtt}"
        "[peers]\n"
        f'host-a = "{node_identity("host-a").public}"\n'
        f'host-b = "{node_identity("host-b").public}"\n'
    )
    return config


def check(config: Path) -> Result:
    return CliRunner().invoke(main, ["check-config", "--config", str(config)])


def inotify_line(directories: int) -> str:
    """check-config's inotify line, with this machine's limits."""
    limits = inotify_limits()
    return (f"inotify: {directories} directories to watch under the roots (one watch each); "
            f"fs.inotify.max_user_watches = {limits.max_user_watches}, "
            f"fs.inotify.max_user_instances = {limits.max_user_instances}")


def test_good_config(tmp_path: Path) -> None:
    config = setup(tmp_path)
    result = check(config)
    assert result.exit_code == 0, result.output
    assert result.stdout == (f"config OK: node host-a, 2 keys found under "
                             f"{tmp_path / 'runtimes'}, up to 4 levels deep (1 more excluded "
                             f"by include/exclude)\n{inotify_line(5)}\n")
    assert not (tmp_path / "state").exists()  # checked, not created


def test_every_key_is_counted_under_several_roots_and_every_skip_named(
    tmp_path: Path,
) -> None:
    config = setup(tmp_path)
    profiles = tmp_path / "profiles"
    keys = ["main", "onebot_123/group_456", "onebot_123/group_789", "cross_大厅", "x+y#z",
            "matrix_@bot_example.org_!room_example.org", "onebot_123 456", "UPPER.lower"]
    for n, key in enumerate(keys):
        folder = profiles / ("alice", "bob")[n % 2] / "runtimes" / key
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_bytes(b"")
    (profiles / "alice" / "runtimes" / "main" / "resources" / "events.jsonl").mkdir(
        parents=True)  # inside an instance: not counted
    bad = profiles / "bob" / "runtimes" / os.fsdecode(b"\xfe\xff")
    bad.mkdir()
    (bad / "events.jsonl").write_bytes(b"")
    (profiles / "carol").mkdir()  # no runtimes: not a root
    config.write_text(config.read_text().replace(
        'runtimes_dir = "runtimes"', 'runtimes_dir = "profiles/*/runtimes"').replace(
        'exclude = ["scratch"]', 'exclude = ["bob/UPPER.*"]'))
    result = check(config)
    assert result.exit_code == 0, result.output
    alice, bob = profiles / "alice" / "runtimes", profiles / "bob" / "runtimes"
    assert result.stdout.splitlines() == [
        f"config OK: node host-a, 7 keys found under {profiles}/*/runtimes, up to 4 levels "
        "deep (1 more excluded by include/exclude)",
        f"roots (each key starts with its root's name): alice = {alice}, bob = {bob}",
        "1 directory skipped, not replicated:",
        f"  {bob}/\\xfe\\xff (key bob/\\xfe\\xff): component '\\xfe\\xff': not valid UTF-8",
        # every directory below profiles/, the glob's base, and itself: profiles, alice, bob,
        # carol, 2 runtimes, 8 instances, 2 onebot_123, main/resources and the directory in
        # it, the undecodable one
        inotify_line(19),
    ]


def test_missing_roots_are_reported_with_their_line(tmp_path: Path) -> None:
    config = setup(tmp_path)
    config.write_text(config.read_text().replace(
        'runtimes_dir = "runtimes"', 'runtimes_dir = "nowhere/*/runtimes"')
        + '[roots]\nalice = "runtimes"\nbob = "gone"\n')
    result = check(config)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"syncd: config error: {config}:2: runtimes_dir: {tmp_path}/nowhere does not exist or "
        "is not a directory",
        f"syncd: config error: {config}:13: roots.bob: {tmp_path}/gone does not exist or is not "
        "a directory",
    ]


def test_every_path_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    config = setup(tmp_path, mqtt='password_file = "nowhere"\ntls_ca_file = "ca.pem"\n')
    (tmp_path / "runtimes").rename(tmp_path / "elsewhere")
    (tmp_path / "state").write_text("a file where a directory should be")
    (tmp_path / "identity.key").chmod(0o644)
    result = check(config)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    expected = [
        rf"{config}:2: runtimes_dir: {tmp_path}/runtimes does not exist",
        rf"{config}:3: state_dir: {tmp_path}/state/syncd does not exist and cannot be created: "
        rf"{tmp_path}/state is not writable",
        rf"{config}:4: identity_file {tmp_path}/identity.key is readable or writable by others",
        rf"{config}:8: mqtt.password_file: cannot read {tmp_path}/nowhere",
        rf"{config}:9: mqtt.tls_ca_file: cannot load {tmp_path}/ca.pem",
    ]
    assert len(lines) == len(expected), result.stderr
    for line, pattern in zip(lines, expected, strict=True):
        assert re.match("syncd: config error: " + pattern, line), line


def test_tls_files_are_loaded(tmp_path: Path) -> None:
    ca = CA(tmp_path / "pki")
    node, other = ca.issue("host-a", server=False), ca.issue("host-b", server=False)
    config = setup(tmp_path, mqtt=f'tls_ca_file = "{ca.files.cert}"\n'
                                  f'tls_cert_file = "{node.cert}"\n'
                                  f'tls_key_file = "{other.key}"\n')
    result = check(config)
    assert result.exit_code == 2
    assert re.match(rf"syncd: config error: {config}:9: mqtt.tls_cert_file/tls_key_file: "
                    rf"cannot load {node.cert} with {other.key}: KEY_VALUES_MISMATCH",
                    result.stderr), result.stderr
    config.write_text(config.read_text().replace(str(other.key), str(node.key)))
    assert check(config).exit_code == 0


def test_load_errors_are_reported_as_run_reports_them(tmp_path: Path) -> None:
    config = setup(tmp_path, extra="chunk_bytes = 1\n")
    result = check(config)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"syncd: config error: {config}:6: chunk_bytes: must be "
                                    "between")
    assert check(tmp_path / "missing.toml").exit_code == 2


def broker_config(tmp_path: Path, broker: Broker, mqtt: str = "") -> Path:
    config = setup(tmp_path, mqtt=f'port = {broker.port}\ntopic_prefix = "test/syncd"\n{mqtt}')
    config.write_text(config.read_text().replace('"broker.internal"', '"127.0.0.1"'))
    return config


def check_broker(config: Path) -> Result:
    return CliRunner().invoke(main, ["check-config", "--config", str(config), "--broker",
                                     "--timeout", "2"])


def test_broker_check_passes_on_an_open_broker(tmp_path: Path, broker: Broker) -> None:
    result = check_broker(broker_config(tmp_path, broker))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2] == (  # after config OK and inotify
        f"broker OK: connected to 127.0.0.1:{broker.port} as (anonymous); subscriptions "
        "granted; live probe published and read back; largest frame (1028231 bytes) "
        "accepted; retained probe kept (and cleared)")


def dual_stack(port: int) -> str:
    return (f"listener {port} 127.0.0.1\nlistener {port} ::1\nallow_anonymous true\n"
            "persistence false\n")


def test_broker_check_checks_every_listed_broker_and_names_the_unreachable(
    tmp_path: Path
) -> None:
    broker = Broker(tmp_path / "broker", config=dual_stack)
    broker.start()
    down = free_port()
    config = broker_config(tmp_path, broker)
    config.write_text(config.read_text().replace(
        'host = "127.0.0.1"\nport = ' f"{broker.port}\n",
        f'brokers = ["[::1]:{broker.port}", "127.0.0.1:{down}", "127.0.0.1:{broker.port}"]\n'))
    try:
        result = check_broker(config)
    finally:
        broker.stop()
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[2:] == [
        f"broker OK: connected to [::1]:{broker.port} as (anonymous); subscriptions granted; "
        "live probe published and read back; largest frame (1028231 bytes) accepted; retained "
        "probe kept (and cleared)",
        f"broker OK: connected to 127.0.0.1:{broker.port} as (anonymous); subscriptions "
        "granted; live probe published and read back; largest frame (1028231 bytes) accepted; "
        "retained probe kept (and cleared)",
        f"brokers: 2 of 3 reachable and usable: [::1]:{broker.port}, 127.0.0.1:{broker.port}; "
        f"NOT usable: 127.0.0.1:{down}",
    ]
    assert result.stderr.startswith(f"syncd: broker check failed: unreachable: broker "
                                    f"127.0.0.1:{down}: cannot connect")


def test_broker_check_names_an_acl_that_drops_our_publishes(tmp_path: Path) -> None:
    acl = tmp_path / "read-only.acl"
    acl.write_text("topic read test/syncd/#\n")
    # `user root`: Mosquitto started as root would drop to its own user, who cannot read
    # the test's files.
    broker = Broker(tmp_path / "broker", extra=f"acl_file {acl}\nuser root\n")
    broker.start()
    try:
        result = check_broker(broker_config(tmp_path, broker))
    finally:
        broker.stop()
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("syncd: broker check failed: acl: a probe published on "
                                    "test/syncd/a/host-a/syncd-check/"), result.stderr
    assert "drops this node's publishes (an ACL" in result.stderr


def test_broker_check_names_a_packet_limit_below_the_largest_frame(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker", extra="max_packet_size 100000\n")
    broker.start()
    try:
        result = check_broker(broker_config(tmp_path, broker))
        assert result.exit_code == 1, result.output
        # fill_bytes 1024000 (a catch-up's answers) + 4167 of headers + 48 for host-b's key
        # wrap + the 16-byte tag
        assert ("broker check failed: packet_limit: a probe of 1028231 bytes (fill_bytes "
                "1024000 + 4231 of headers and key wraps)") in result.stderr
        assert "or lower fill_bytes" in result.stderr
        # Frames that fit pass.
        small = broker_config(tmp_path / "small", broker)
        small.write_text(small.read_text().replace("[mqtt]", "chunk_bytes = 65536\n[mqtt]"))
        assert check_broker(small).exit_code == 0
    finally:
        broker.stop()


def test_broker_check_names_retained_messages_not_kept(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker", extra="retain_available false\n")
    broker.start()
    try:
        result = check_broker(broker_config(tmp_path, broker))
    finally:
        broker.stop()
    assert result.exit_code == 1, result.output
    assert "broker check failed: retained: " in result.stderr


def test_broker_check_names_refused_credentials_and_unreachable(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "host-a", "right"],
                   check=True, capture_output=True)
    broker = Broker(tmp_path / "broker", extra=f"password_file {passwd}\nuser root\n")
    broker.conf.write_text(broker.conf.read_text().replace("allow_anonymous true",
                                                           "allow_anonymous false"))
    (tmp_path / "pw").write_text("wrong\n")
    broker.start()
    try:
        result = check_broker(broker_config(
            tmp_path, broker, mqtt='username = "host-a"\npassword_file = "pw"\n'))
        assert result.exit_code == 1, result.output
        assert "broker check failed: credentials: " in result.stderr
    finally:
        broker.stop()
    result = check_broker(broker_config(tmp_path / "down", broker))
    assert result.exit_code == 1
    assert "broker check failed: unreachable: " in result.stderr


def test_connect_errors_are_classified() -> None:
    verify = aiomqtt.MqttError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert classify_connect_error(verify) == "tls"
    wrapped = aiomqtt.MqttError("handshake")
    wrapped.__cause__ = ssl.SSLError("wrong version number")
    assert classify_connect_error(wrapped) == "tls"
    assert classify_connect_error(aiomqtt.MqttError("[code:135] Not authorized")) == (
        "credentials")
    assert classify_connect_error(aiomqtt.MqttError("[Errno 111] Connection refused")) == (
        "unreachable")


def test_a_root_with_no_key_says_which_names_it_looked_for_and_found(tmp_path: Path) -> None:
    """Issue #27: a dsh-session root under the default `files` (events.jsonl) said "0 keys"
    and nothing else."""
    config = setup(tmp_path)
    shutil.rmtree(tmp_path / "runtimes")
    for n in (1, 2):
        session = tmp_path / "runtimes" / "--home-a-proj--" / f"s{n}"
        session.mkdir(parents=True)
        (session / "session.jsonl.zstd").write_bytes(b"")
    config.write_text(config.read_text().replace('exclude = ["scratch"]\n', ""))
    result = check(config)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("config OK: node host-a, 0 keys found under")
    assert lines[1].startswith("no key: syncd looks for directories holding a file named "
                               "events.jsonl")
    assert lines[2] == "  files under the roots: session.jsonl.zstd (2)"
    assert "config/dsh-session.example.toml" in lines[3]
    config.write_text(config.read_text().replace(
        'runtimes_dir = "runtimes"',
        'runtimes_dir = "runtimes"\nfiles = ["session.jsonl.zstd", "session.jsonl"]'))
    result = check(config)
    assert result.stdout.startswith("config OK: node host-a, 2 keys found under"), result.output
    assert "no key" not in result.stdout
