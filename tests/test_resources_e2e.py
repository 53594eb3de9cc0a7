"""End to end (issue #16): an instance's resources/ with real daemons and a real Mosquitto."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cluster import Broker, Daemon, wait_until
from tests.ishiki_writer import (
    image_line,
    put_artifact,
    put_asset,
    shake_line,
    sidecar,
    write_atomic,
)
from tests.test_replication import append, content, wait_equal

KEY = "bot-1"


def tree(d: Daemon, key: str = KEY) -> dict[str, bytes]:
    """Every file under the instance's resources/, temp files included."""
    top = d.runtimes / key / "resources"
    out = {}
    for root, _, names in os.walk(top):
        for n in names:
            p = Path(root) / n
            out[str(p.relative_to(top))] = p.read_bytes()
    return out


def published(files: dict[str, bytes]) -> dict[str, bytes]:
    return {n: b for n, b in files.items() if not n.endswith(".tmp")}


def wait_trees(source: Daemon, *others: Daemon, timeout: float = 30) -> dict[str, bytes]:
    want = published(tree(source))

    def same() -> bool:
        return all(tree(d) == want for d in others)

    wait_until(same, timeout, f"resources on {[d.node for d in others]} to equal "
                              f"{source.node}'s {sorted(want)}")
    return want


def resources_of(d: Daemon, key: str = KEY) -> dict[str, object]:
    for r in d.status()["resources"]:
        if r["key"] == key:
            return dict(r)
    return {}


def test_resources_reach_every_host_also_after_an_outage_and_a_killed_writer(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b, c = (make_daemon(n, broker) for n in "abc")
    inst = a.runtimes / KEY
    log = a.path(KEY)
    append(log, image_line("m0", "no asset here"))
    ref = put_artifact(inst, "shake", "shake-1.log", b"folded tool output\n" * 100)
    append(log, shake_line("s1", ref))
    wait_equal(log.read_bytes(), b, c)
    wait_trees(a, b, c)

    b.stop()  # B is away while A writes
    big = os.urandom(5 << 20)  # travels in chunks (chunk_bytes 256 KiB)
    ref2 = put_artifact(inst, "compact", "compact-2.log", big)
    append(log, shake_line("s2", ref2))
    sidecar(inst / "resources" / "artifacts" / "shake" / "shake-1.log", size=1900, puts=2)
    aref = put_asset(inst, "0190f9f3-3ff8-7000-8000-000000000001", b"\x89PNG" + os.urandom(999))
    append(log, image_line("i1", aref))
    # The writer is killed between its temp file and the rename: the temp file stays on A.
    target = inst / "resources" / "artifacts" / "tool" / "out-3"
    writer = subprocess.Popen([sys.executable, "-m", "tests.ishiki_writer", str(target)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert writer.stdout is not None
    assert writer.stdout.readline().startswith(b"ready")
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    wait_trees(a, c)
    b.start()
    want = wait_trees(a, b, c)
    wait_equal(log.read_bytes(), b, c)
    assert want["artifacts/compact/compact-2.log"] == big
    assert b'"puts": 2' in want["artifacts/shake/shake-1.log.json"]
    assert any(n.endswith(".tmp") for n in tree(a)), "the killed writer left its temp file"
    for d in (b, c):
        assert not any(n.endswith(".tmp") for n in tree(d)), f"a temp file reached {d.node}"
    # The restarted writer publishes the file later: it arrives whole.
    write_atomic(target, b"the tool output, written again\n")
    want = wait_trees(a, b, c)
    assert want["artifacts/tool/out-3"] == b"the tool output, written again\n"
    for d in (a, b, c):
        wait_until(lambda d=d: d.file_status(KEY).get("ready"), 20,
                   f"{d.node} ready ({d.file_status(KEY).get('not_ready')})")
