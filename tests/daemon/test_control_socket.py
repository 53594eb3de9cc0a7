"""The control socket: who may change things, and bounds no local client can get past.

End to end against a real daemon (running as root here): the CLI is run as a throw-away uid
that can open the socket (its group) but is not an admin; idle connections by the thousand;
an oversized request.
"""

from __future__ import annotations

import grp
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest

from syncd.config import ConfigError, load_config, parse_config
from syncd.ops.control import query
from syncd.ops.controlserver import (
    MAX_CONNECTIONS,
    MAX_PER_USER,
    MAX_REQUEST,
    RESERVED,
    AdminGroup,
    Credentials,
    admission,
    may_change,
    refusal,
)
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.ishiki import ishiki_lines

OUTSIDER_UID = 54322  # no such user: a throw-away identity
SOCKET_GID = 54321  # stands for the group `syncd`, which may connect
REPO = Path(__file__).resolve().parents[2]  # `python -m syncd` runs this checkout


# --- the decision ------------------------------------------------------------------------------

def who(uid: int, gid: int = 100, groups: frozenset[int] = frozenset(),
        user: str | None = None) -> Credentials:
    return Credentials(uid, gid, groups, user)


def test_who_may_change_things() -> None:
    admins = AdminGroup("syncd-admin", 990, frozenset({"carol"}))
    own = 995
    assert may_change(who(0), own, admins)  # root
    assert may_change(who(own), own, admins)  # the daemon's own user (systemctl reload)
    assert may_change(who(1000, gid=990), own, admins)  # primary group
    assert may_change(who(1000, groups=frozenset({4, 990})), own, admins)  # supplementary
    assert may_change(who(1001, user="carol"), own, admins)  # listed in the group database
    assert not may_change(who(1000, groups=frozenset({995, 4})), own, admins)  # group syncd
    missing = AdminGroup("syncd-admin", None, frozenset())
    assert may_change(who(0), own, missing) and may_change(who(own), own, missing)
    assert not may_change(who(1000, gid=990, user="carol"), own, missing)


def test_each_user_holds_a_few_connections_and_root_always_has_room() -> None:
    own = 995
    assert admission(1000, own, 0, 0) is None
    assert admission(1000, own, 10, MAX_PER_USER - 1) is None
    full_for_user = admission(1000, own, 10, MAX_PER_USER)
    assert full_for_user is not None and not full_for_user[0]  # closing idle ones: no help
    assert f"from uid 1000 ({MAX_PER_USER} at once)" in full_for_user[1]
    # Other users together stop short of the reserve; root and the daemon's user do not.
    crowded = admission(1001, own, MAX_CONNECTIONS - RESERVED, 0)
    assert crowded is not None and crowded[0]
    assert admission(0, own, MAX_CONNECTIONS - RESERVED, 40) is None
    assert admission(own, own, MAX_CONNECTIONS - 1, 63) is None
    full = admission(0, own, MAX_CONNECTIONS, 0)
    assert full is not None and full[1] == (f"too many control connections ({MAX_CONNECTIONS} "
                                            "busy); try again")


def test_the_refusal_names_the_group_needed() -> None:
    text = refusal("adopt", "syncd", AdminGroup("ops", 990, frozenset()))
    assert "adopt" in text and "group 'ops'" in text and "root" in text
    text = refusal("reload", "syncd", AdminGroup("syncd-admin", None, frozenset()))
    assert "group 'syncd-admin'" in text and "does not exist" in text


def test_admin_group_in_the_config(tmp_path: Path) -> None:
    base = {"node": "a", "runtimes_dir": "r", "state_dir": "s"}
    assert parse_config(base, tmp_path / "c.toml").admin_group == "syncd-admin"
    assert parse_config({**base, "admin_group": "ops"}, tmp_path / "c.toml").admin_group == "ops"
    with pytest.raises(ConfigError, match="admin_group: 'a b' is not a group name"):
        parse_config({**base, "admin_group": "a b"}, tmp_path / "c.toml")
    example = load_config(REPO / "config" / "syncd.example.toml")
    assert example.admin_group == "syncd-admin"


# --- a real daemon ---------------------------------------------------------------------------

def existing_group() -> grp.struct_group:
    """A group this machine has, that the throw-away user is not in by default."""
    for g in sorted(grp.getgrall(), key=lambda g: g.gr_gid):
        if 0 < g.gr_gid < 60000 and g.gr_gid != SOCKET_GID:
            return g
    pytest.skip("no ordinary group on this machine")


def open_to_outsider(d: Daemon) -> None:
    """Let the throw-away uid reach the socket as a member of its group would: the socket in
    group SOCKET_GID (stands for `syncd`), the directories above it traversable."""
    sock = d.state / "syncd.sock"
    os.chown(sock, -1, SOCKET_GID)
    for p in [*sock.parents][:-1]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


# The interpreter may live where the throw-away uid cannot read (/root/.pyenv): it starts as
# root, imports the CLI, then drops to that uid and runs the command.
AS_OUTSIDER = """
import os, sys
import click._termui_impl
from syncd.cli import main
for name in main.list_commands(None):  # commands load lazily: load them while still root
    main.get_command(None, name)
os.setgroups([int(g) for g in sys.argv[1].split(",")])
os.setresgid(int(sys.argv[2]), int(sys.argv[2]), int(sys.argv[2]))
os.setresuid(int(sys.argv[3]), int(sys.argv[3]), int(sys.argv[3]))
sys.argv = ["syncd", *sys.argv[4:]]
main()
"""


def as_outsider(d: Daemon, *args: str, groups: tuple[int, ...] = ()
                ) -> subprocess.CompletedProcess[str]:
    ids = [",".join(str(g) for g in (SOCKET_GID, *groups)), str(SOCKET_GID), str(OUTSIDER_UID)]
    return subprocess.run(
        [sys.executable, "-c", AS_OUTSIDER, *ids, *args, "--config", str(d.config)],
        capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.fixture
def pair(broker: Broker, make_daemon: Callable[..., Daemon]) -> Iterator[tuple[Daemon, Daemon]]:
    admins = existing_group()
    a = make_daemon("a", broker, extra=f'admin_group = "{admins.gr_name}"')
    b = make_daemon("b", broker)
    append(a.path(KEY), ishiki_lines(5))
    wait_equal(content(a.path(KEY)), b)
    open_to_outsider(a)
    yield a, b


def test_anyone_who_can_connect_reads_status_but_only_admins_adopt_or_reload(
    pair: tuple[Daemon, Daemon]
) -> None:
    a, _ = pair
    admins = existing_group()
    shown = as_outsider(a, "status")
    assert shown.returncode == 0, shown
    assert "node a" in shown.stdout and KEY in shown.stdout
    before = content(a.path(KEY))
    refused = as_outsider(a, "adopt", KEY, "--from", "b", "--yes")
    assert refused.returncode == 1
    assert "permission denied: adopt changes this host" in refused.stderr
    assert f"group {admins.gr_name!r}" in refused.stderr
    assert not (a.state / "archive").exists() and content(a.path(KEY)) == before
    assert "adopt refused to uid 54322" in a.read_log()
    refused = as_outsider(a, "reload")
    assert refused.returncode == 1 and "permission denied: reload" in refused.stderr
    # A member of admin_group may.
    adopted = as_outsider(a, "adopt", KEY, "--from", "b", "--yes", groups=(admins.gr_gid,))
    assert adopted.returncode == 0, adopted
    assert "local copy archived at" in adopted.stdout
    assert len(list((a.state / "archive" / KEY).glob("*.manifest.json"))) == 1


def test_a_thousand_idle_connections_neither_exhaust_descriptors_nor_block_status(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker)
    assert a.proc is not None
    fds = Path(f"/proc/{a.proc.pid}/fd")
    baseline = len(list(fds.iterdir()))
    path = str(a.state / "syncd.sock")
    with ExitStack() as stack:
        clients = []
        for _ in range(1100):
            s = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            s.settimeout(10)
            # EAGAIN while the listen backlog is full: the daemon accepts, then there is room.
            wait_until(lambda s=s: s.connect_ex(path) == 0, 10, "a connection", interval=0.001)
            clients.append(s)
        # While all of them are still open on this side, status answers at once.
        assert query(a.state / "syncd.sock", "status", timeout=5)["status"]["node"] == "a"
        assert len(list(fds.iterdir())) <= baseline + MAX_CONNECTIONS + 8
        # The oldest idle ones were told why they were closed, in one line.
        told = 0
        for s in clients[:200]:
            reply = s.recv(4096)
            if reply:
                assert orjson.loads(reply)["error"].startswith("closed: no request")
                told += 1
        assert told >= 200 - MAX_CONNECTIONS
    wait_until(lambda: len(list(fds.iterdir())) <= baseline + 2, 10, "descriptors released")


def request_line(path: Path, line: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(line)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, f"closed without a reply (got {buf!r})"
            buf += chunk
    reply: dict[str, Any] = orjson.loads(buf)
    return reply


def test_an_oversized_request_gets_an_error_reply(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker)
    sock = a.state / "syncd.sock"
    big = orjson.dumps({"cmd": "status", "pad": "x" * (100 * 1024)}) + b"\n"
    reply = request_line(sock, big)
    assert reply == {"ok": False, "error": f"request refused: longer than {MAX_REQUEST} bytes"}
    assert request_line(sock, b"not json\n")["error"].startswith("malformed request")
    assert request_line(sock, b'{"cmd": "status"}\n')["ok"] is True  # still serving
    assert "Traceback" not in a.read_log()


# N threads of the throw-away uid ask for `status` again and again, each reading its whole
# answer, as a member of group `syncd` who wants the daemon stuck would (a refusal: again a
# moment later). Prints a line once they have had 2 N answers or refusals (or after 30 s),
# then goes on until its standard input closes.
HAMMER = """
import os, socket, sys, threading, time
os.setgroups([int(sys.argv[2])])
os.setresgid(int(sys.argv[2]), int(sys.argv[2]), int(sys.argv[2]))
os.setresuid(int(sys.argv[3]), int(sys.argv[3]), int(sys.argv[3]))
n, done, lock = int(sys.argv[4]), [0, 0], threading.Lock()
def ask():
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect(sys.argv[1])
                s.sendall(b'{"cmd": "status"}\\n')
                first = s.recv(1 << 16)
                while s.recv(1 << 20):
                    pass
        except OSError:
            time.sleep(0.1)
            continue
        refused = b"too many control connections" in first
        with lock:
            done[refused] += 1
        if refused:
            time.sleep(0.1)
for _ in range(n):
    threading.Thread(target=ask, daemon=True).start()
deadline = time.monotonic() + 30
while sum(done) < 2 * n and time.monotonic() < deadline:
    time.sleep(0.05)
print(done[0], done[1], flush=True)
sys.stdin.read()
"""


def test_members_of_the_socket_group_cannot_keep_root_from_an_answer(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """Issue #23, case 5: 64 clients of one unprivileged user (a member of group `syncd`) ask
    for `status` (~850 KB with 1000 keys) as fast as they can. Root's `syncd status --ready`
    (a failover script) still gets its answer within the CLI's own 10 s: one status is built
    for all who wait, paced, and the user may hold MAX_PER_USER connections at once. (Before:
    each request built its own document on the loop, ~0.25 s each, and root's waited behind
    64 of them, past its timeout.)"""
    keys = [f"bot-{i:04d}" for i in range(1000)]
    a = make_daemon("a", broker, start=False)
    for key in keys:
        append(a.path(key), ishiki_lines(1))
    a.start()
    wait_until(lambda: sum(a.status()["ready_count"].values()) == len(keys), 60,
               "every key loaded")
    open_to_outsider(a)
    hammer = subprocess.Popen(
        [sys.executable, "-c", HAMMER, str(a.state / "syncd.sock"), str(SOCKET_GID),
         str(OUTSIDER_UID), str(MAX_CONNECTIONS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert hammer.stdout is not None
        _answered, refused = map(int, hammer.stdout.readline().split())  # in full swing
        done = subprocess.run(
            [sys.executable, "-m", "syncd", "status", "--config", str(a.config), "--ready",
             keys[0]], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.stdout.startswith(f"{keys[0]}: "), done
        assert refused > 0  # the user was told, in one line, to come back later
    finally:
        hammer.communicate("", timeout=60)
    assert query(a.state / "syncd.sock", "status", timeout=30)["ok"] is True
