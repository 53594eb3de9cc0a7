"""Retiring a host: unlisted from [peers], it disappears from every status, also after a
restart, and `syncd forget NODE` clears what it left on the broker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from syncd.cli.main import main
from tests.daemon.test_tls import SecureBroker, example_broker_config, tls_daemon
from tests.support.certs import CA
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines


def forget(node: str, d: Daemon, *args: str) -> Result:
    return CliRunner().invoke(main, ["forget", node, "--config", str(d.config), "--timeout",
                                     "5", *args])


def mentions(status: dict[str, Any], node: str) -> bool:
    return node in status["peers"] or any(node in f["peers"] or node in f["diverged"]
                                          for f in status["files"])


def unlist(node: str, *daemons: Daemon) -> None:
    """What an operator does on every host: remove NODE's [peers] line, then reload."""
    for d in daemons:
        d.write_config({n: k for n, k in d.peers().items() if n != node})
        d.reload()


def test_retire_a_host(broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    a, b, c = (make_daemon(n, broker) for n in ("a", "b", "c"))
    append(a.path("bot-1"), ishiki_lines(20))
    wait_equal(a.path("bot-1").read_bytes(), b, c, key="bot-1")
    wait_until(lambda: all(a.file_status("bot-1")["peers"].get(n, {}).get("state") == "in_sync"
                           for n in ("b", "c")), 10, "a to see b and c in sync")

    refused = forget("c", a)
    assert refused.exit_code == 1 and "c is still listed in [peers]" in refused.output
    assert forget("a", a).exit_code == 1  # this host

    unlist("c", a, b)  # c keeps running: what it says no longer counts
    for d in (a, b):
        wait_until(lambda d=d: not mentions(d.status(), "c"), 10, f"{d.node} to drop c")
    left_out = c.status()["sealed_not_for_us"]
    append(c.path("bot-1"), ishiki_lines(2))  # c's longer tail goes nowhere
    append(a.path("bot-1"), ishiki_lines(2))
    wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
    # a's frames are sealed for its listed peers only (wire version 6): c, still running,
    # can no longer read them, so it has nothing to answer; what it sends is refused.
    wait_until(lambda: c.status()["sealed_not_for_us"] > left_out, 10,
               "c to be left out of a's frames")
    assert not mentions(a.status(), "c")

    c.stop()
    assert forget("nobody", a).exit_code == 1
    done = forget("c", a)
    assert done.exit_code == 0, done.output
    assert done.output.startswith("c: presence and 1 retained positions cleared")

    # After a restart: b's position comes back from the broker, c's does not.
    for d in (a, b):
        d.stop()
        d.start()
    append(a.path("bot-1"), ishiki_lines(3))
    wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
    wait_until(lambda: a.file_status("bot-1")["peers"].get("b", {}).get("state") == "in_sync",
               10, "a to see b again after the restart")
    for d in (a, b):
        status = d.status()
        assert not mentions(status, "c"), status


def test_shipped_acl_lets_only_the_admin_retire_a_host(tmp_path: Path) -> None:
    """config/mosquitto.conf and .acl as shipped (TLS, per-node users): a node's own login
    cannot clear another node's topics; the ACL's syncd-admin can. check-config --broker
    passes for a node on the same broker."""
    ca = CA(tmp_path / "pki")
    users = {"a": "password-a", "c": "password-c", "syncd-admin": "password-admin"}
    broker = example_broker_config(tmp_path / "broker", ca, ca.issue("broker", server=True),
                                   users)
    passwords = {}
    for user, password in users.items():
        passwords[user] = tmp_path / f"{user}.password"
        passwords[user].write_text(password + "\n")
    secure = SecureBroker(broker, ca, passwords)
    broker.start()
    a, c = tls_daemon(tmp_path, "a", secure), tls_daemon(tmp_path, "c", secure)
    try:
        a.start()
        c.start()
        checked = CliRunner().invoke(main, ["check-config", "--config", str(a.config),
                                            "--broker", "--timeout", "3"])
        assert checked.exit_code == 0, checked.output
        assert "broker OK: connected to" in checked.output and "over TLS" in checked.output
        append(a.path("bot-1"), ishiki_lines(5))
        wait_equal(a.path("bot-1").read_bytes(), c, key="bot-1")
        c.stop()
        wait_until(lambda: not a.status()["peers"]["c"]["online"], 10, "a to see c offline")
        unlist("c", a)
        wait_until(lambda: not mentions(a.status(), "c"), 10, "a to drop c")

        as_node = forget("c", a)  # a's own login: the ACL drops its writes to c's topics
        assert as_node.exit_code == 1, as_node.output
        assert "the ACL's admin user may" in as_node.output

        as_admin = forget("c", a, "--username", "syncd-admin", "--password-file",
                          str(passwords["syncd-admin"]))
        assert as_admin.exit_code == 0, as_admin.output
        assert forget("c", a, "--username", "syncd-admin", "--password-file",
                      str(passwords["syncd-admin"])).exit_code == 1  # nothing left
    finally:
        a.kill()
        c.kill()
        broker.stop()


def test_forget_drops_a_divergence_with_the_retired_host(
        broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    a, c = make_daemon("a", broker), make_daemon("c", broker)
    append(a.path("bot-1"), ishiki_lines(10))
    wait_equal(a.path("bot-1").read_bytes(), c, key="bot-1")
    c.stop()
    edited = bytearray(c.path("bot-1").read_bytes())
    edited[40:42] = b"XX"  # a hand edit on c while it is down: c now holds another history
    c.path("bot-1").write_bytes(bytes(edited))
    c.start()
    wait_until(lambda: "c" in a.file_status("bot-1")["diverged"], 15, "a to diverge from c")
    c.stop()
    wait_until(lambda: not a.status()["peers"]["c"]["online"], 10, "a to see c offline")
    unlist("c", a)
    wait_until(lambda: a.file_status("bot-1")["state"] == "alone", 10, "a to drop the divergence")
    assert a.file_status("bot-1")["diverged"] == {}
    a.stop()
    a.start()
    wait_until(lambda: a.file_status("bot-1").get("state") == "alone", 10, "a to load")
    assert not mentions(a.status(), "c")
    append(a.path("bot-1"), ishiki_lines(1))  # and it replicates (ships) again
    wait_until(lambda: a.file_status("bot-1")["size"] == a.path("bot-1").stat().st_size, 10,
               "a to take its new line")
