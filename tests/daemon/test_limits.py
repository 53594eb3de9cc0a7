"""The kernel's inotify limits met for real: too few watches, no instance at all.

Each daemon runs in a user namespace of its own (`unshare --user --map-root-user`) whose
inotify limits (/proc/sys/user/max_inotify_*) are set low: the kernel enforces them as it
would fs.inotify.* for the whole machine, which a test on a shared host must not touch.
Raised from outside (nsenter into that namespace), the daemon takes them up without a
restart.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syncd.disk.oslimits import inotify_limits
from tests.daemon.test_metrics import scrape
from tests.support.cluster import Broker, Daemon, free_port, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines

KEYS = [f"bot-{i}" for i in range(6)]
DIRECTORIES = 1 + 2 * len(KEYS)  # the root, each key's directory and its resources/


def userns(**limits: int) -> list[str]:
    """A command prefix: run in a new user namespace with these max_inotify_* limits."""
    sets = " && ".join(f"echo {v} > /proc/sys/user/max_inotify_{k}" for k, v in limits.items())
    return ["unshare", "--user", "--map-root-user", "sh", "-c", f'{sets} && exec "$@"', "sh"]


def _userns_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    done = subprocess.run([*userns(watches=5), "true"], capture_output=True, check=False)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not _userns_works(),
                                reason="needs unshare --user and nsenter (util-linux) and "
                                       "user namespaces")


def set_limit(d: Daemon, name: str, value: int) -> None:
    """Raise a limit of the daemon's namespace, as an operator raises the sysctl."""
    assert d.proc is not None
    subprocess.run(["nsenter", "-t", str(d.proc.pid), "-U", "sh", "-c",
                    f"echo {value} > /proc/sys/user/max_inotify_{name}"], check=True)


def instances(d: Daemon) -> None:
    for key in KEYS:
        append(d.path(key), ishiki_lines(3))
        (d.runtimes / key / "resources").mkdir()


@pytest.fixture
def limited(tmp_path: Path, broker: Broker) -> Iterator[Callable[..., Daemon]]:
    """Daemon "a" in a user namespace with these limits (killed at the end of the test)."""
    made: list[Daemon] = []

    def make(port: int, **limits: int) -> Daemon:
        d = Daemon(tmp_path, "a", broker, prefix=userns(**limits),
                   extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        made.append(d)
        return d

    yield make
    for d in made:
        d.kill()


def replicates_anyway(a: Daemon, b: Daemon) -> None:
    """Every key, watched or not, reaches b: the sweep finds what no watch reports."""
    for key in KEYS:
        append(a.path(key), ishiki_lines(2))
    for key in KEYS:
        wait_equal(a.path(key).read_bytes(), b, key=key)


def test_too_few_watches_are_named_at_start_in_status_metrics_and_check_config(
    broker: Broker, make_daemon: Callable[..., Daemon], limited: Callable[..., Daemon]
) -> None:
    port = free_port()
    a = limited(port, watches=5)
    instances(a)
    b = make_daemon("b", broker)
    a.start()
    warning = (f"fs.inotify.max_user_watches is 5, fewer than the {DIRECTORIES} directories "
               "under the runtimes roots (syncd watches each one): changes in "
               f"{DIRECTORIES - 5} or more of them are found by the sweep only, late; raise "
               "it: sysctl -w fs.inotify.max_user_watches=8192, and keep it across reboots "
               "with the line 'fs.inotify.max_user_watches = 8192' in "
               "/etc/sysctl.d/60-syncd.conf")
    assert warning in a.read_log()
    inotify = a.status()["inotify"]
    assert inotify == {"enabled": True, "watches": 5, "watches_needed": DIRECTORIES,
                       "max_user_watches": 5,
                       "max_user_instances": inotify_limits().max_user_instances,
                       "warnings": [warning]}
    assert a.status()["open_files"]["open"] > 0
    s = scrape(port)
    assert (s[("syncd_inotify_watches", ())], s[("syncd_inotify_watches_needed", ())],
            s[("syncd_inotify_max_user_watches", ())]) == (5, DIRECTORIES, 5)
    text = subprocess.run([sys.executable, "-m", "syncd", "status", "--config", str(a.config)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert f"warning: {warning}" in text.stdout
    check = subprocess.run([*userns(watches=5), sys.executable, "-m", "syncd", "check-config",
                            "--config", str(a.config)],
                           capture_output=True, text=True, check=False, timeout=60)
    assert check.returncode == 0, check.stderr  # usable: a warning, not an error
    assert (f"inotify: {DIRECTORIES} directories to watch under the roots (one watch each); "
            "fs.inotify.max_user_watches = 5, ") in check.stdout
    assert f"syncd: warning: {warning}" in check.stderr
    replicates_anyway(a, b)
    # The operator raises the limit: the watches follow at the next directory scan.
    set_limit(a, "watches", 1000)
    wait_until(lambda: a.status()["inotify"]["watches"] == DIRECTORIES, 15,
               "every directory watched")
    assert a.status()["inotify"]["warnings"] == []
    # /metrics is built from the paced status snapshot, which may be a moment older.
    wait_until(lambda: scrape(port)[("syncd_inotify_watches", ())] == DIRECTORIES, 15,
               "the metric to count every directory watched")


def test_no_inotify_instance_leaves_it_to_the_sweep_until_one_is_granted(
    broker: Broker, make_daemon: Callable[..., Daemon], limited: Callable[..., Daemon]
) -> None:
    a = limited(free_port(), instances=0)
    instances(a)
    b = make_daemon("b", broker)
    a.start()  # this used to fail the start: inotify_init1's EMFILE was not caught
    log = a.read_log()
    assert ("cannot watch the runtimes roots (inotify_init1: Too many open files): "
            "fs.inotify.max_user_instances is 0; raise it: sysctl -w "
            "fs.inotify.max_user_instances=128") in log
    assert "fs.inotify.max_user_instances is 0: syncd needs 1 inotify instance" in log
    inotify = a.status()["inotify"]
    assert (inotify["enabled"], inotify["watches"], inotify["max_user_instances"]) == (
        False, 0, 0)
    assert any(w.startswith("cannot watch the runtimes roots") for w in inotify["warnings"])
    replicates_anyway(a, b)
    set_limit(a, "instances", 10)
    wait_until(lambda: a.status()["inotify"]["enabled"], 15, "the watcher to start")
    assert a.status()["inotify"]["watches"] == DIRECTORIES
    assert a.status()["inotify"]["warnings"] == []
    assert "inotify instance obtained: watching the runtimes roots again" in a.read_log()
