"""Bad configuration and environment: each refused or retried with a message that says what."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cluster import Broker, Daemon, wait_until


def start_and_fail(d: Daemon) -> str:
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(15) == 2
    return d.read_log()


def test_missing_runtimes_dir(broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("a", broker, start=False)
    d.runtimes.rmdir()
    assert f"runtimes_dir {d.runtimes} does not exist" in start_and_fail(d)


def test_state_dir_that_cannot_be_created(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    d = make_daemon("a", broker, start=False)
    d.state.parent.joinpath("blocker").write_text("a file where a directory should be")
    d.config.write_text(d.config.read_text().replace(str(d.state), str(d.root / "blocker" / "s")))
    assert "cannot be created: Not a directory" in start_and_fail(d)


def test_invalid_toml_names_the_line(broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("a", broker, start=False)
    d.config.write_text(d.config.read_text() + "keepalive = = 3\n")
    log = start_and_fail(d)
    assert "config error" in log and "invalid TOML" in log and "line" in log


def test_unreachable_broker_is_retried_and_said_once(
    tmp_path: Path, make_daemon: Callable[..., Daemon]
) -> None:
    down = Broker(tmp_path / "later")  # not started yet
    d = make_daemon("a", down, start=False)
    d.start(wait=False)
    def said() -> int:
        return sum("WARNING syncd.link" in line for line in d.read_log().splitlines())

    wait_until(lambda: said() == 1, 10, "the first failure to be logged")
    time.sleep(1.0)  # several more attempts (backoff 0.05..0.5 s) must not log again
    assert said() == 1
    assert "unreachable or lost ([Errno 111] Connection refused); retrying" in d.read_log()
    down.start()
    try:
        wait_until(lambda: d.status()["connected"], 15, "a to connect once the broker is up")
        assert "after" in d.read_log() and "failed attempts" in d.read_log()
    finally:
        down.stop()


@pytest.mark.skipif(subprocess.run(["which", "mosquitto_passwd"], capture_output=True,
                                   check=False).returncode != 0, reason="no mosquitto_passwd")
def test_wrong_credentials_are_named(tmp_path: Path, make_daemon: Callable[..., Daemon]) -> None:
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "syncd-a", "right"],
                   check=True, capture_output=True)
    passwords.chmod(0o644)
    # As root, Mosquitto drops to its own user, which cannot enter pytest's private tmp dirs.
    broker = Broker(tmp_path / "auth", extra=f"password_file {passwords}\nuser root\n")
    broker.conf.write_text(broker.conf.read_text().replace("allow_anonymous true",
                                                           "allow_anonymous false"))
    broker.start()
    try:
        wrong = tmp_path / "wrong-password"
        wrong.write_text("not-right\n")
        d = make_daemon("a", broker, start=False)
        d.config.write_text(d.config.read_text().replace(
            "[mqtt]\n", f'[mqtt]\nusername = "syncd-a"\npassword_file = "{wrong}"\n'))
        d.start(wait=False)
        wait_until(lambda: "refused our credentials ([code:135] Not authorized): check "
                   "[mqtt] username and password_file" in d.read_log(), 15,
                   "the broker's refusal to be logged")
        assert wrong.read_text().strip() not in d.read_log()
    finally:
        broker.stop()
