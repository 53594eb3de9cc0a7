"""End to end (issue #16): an instance's resources/ with real daemons and a real Mosquitto."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki_writer import (
    image_line,
    put_artifact,
    put_asset,
    shake_line,
    sidecar,
    write_atomic,
)

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
    writer = subprocess.Popen([sys.executable, "-m", "tests.support.ishiki_writer", str(target)],
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


def test_same_name_with_other_bytes_is_refused_and_shown_on_both(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker, start=False) for n in "ab")
    ours = b"A" * 100_000 + b"same tail"
    theirs = b"A" * 70_000 + b"B" * 30_000 + b"same tail"
    put_artifact(a.runtimes / KEY, "shake", "shake-x.log", ours)
    put_artifact(b.runtimes / KEY, "shake", "shake-x.log", theirs)
    append(a.path(KEY), shake_line("s1", "artifact://shake/shake-x.log"))
    a.start()
    b.start()
    blob = "artifacts/shake/shake-x.log"
    for d, peer in ((a, "b"), (b, "a")):
        found = wait_until(lambda d=d: [c for c in resources_of(d).get("conflicts", [])
                                        if c["offset"] is not None], 20,
                           f"{d.node} to show the conflict with its offset")
        assert found == [{"name": blob, "peer": peer, "offset": 70_000,
                          "ours": found[0]["ours"], "theirs": found[0]["theirs"]}]
        wait_until(lambda d=d: "differs from" in d.read_log()
                   and "from byte 70000" in d.read_log(), 10, f"{d.node}'s log line")
        status = d.file_status(KEY)
        assert not status["ready"]
        assert any("write-once resource" in r for r in status["not_ready"])
        shown = subprocess.run([sys.executable, "-m", "syncd", "status", "--config",
                                str(d.config)], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 1, shown.stdout
        assert (f"{KEY}/resources/{blob}: CONFLICT with {peer}: same name, other bytes (first "
                "difference at byte 70000") in shown.stdout
    assert tree(a)[blob] == ours
    assert tree(b)[blob] == theirs
    # Everything else still travels: the log, and a new artifact.
    put_artifact(a.runtimes / KEY, "shake", "shake-y.log", b"other")
    wait_until(lambda: tree(b).get("artifacts/shake/shake-y.log") == b"other", 20,
               "a new artifact despite the conflict")
    wait_equal(a.path(KEY).read_bytes(), b)
    assert tree(a)[blob] == ours and tree(b)[blob] == theirs
    # The operator moves the wrong copy away on b: a's copy is fetched, the conflict ends.
    (b.runtimes / KEY / "resources" / blob).rename(b.root / "moved-away")
    wait_until(lambda: tree(b).get(blob) == ours, 20, "a's copy fetched after the move")
    wait_until(lambda: not resources_of(a)["conflicts"] and not resources_of(b)["conflicts"],
               20, "the conflict to end on both")


def test_ready_waits_for_a_referenced_artifact_and_names_it(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    # The log names an artifact before it exists anywhere (as after a writer that lost it).
    append(a.path(KEY), shake_line("s1", "artifact://shake/shake-late.log"))
    wait_equal(a.path(KEY).read_bytes(), b)

    def reasons() -> list[str]:
        s = b.file_status(KEY)
        return list(s["not_ready"]) if s["missing_resources"] == 2 else []

    why = wait_until(reasons, 20, "b to say which resources are missing")
    assert any("artifacts/shake/shake-late.log, artifacts/shake/shake-late.log.json" in r
               for r in why), why
    status = b.file_status(KEY)
    assert not status["ready"]
    assert status["missing_resources_first"] == ["artifacts/shake/shake-late.log",
                                                 "artifacts/shake/shake-late.log.json"]
    put_artifact(a.runtimes / KEY, "shake", "shake-late.log", b"the original")
    wait_until(lambda: b.file_status(KEY)["ready"], 20,
               f"b ready once the artifact arrived ({b.file_status(KEY)['not_ready']})")
    assert b.file_status(KEY)["missing_resources"] == 0


def test_a_sidecar_written_on_a_host_that_is_not_the_writer_never_replaces_the_writers(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    writers = f'\n[keys."{KEY}"]\nwriters = ["a"]\n'
    a, b = (make_daemon(n, broker, extra=writers) for n in "ab")
    blob = a.runtimes / KEY / "resources" / "artifacts" / "t" / "x"
    append(a.path(KEY), shake_line("s1", put_artifact(a.runtimes / KEY, "t", "x", b"x", v=1)))
    wait_trees(a, b)
    # b (a standby) rewrites the sidecar: a keeps its own.
    sidecar(b.runtimes / KEY / "resources" / "artifacts" / "t" / "x", v="standby")
    wait_until(lambda: b"standby" in tree(b)["artifacts/t/x.json"], 5, "b's local write")
    sidecar(blob, v=2)  # the writer's next put reaches b, over b's own
    wait_until(lambda: tree(b)["artifacts/t/x.json"] == tree(a)["artifacts/t/x.json"], 20,
               "the writer's sidecar on b")
    assert b'"v": 2' in tree(a)["artifacts/t/x.json"]


def test_a_standby_killed_mid_transfer_resumes_and_leaves_no_temp_file(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a = make_daemon("a", broker)
    b = make_daemon("b", broker, start=False)
    inst = a.runtimes / KEY
    blobs = {f"artifacts/compact/c-{i}.log": os.urandom(12 << 20) for i in range(2)}
    for name, data in blobs.items():
        write_atomic(inst / "resources" / name, data)
    append(a.path(KEY), shake_line("s1", "artifact://compact/c-0.log"))
    b.start()
    wait_until(lambda: any(t["got"] > 0 for r in b.status()["resources"]
                           for t in r["fetching"]), 30, "b to be fetching")
    b.kill()  # kill -9 in the middle of a chunked transfer
    left = [n for n in tree(b) if n.endswith(".syncd.tmp")]
    b.start()
    want = wait_trees(a, b, timeout=60)
    assert all(want[n] == d for n, d in blobs.items())
    assert left, "the kill left a partly received file (removed at start)"
    assert not [n for n in tree(b) if n.endswith(".tmp")]
