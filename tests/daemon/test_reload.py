"""`syncd reload` (the unit's ExecReload) against a real daemon: check first, then apply."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki import ishiki_lines


def reload(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", "reload", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)


def keys(daemon: Daemon) -> list[str]:
    return sorted(f["key"] for f in daemon.status()["files"])


def test_reload_applies_a_good_config_and_refuses_a_bad_one_without_asking_the_daemon(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker, start=False, extra='exclude = ["bot-2"]\n')
    for key in ("bot-1", "bot-2"):
        a.path(key).parent.mkdir(parents=True)
        a.path(key).write_bytes(ishiki_lines(2))
    a.start()
    wait_until(lambda: keys(a) == ["bot-1"], 10, "bot-1 alone")
    good = a.config.read_text()

    a.config.write_text(good.replace("request_timeout = 1.0", "request_timeout = -1"))
    bad = reload(a.config)
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"syncd: config error: {a.config}:6: request_timeout: must be "
                                 ), bad.stderr
    # Refused before the daemon was asked: it runs on, with the config it had.
    assert "reload refused" not in a.read_log()
    assert keys(a) == ["bot-1"]

    a.config.write_text(good.replace('exclude = ["bot-2"]', ""))
    ok = reload(a.config)
    assert (ok.returncode, ok.stdout, ok.stderr) == (
        0, f"syncd: reloaded {a.config} (2 files)\n", "")
    assert keys(a) == ["bot-1", "bot-2"]  # applied before the command returned

    a.config.write_text(a.config.read_text().replace(f"port = {broker.port}", "port = 1"))
    moved = reload(a.config)
    assert moved.returncode == 0
    assert "mqtt changed; that takes a restart" in moved.stderr
    assert a.status()["broker"] == f"127.0.0.1:{broker.port}"


def test_reload_names_the_problem_when_the_daemon_cannot_apply_that_file(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker)
    other = tmp_path / "copy.toml"  # same state_dir, so the same daemon answers
    other.write_text(a.config.read_text())
    wrong = reload(other)
    assert wrong.returncode == 1
    assert wrong.stderr == f"syncd: reload failed: this daemon runs {a.config}, not {other}\n"
    a.stop()
    down = reload(a.config)
    assert down.returncode == 1
    assert down.stderr.startswith("syncd: reload failed: syncd is not running"), down.stderr


def test_a_host_added_to_peers_by_a_reload_is_heard_at_once(
    tmp_path: Path, broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Each host subscribes to the batches and positions of its peers only (its own would
    come back to it): a reload that adds a peer subscribes to it, and the position it left
    retained arrives at once; the standby fetches the log without the new host writing again."""
    b = make_daemon("b", broker)
    h = Daemon(tmp_path, "h", broker, listed=False)
    h.path("bot-1").parent.mkdir(parents=True)
    h.path("bot-1").write_bytes(ishiki_lines(30))
    h.start()
    try:
        wait_until(lambda: "a node not listed in [peers]" in b.read_log(), 10,
                   "b to refuse the unlisted host")
        assert not b.path("bot-1").exists()
        b.write_config({**b.peers(), "h": h.identity.public})
        assert reload(b.config).returncode == 0
        wait_until(lambda: b.path("bot-1").exists()
                   and b.path("bot-1").read_bytes() == h.path("bot-1").read_bytes(), 10,
                   "b to fetch the new peer's log")
        b.write_config({n: k for n, k in b.peers().items() if n != "h"})
        assert reload(b.config).returncode == 0
        assert "node h is no longer in [peers]" in b.read_log()
    finally:
        h.kill()
