"""Readiness: the log checks, kept up incrementally on every copy, in status."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncd.readiness import readiness
from syncd.verify import LogChecker
from tests.cluster import Broker, Daemon, wait_until
from tests.test_replication import KEY, append, content, wait_equal

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
TURN = "7d1e2f3a-0000-4000-8000-00000000abcd"


def event(kind: str, n: int) -> bytes:
    entry = {"id": f"e-{kind}-{n}", "type": "event", "data": {"type": kind, "turnId": TURN},
             "timestamp": 1793531050000 + n, "turnId": TURN}
    return json.dumps(entry).encode() + b"\n"


def ready(d: Daemon) -> dict[str, Any]:
    f = d.file_status(KEY)
    return {"ready": f.get("ready"), "not_ready": f.get("not_ready"),
            "log_check": f.get("log_check")}


def not_ready_because(d: Daemon, words: str) -> bool:
    r = ready(d)
    return r["ready"] is False and words in " ".join(r["not_ready"])


def test_standby_knows_whether_it_can_take_over(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    clean = (FIXTURES / "clean.jsonl").read_bytes()
    append(a.path(KEY), clean)
    wait_equal(clean, b)
    wait_until(lambda: ready(b)["ready"] is True, 10, "b ready on a clean log")
    # A turn starts: a standby holding it would take over mid-turn.
    append(a.path(KEY), event("turn.start", 1))
    wait_until(lambda: not_ready_because(b, "open_turn 1"), 10, "b not ready: open turn")
    append(a.path(KEY), event("turn.done", 2))
    wait_until(lambda: ready(b)["ready"] is True, 10, "b ready once the turn ended")
    # The result survives a restart without re-reading the file.
    b.stop()
    b.start()
    wait_until(lambda: ready(b)["ready"] is True, 10, "b ready after restart")
    check = ready(b)["log_check"]
    assert check["bytes"] == len(content(b.path(KEY))) and check["read"] == 0


def test_a_bad_line_makes_every_copy_not_ready(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    bad = (FIXTURES / "bad_line.jsonl").read_bytes()
    append(a.path(KEY), bad)
    wait_equal(bad, b)
    for d in (a, b):
        wait_until(lambda d=d: not_ready_because(d, "invalid_json"), 10,
                   f"{d.node} to flag the bad line")


def test_readiness_reasons() -> None:
    checker = LogChecker()
    checker.feed(b'{"id":"1","type":"message","data":{}}\n')
    report = checker.report()
    assert readiness("in_sync", None, {}, report, 38, 38) == (True, [])
    ok, why = readiness("behind", None, {"a": 120}, report, 38, 38)
    assert not ok and why == ["a holds 120 more bytes"]
    ok, why = readiness("diverged", "diverged", {}, report, 38, 38)
    assert not ok and why == ["frozen (diverged)"]
    ok, why = readiness("in_sync", None, {}, report, 10, 38)
    assert not ok and why == ["log check running (10 of 38 bytes)"]
