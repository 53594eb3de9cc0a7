"""Readiness: the pure definition (decide) reason by reason, and READY end to end.

The end-to-end tests run real `syncd run` daemons against a real Mosquitto; each checks its
claim before and after a restart of either host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from syncd.cli.status import ready_report, render
from syncd.core.logcheck import LogChecker
from syncd.core.logreport import Report
from syncd.core.readiness import (
    CHECK_GRACE,
    PEERS_SETTLE,
    WRITER_SETTLE,
    Facts,
    PeerFacts,
    Unconfirmed,
    decide,
    when,
)
from syncd.daemon.logfollow import FOLLOW_INTERVAL, IncrementalVerifier
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verify"
NOW = 1_800_000_000.0

# --- the pure definition ------------------------------------------------------------------


def report_of(data: bytes) -> Report:
    checker = LogChecker()
    checker.feed(data)
    return checker.report()


CLEAN = (FIXTURES / "clean.jsonl").read_bytes()


def facts(**changes: Any) -> Facts:
    """A standby in sync with one online peer, connected long enough, checked to the end."""
    base = Facts(
        now=NOW, state="in_sync", freeze=None, freeze_since=None, freeze_detail=None,
        size=len(CLEAN), checked=len(CLEAN), report=report_of(CLEAN), checked_at=NOW - 60,
        connected=True, connected_since=NOW - 60, peers=(peer(),),
    )
    return dataclasses.replace(base, **changes)


def peer(**changes: Any) -> PeerFacts:
    base = PeerFacts(
        name="a", online=True, offline_since=None, size=len(CLEAN), ahead_by=0,
        ahead_since=None, frozen=None, frozen_since=None, diverged=False, diverged_since=None,
        grew_at=NOW - 30, heard_at=NOW - 30,
    )
    return dataclasses.replace(base, **changes)


def reasons(f: Facts) -> list[str]:
    verdict = decide(f)
    assert verdict.ready is (not verdict.not_ready)
    return verdict.not_ready


def test_in_sync_clean_connected_is_ready_without_notes() -> None:
    verdict = decide(facts())
    assert verdict.ready and verdict.not_ready == [] and verdict.notes == []


def test_alone_is_ready() -> None:
    # No peer has announced the file: nothing announced is missing.
    assert decide(facts(state="alone", peers=())).ready


def test_own_freeze_says_what_and_since() -> None:
    why = reasons(facts(state="reset", freeze="reset", freeze_since=NOW - 5,
                        freeze_detail="file deleted (held 10 bytes)"))
    assert why == [f"frozen here (reset) since {when(NOW - 5)}: file deleted (held 10 bytes)"]


def test_a_peer_reset_is_a_reason_naming_the_reset_and_the_peer() -> None:
    # The stale standby: the writer's clear() froze it as reset; our copy looks in_sync.
    why = reasons(facts(peers=(peer(frozen="reset", frozen_since=NOW - 3),)))
    assert why == [f"a announces its copy reset since {when(NOW - 3)}: its file was cleared, "
                   "replaced or truncated, and this host holds the history it discarded"]


def test_an_offline_peer_reset_still_counts() -> None:
    p = peer(frozen="reset", frozen_since=NOW - 3, online=False, offline_since=NOW - 2,
             grew_at=None)
    [why] = reasons(facts(peers=(p,)))
    assert why.startswith(f"a announces its copy reset since {when(NOW - 3)} "
                          f"(offline since {when(NOW - 2)})")


def test_a_peer_diverged_copy_is_a_reason() -> None:
    why = reasons(facts(peers=(peer(frozen="diverged", frozen_since=NOW - 1),)))
    assert why == [f"a announces its copy diverged since {when(NOW - 1)}: which history is "
                   "right is not decided yet"]


def test_diverged_from_a_peer_is_one_reason_not_two() -> None:
    p = peer(frozen="diverged", diverged=True, diverged_since=NOW - 9, ahead_by=0, size=10**6)
    why = reasons(facts(state="diverged", peers=(p,)))
    assert why == [f"diverged from a since {when(NOW - 9)}: the copies differ inside their "
                   "common prefix"]


def test_a_peer_announcing_a_divergence_with_another_host_is_a_reason() -> None:
    # a's copy and c's differ; ours agrees with both so far: which side is right is open.
    p = peer(disputes=("c",), disputes_since=NOW - 4)
    assert reasons(facts(node="b", peers=(p,))) == [
        f"a announces its copy diverged from c since {when(NOW - 4)}: which history is right "
        "is not decided yet"]
    them = peer(disputes=("b",), disputes_since=NOW - 4)  # a knows first; we will hear of it
    assert reasons(facts(node="b", peers=(them,)))[0].startswith(
        "a announces its copy diverged from this host")


def test_in_sync_with_the_writer_but_diverged_from_a_third_host_is_not_ready() -> None:
    # The split brain seen from c: it follows a, and b wrote another history. Nothing here
    # tells a second writer from a stale or compromised host: one reason, the divergence.
    writer = peer(name="a", disputes=("b",), disputes_since=NOW - 4)
    other = peer(name="b", diverged=True, diverged_since=NOW - 5, disputes=("a", "c"),
                 size=10**6)
    assert reasons(facts(node="c", state="diverged", peers=(writer, other))) == [
        f"diverged from b since {when(NOW - 5)}: the copies differ inside their common prefix"]


def test_a_peer_holding_more_is_a_reason_online_or_not() -> None:
    online = peer(ahead_by=1200, ahead_since=NOW - 2, size=len(CLEAN) + 1200)
    assert reasons(facts(state="behind", peers=(online,))) == [
        f"a holds 1200 more bytes since {when(NOW - 2)}"]
    gone = dataclasses.replace(online, online=False, offline_since=NOW - 600, grew_at=None)
    assert reasons(facts(state="behind", peers=(gone,))) == [
        f"a holds 1200 more bytes since {when(NOW - 2)} (offline since {when(NOW - 600)})"]


def test_a_writer_that_just_went_offline_is_waited_for() -> None:
    writer = peer(online=False, offline_since=NOW - 0.5, grew_at=NOW - 0.7)
    assert reasons(facts(peers=(writer,))) == [
        f"a went offline at {when(NOW - 0.5)} while writing: its last bytes may still be "
        f"on their way (wait {WRITER_SETTLE:g} s)"]
    # Once WRITER_SETTLE has passed: ready, with a note.
    later = decide(facts(now=NOW + WRITER_SETTLE, peers=(writer,)))
    assert later.ready
    assert later.notes == [f"a offline since {when(NOW - 0.5)}: what it wrote after that is "
                           "not here"]


def test_an_idle_peer_going_offline_is_only_a_note() -> None:
    idle = peer(online=False, offline_since=NOW - 0.1, grew_at=NOW - 300)
    verdict = decide(facts(peers=(idle,)))
    assert verdict.ready and len(verdict.notes) == 1
    unknown = peer(online=False, offline_since=NOW - 0.1, grew_at=None)
    assert decide(facts(peers=(unknown,))).ready


def test_broker_connection_and_settling() -> None:
    assert reasons(facts(connected=False, connected_since=None)) == [
        "not connected to the broker: what the peers hold now is unknown"]
    just = NOW - PEERS_SETTLE / 2
    assert reasons(facts(connected_since=just)) == [
        f"connected to the broker since {when(just)}: the peers' positions are still arriving"]
    assert decide(facts(connected_since=NOW - PEERS_SETTLE)).ready


def test_start_up_check_trouble_and_adoption() -> None:
    assert "start-up check of the file running" in reasons(facts(state="verifying"))
    assert reasons(facts(state="paused", trouble="cannot write x: No space left on device")) == [
        "paused: cannot write x: No space left on device"]
    assert reasons(facts(state="error", trouble="cannot read x: Permission denied")) == [
        "error: cannot read x: Permission denied"]
    assert reasons(facts(adopting="a")) == ["adopting a's copy"]


def test_a_peer_not_confirmed_is_a_reason_saying_since_when_and_its_last_write() -> None:
    # The broker dropped a position of the writer: our view of it may be old.
    why = reasons(facts(unconfirmed=(Unconfirmed("a", NOW - 2, "3 of its frames did not "
                                                 "reach us"),)))
    assert why == [f"what a holds is not confirmed since {when(NOW - 2)}: 3 of its frames "
                   f"did not reach us; it last wrote at {when(NOW - 30)}"]
    # A peer we know nothing of, not even a write.
    assert reasons(facts(unconfirmed=(Unconfirmed("c", None, "nothing heard from it yet"),))) \
        == ["what c holds is not confirmed: nothing heard from it yet"]


def test_log_check_problems() -> None:
    bad = CLEAN + b"{oops\n"
    why = reasons(facts(size=len(bad), checked=len(bad), report=report_of(bad)))
    assert why == ["log check found problems: invalid_json 1 (at line 14)"]


def test_log_check_behind() -> None:
    # Never caught up (just started): a reason.
    assert reasons(facts(report=None, checked=0, checked_at=None)) == [
        f"log check running (0 of {len(CLEAN)} bytes)"]
    # Bytes that arrived moments ago on a live copy: a note, not a reason.
    live = decide(facts(size=len(CLEAN) + 500, checked_at=NOW - 1))
    assert live.ready and live.notes == [f"log check running ({len(CLEAN)} of "
                                         f"{len(CLEAN) + 500} bytes)"]
    # Behind for longer than CHECK_GRACE: a reason again.
    stale = NOW - CHECK_GRACE - 1
    assert reasons(facts(size=len(CLEAN) + 500, checked_at=stale)) == [
        f"log check running ({len(CLEAN)} of {len(CLEAN) + 500} bytes), last caught up "
        f"{when(stale)}"]


def test_turn_in_progress_and_late_narrative_are_notes() -> None:
    turn = "t-1"
    start = (json.dumps({"id": "s", "type": "event", "data": {"type": "turn.start"},
                         "timestamp": 1793531112352, "turnId": turn}) + "\n").encode()
    verdict = decide(facts(report=report_of(CLEAN + start)))
    assert verdict.ready
    assert verdict.notes == [f"turn {turn} in progress since line 14 (2026-11-01 11:05:12Z)"]
    # A later turn.start turns the unfinished one into damage.
    after = (json.dumps({"id": "s2", "type": "event", "data": {"type": "turn.start"},
                         "timestamp": 1793531112999, "turnId": "t-2"}) + "\n").encode()
    assert reasons(facts(report=report_of(CLEAN + start + after))) == [
        "log check found problems: open_turn 1 (at line 14)"]


def test_role_replica_and_local_edit_are_notes() -> None:
    verdict = decide(facts(role="replica", note="bytes already replicated were changed"))
    assert verdict.ready
    assert verdict.notes == [
        "role 'replica': a local write freezes this file; change the role before moving the "
        "bot here",
        "bytes already replicated were changed"]


def test_every_reason_is_listed_at_once_in_a_stable_order() -> None:
    many = facts(
        state="reset", freeze="reset", freeze_since=NOW - 1, freeze_detail="x",
        connected=False, connected_since=None, report=report_of(b"{\n"), checked=2, size=2,
        peers=(peer(name="c", ahead_by=5, ahead_since=NOW - 1),
               peer(name="b", frozen="reset", frozen_since=NOW - 1)),
    )
    why = reasons(many)
    assert [w.split(" ")[0] for w in why] == ["frozen", "not", "b", "c", "log"]


def status_doc(*files: dict[str, Any]) -> dict[str, Any]:
    return {"node": "b", "broker": "x:1", "connected": True, "peers": {"a": {"online": True}},
            "files": list(files), "ready_count": {
                "yes": sum(f["ready"] for f in files), "no": sum(not f["ready"] for f in files)}}


def file_doc(key: str, ready: bool, not_ready: list[str], notes: list[str],
             name: str = "events.jsonl") -> dict[str, Any]:
    return {"key": key, "file": name, "size": 10, "file_size": 10, "state": "in_sync",
            "ready": ready, "not_ready": not_ready, "notes": notes, "peers": {}, "diverged": {},
            "freeze": None, "note": None}


def test_ready_report_needs_every_file_of_every_key() -> None:
    doc = status_doc(file_doc("k1", True, [], ["turn t in progress since line 3"]),
                     file_doc("k2", True, [], []),
                     file_doc("k2", False, ["a holds 5 more bytes"], [], name="other.jsonl"))
    assert ready_report(doc, ("k1",)) == (
        True, "k1: ready\n  events.jsonl: note: turn t in progress since line 3")
    ok, text = ready_report(doc, ("k1", "k2"))
    assert not ok and "k2: NOT READY\n  other.jsonl: a holds 5 more bytes" in text
    ok, text = ready_report(doc, ("zz",))
    assert not ok and text == "zz: NOT READY: b replicates no file of this key"


def test_text_status_shows_reasons_notes_and_the_count() -> None:
    text = render(status_doc(file_doc("k1", False, ["a announces its copy reset"], ["n1"])))
    assert "k1/events.jsonl: not ready to take over: a announces its copy reset" in text
    assert "k1/events.jsonl: n1" in text
    assert text.endswith("1 file: 1 in_sync; 0 ready to take over")


# --- end to end ----------------------------------------------------------------------------

TURN = "7d1e2f3a-0000-4000-8000-00000000abcd"
_IDS = iter(range(10**9))


def entry(kind: str, turn: str, data: dict[str, Any] | None = None) -> bytes:
    n = next(_IDS)
    if kind in ("turn.start", "turn.done"):
        line = {"id": f"e-{n}", "type": "event", "data": {"type": kind, "turnId": turn},
                "timestamp": 1793531050000 + n, "turnId": turn}
    else:
        line = {"id": f"e-{n}", "type": kind, "data": data or {}, "timestamp": 1793531050000 + n,
                "turnId": turn}
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def finished_turn(turn: str) -> bytes:
    return (entry("turn.start", turn)
            + entry("message", turn, {"role": "assistant", "content": "*笑* 好的"})
            + entry("turn.done", turn))


def syncd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def file_of(d: Daemon) -> dict[str, Any]:
    return d.file_status(KEY)


def is_ready(d: Daemon, note: str = "") -> dict[str, Any] | None:
    """The file's status once READY, with a note that starts with `note` if one is given
    (the checks of bytes that arrived a moment ago may still be running: see CHECK_GRACE)."""
    f = file_of(d)
    if f.get("ready") is not True:
        return None
    return f if not note or any(n.startswith(note) for n in f["notes"]) else None


def not_ready_because(d: Daemon, *words: str) -> dict[str, Any] | None:
    f = file_of(d)
    text = " | ".join(f.get("not_ready") or [])
    return f if f.get("ready") is False and all(w in text for w in words) else None


def restart(d: Daemon) -> None:
    d.stop()
    d.start()


RESTARTS = [None, "a", "b"]  # which host restarts between the two checks


def pair(make_daemon: Callable[..., Daemon], broker: Broker) -> tuple[Daemon, Daemon]:
    return make_daemon("a", broker), make_daemon("b", broker)


@pytest.mark.parametrize("restarted", RESTARTS)
def test_narrative_catch_up_entries_are_ready_and_verify_clean(
    broker: Broker, make_daemon: Callable[..., Daemon], restarted: str | None
) -> None:
    a, b = pair(make_daemon, broker)
    # The seed's catch-up pass: narrative entries of turn 1 written while preparing turn 2,
    # i.e. after turn 1's turn.done, with turn 1's turnId.
    log = (finished_turn("t1") + entry("ishiki.narrative", "t1", {"text": "好的"})
           + finished_turn("t2") + entry("ishiki.narrative", "t2", {"text": "…"}))
    append(a.path(KEY), log)
    wait_equal(log, b)

    def check() -> None:
        for d in (a, b):
            wait_until(lambda d=d: is_ready(d, "late ishiki.narrative entries: 2"), 10,
                       f"{d.node} ready, with a note")
            done = syncd("verify", str(d.path(KEY)))
            assert done.returncode == 0, done.stdout
            assert "late ishiki.narrative entries: 2" in done.stdout

    check()
    if restarted:
        restart(a if restarted == "a" else b)
        check()


@pytest.mark.parametrize("restarted", RESTARTS)
def test_a_turn_in_progress_at_the_tail_is_ready_with_a_note(
    broker: Broker, make_daemon: Callable[..., Daemon], restarted: str | None
) -> None:
    a, b = pair(make_daemon, broker)
    log = finished_turn("t1") + entry("turn.start", TURN) + entry(
        "message", TURN, {"role": "assistant", "content": "thinking"})
    append(a.path(KEY), log)
    wait_equal(log, b)

    def check() -> None:
        for d in (a, b):
            wait_until(lambda d=d: is_ready(d, f"turn {TURN} in progress since line 4"), 10,
                       f"{d.node} ready mid-turn, with a note")
        assert syncd("status", "--config", str(b.config), "--ready", KEY).returncode == 0

    check()
    if restarted:
        restart(a if restarted == "a" else b)
        check()
    # The turn goes on and ends: still ready, the note gone.
    append(a.path(KEY), entry("turn.done", TURN))
    wait_until(lambda: (f := is_ready(b)) and not f["notes"], 10, "b ready, turn ended")


@pytest.mark.parametrize("restarted", RESTARTS)
def test_writer_clear_makes_the_standby_not_ready(
    broker: Broker, make_daemon: Callable[..., Daemon], restarted: str | None
) -> None:
    a, b = pair(make_daemon, broker)
    old = finished_turn("t1") + finished_turn("t2")
    append(a.path(KEY), old)
    wait_equal(old, b)
    wait_until(lambda: is_ready(b), 10, "b ready before the clear")
    # The bot's clear(): the file is deleted, and the next append starts a new history.
    a.path(KEY).unlink()
    fresh = finished_turn("t3")
    append(a.path(KEY), fresh)

    def check() -> None:
        f = wait_until(lambda: not_ready_because(b, "a announces its copy reset"), 10,
                       "b not ready because of a's reset")
        assert f["state"] == "in_sync"  # its copy is consistent: only readiness says no
        done = syncd("status", "--config", str(b.config), "--ready", KEY)
        assert done.returncode == 1
        assert f"{KEY}: NOT READY" in done.stdout and "a announces its copy reset" in done.stdout
        js = json.loads(syncd("status", "--json", "--config", str(b.config)).stdout)
        assert js["ready_count"] == {"yes": 0, "no": 1}
        assert syncd("status", "--config", str(b.config)).returncode == 1  # a freeze in view
        # The writer: frozen, showing both what it replicated and what its file holds now.
        w = wait_until(lambda: (f := file_of(a)) and f["state"] == "reset"
                       and f["file_size"] == len(content(a.path(KEY))) and f, 10, "a's status")
        assert w["size"] == len(old) and w["ready"] is False
        assert content(b.path(KEY)) == old

    check()
    append(a.path(KEY), finished_turn("t4"))  # the new history grows; status keeps up
    wait_until(lambda: file_of(a)["file_size"] == len(content(a.path(KEY))), 10, "file_size")
    if restarted:
        restart(a if restarted == "a" else b)
        check()


def test_status_ready_exit_codes(broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    a, b = pair(make_daemon, broker)
    append(a.path(KEY), finished_turn("t1"))
    wait_equal(content(a.path(KEY)), b)
    wait_until(lambda: is_ready(b), 10, "b ready")
    ok = syncd("status", "--config", str(b.config), "--ready", KEY)
    assert ok.returncode == 0 and ok.stdout.startswith(f"{KEY}: ready")
    unknown = syncd("status", "--config", str(b.config), "--ready", KEY, "nosuch")
    assert unknown.returncode == 1
    assert "nosuch: NOT READY: b replicates no file of this key" in unknown.stdout
    b.stop()
    gone = syncd("status", "--config", str(b.config), "--ready", KEY)
    assert gone.returncode == 2 and "not running" in gone.stderr


def test_failover_drill(broker: Broker, make_daemon: Callable[..., Daemon]) -> None:
    """The drill of docs/operations.md: writer on A, A dies, B READY, the bot moves to B and
    writes, A returns and fast-forwards; the reverse with a clear() in between says not ready."""
    a, b = pair(make_daemon, broker)
    first = finished_turn("t1") + entry("turn.start", "t2")
    append(a.path(KEY), first)
    wait_equal(first, b)
    a.kill()  # the active host dies mid-turn
    wait_until(lambda: is_ready(b, "a offline since"), 10, "b ready once a is gone")
    assert syncd("status", "--config", str(b.config), "--ready", KEY).returncode == 0
    # The bot moves to B: it ends the interrupted turn and goes on.
    taken_over = entry("turn.done", "t2") + finished_turn("t3")
    append(b.path(KEY), taken_over)
    a.start()  # A returns and fast-forwards by itself
    wait_equal(first + taken_over, a)
    wait_state(a, "in_sync")
    wait_until(lambda: is_ready(a), 10, "a ready to take back")
    # The reverse, with a clear() on B (the writer now) before it dies.
    b.path(KEY).unlink()
    append(b.path(KEY), finished_turn("t4"))
    wait_state(b, "reset")
    # b announces its reset once its freeze record is durable: a hears it, then b dies.
    wait_until(lambda: not_ready_because(a, "b announces its copy reset"), 10,
               "a not ready: b reset")
    b.kill()
    done = syncd("status", "--config", str(a.config), "--ready", KEY)
    assert done.returncode == 1 and "b announces its copy reset" in done.stdout


def test_an_idle_log_check_starts_no_task_and_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once caught up, following an unchanged file starts no task (the sweep follows every
    file every second: a task each was most of an idle daemon's CPU), and the state is saved
    at the end of the catch-up itself, not left 'unsaved' forever. (A few new bytes start no
    task either: they are checked in the pass of every file due that turn, logfollow.py.)"""
    log_file = tmp_path / "events.jsonl"
    log_file.write_bytes(ishiki_lines(5))
    size = log_file.stat().st_size
    verifier = IncrementalVerifier(log_file, tmp_path / "state" / "events.jsonl.verify")

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        started = 0
        real = loop.create_task

        def counting(coro: Any, **kw: Any) -> Any:
            nonlocal started
            started += 1
            return real(coro, **kw)

        monkeypatch.setattr(loop, "create_task", counting)
        verifier.follow(lambda: size)
        await asyncio.sleep(0)  # the pass, at the end of this turn of the loop
        assert started == 0 and verifier._task is None
        assert verifier.size == size and not verifier.unsaved
        for _ in range(5):  # the sweeps of an idle file
            verifier._followed_at -= FOLLOW_INTERVAL  # as if a second had passed each time
            verifier.follow(lambda: size)
            verifier.save()
        return started

    assert asyncio.run(scenario()) == 0
    assert json.loads((tmp_path / "state" / "events.jsonl.verify").read_bytes())["size"] == size


def test_missing_referenced_resources_are_a_reason_naming_the_first_few() -> None:
    names = tuple(f"artifacts/shake/s{i}.log" for i in range(7))
    why = reasons(facts(missing_resources=names))
    assert why == ["7 resource file(s) the log references are not here: artifacts/shake/s0.log,"
                   " artifacts/shake/s1.log, artifacts/shake/s2.log, artifacts/shake/s3.log, "
                   "artifacts/shake/s4.log and 2 more"]
    assert reasons(facts(resource_conflicts=1))[0].startswith("1 write-once resource file(s)")
    verdict = decide(facts(unheld_resources=2))
    assert verdict.ready
    assert any("held by no host" in n for n in verdict.notes)
