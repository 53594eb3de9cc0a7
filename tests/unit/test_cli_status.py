"""`syncd status` as people read it: sizes, lag, filters and the summary line (golden)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from syncd.cli import status as status_cli
from syncd.cli.main import main
from syncd.cli.status import ready_report, render, select
from syncd.ops.control import ControlError, Unreachable

PEER = {"size": 1833290, "state": "in_sync", "frozen": None, "online": True, "lag_bytes": 0,
        "lag_seconds": 0.0}
STATUS: dict[str, Any] = {
    "node": "host-a", "broker": "broker.internal:8883", "connected": True,
    "peers": {"host-b": {"online": True}, "host-c": {"online": False}},
    "files": [
        {"key": "bot-1", "file": "events.jsonl", "size": 1833290, "state": "in_sync",
         "ready": True, "not_ready": [], "diverged": {}, "freeze": None, "note": None,
         "peers": {"host-b": PEER}},
        {"key": "bot-2", "file": "events.jsonl", "size": 5300, "state": "ahead", "ready": True,
         "not_ready": [], "diverged": {}, "freeze": None, "note": None,
         "peers": {"host-b": {**PEER, "size": 4300, "state": "behind", "lag_bytes": 1000,
                              "lag_seconds": 2.25},
                   "host-c": {**PEER, "size": 0, "state": "behind", "online": False,
                              "lag_bytes": 5300, "lag_seconds": 3600.0}}},
        {"key": "bot-3", "file": "events.jsonl", "size": 700, "state": "behind",
         "ready": False, "not_ready": ["host-b holds 1200 more bytes"], "diverged": {},
         "freeze": None, "note": None,
         "peers": {"host-b": {**PEER, "size": 1900, "state": "ahead"}}},
    ],
}


def test_render_for_people() -> None:
    assert render(STATUS) == "\n".join([
        "node host-a  broker broker.internal:8883 (connected)  peers online: host-b  "
        "offline: host-c",
        "",
        "KEY    FILE          SIZE      STATE    READY  PEERS",
        "bot-1  events.jsonl  1.75 MiB  in_sync  yes    host-b=1.75 MiB in_sync",
        "bot-2  events.jsonl  5.18 KiB  ahead    yes    host-b=4.2 KiB behind lag 1000 B/2.2s, "
        "host-c=0 B behind lag 5.18 KiB/3600.0s (offline)",
        "bot-3  events.jsonl  700 B     behind   no     host-b=1.86 KiB ahead",
        "bot-3/events.jsonl: not ready to take over: host-b holds 1200 more bytes",
        "",
        "3 files: 1 ahead, 1 behind, 1 in_sync; 2 ready to take over",
    ])


def test_render_names_the_broker_in_use_among_several() -> None:
    several = {**STATUS, "broker": "[fd00::2]:1883", "connected": False,
               "brokers": ["mqtt-1.internal:8883", "[fd00::2]:1883", "mqtt-3:1883"]}
    assert render(several).splitlines()[0] == (
        "node host-a  broker [fd00::2]:1883 (DISCONNECTED, 2 of 3 listed)  peers online: "
        "host-b  offline: host-c")


def test_render_says_remote_growth_stopped_and_what_peers_had_refused() -> None:
    """docs/peer-limits.md: a floor reached and refusals at the bounds are printed."""
    limited = {**STATUS, "peer_limits": {
        "remote_growth": {"stopped": True, "low": {"/srv/runtimes": 812331008},
                          "min_free_bytes": 1073741824},
        "refused": {"nested": 3, "budget": 12}}}
    lines = render(limited).splitlines()
    at = lines.index("REMOTE GROWTH STOPPED: /srv/runtimes: 812331008 bytes free, below "
                     "[limits] min_free_bytes (1073741824); no peer's bytes are written here")
    assert lines[at + 1] == "refused at the peer limits ([limits]): 12 budget, 3 nested"
    assert "REMOTE" not in render(STATUS)  # nothing said when nothing happened


def test_select_keys_and_problems() -> None:
    assert [f["key"] for f in select(STATUS, ["bot-2", "bot-3"], False)["files"]] == [
        "bot-2", "bot-3"]
    assert [f["key"] for f in select(STATUS, [], True)["files"]] == ["bot-3"]
    frozen = copy.deepcopy(STATUS)
    frozen["files"][0]["state"] = "diverged"
    assert [f["key"] for f in select(frozen, ["bot-1", "bot-2"], True)["files"]] == ["bot-1"]
    assert render(select(STATUS, ["nope"], False)).endswith("0 files; 0 ready to take over")


def test_watch_redraws_until_interrupted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                                         ) -> None:
    config = tmp_path / "syncd.toml"
    (tmp_path / "rt").mkdir()
    config.write_text('node = "host-a"\nruntimes_dir = "rt"\nstate_dir = "st"\n'
                      'secret_file = "key"\n')
    answers = iter([STATUS, select(STATUS, [], True)])
    monkeypatch.setattr(status_cli, "query", lambda *a, **k: {"status": next(answers)})
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    result = CliRunner().invoke(main, ["status", "--config", str(config), "--watch",
                                       "--interval", "0.5"])
    assert result.exit_code == 0, result.output
    assert sleeps == [0.5, 0.5]
    assert result.output.count("every 0.5s, Ctrl-C to stop") == 2
    assert result.output.count("3 files: ") == 1 and result.output.count("1 file: ") == 1


# --- --ready with selectors, and --wait -------------------------------------------------------


def profile(ready: dict[str, bool]) -> dict[str, Any]:
    """A status document of node b with one events.jsonl per key; False: a reason."""
    return {"node": "b", "peers": {}, "files": [
        {"key": k, "file": "events.jsonl", "ready": ok, "notes": ["turn t in progress"],
         "not_ready": [] if ok else ["a holds 12 more bytes since 2026-11-30 14:05:29Z"]}
        for k, ok in ready.items()]}


def test_ready_text_for_a_profile_and_for_keys() -> None:
    doc = profile({"alice/main": True, "alice/g1": False, "alice/g2": True, "bob/main": True})
    assert ready_report(doc, ["alice/*", "bob", "bob/main", "zz", "z*"]) == (False, "\n".join([
        "alice/*: NOT READY (1 of 3 files not ready, 3 keys)",
        "  alice/g1/events.jsonl: a holds 12 more bytes since 2026-11-30 14:05:29Z",
        "bob: ready (1 key, 1 file)",
        "bob/main: ready",
        "  events.jsonl: note: turn t in progress",
        "zz: NOT READY: b replicates no file of this key",
        "z*: NOT READY: names no file b replicates",
    ]))
    assert ready_report(doc, ["bob"])[0]


def test_ready_text_lists_the_first_files_not_ready_of_many() -> None:
    doc = profile({f"alice/g{i:02d}": False for i in range(25)})
    ok, text = ready_report(doc, ["alice"])
    lines = text.splitlines()
    assert not ok and lines[0] == "alice: NOT READY (25 of 25 files not ready, 25 keys)"
    assert len(lines) == 1 + status_cli.SHOWN + 1
    assert lines[-1] == "  ... and 5 more files not ready (syncd status --problems alice)"


def test_ready_text_escapes_what_peers_and_names_bring() -> None:
    doc = profile({"alice/\x1b[2J": False})
    doc["files"][0]["not_ready"] = ["\x1b]0;owned\x07 holds 3 more bytes"]
    _ok, text = ready_report(doc, ["alice/*"])
    assert "\x1b" not in text and "\\x1b[2J" in text


class Clock:
    """time.monotonic and time.sleep for the CLI's waiting: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def waiting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers: list[Any],
            *args: str, answer_seconds: float = 0.0) -> tuple[Any, Clock, list[dict[str, Any]]]:
    config = tmp_path / "syncd.toml"
    (tmp_path / "rt").mkdir(exist_ok=True)
    config.write_text('node = "b"\nruntimes_dir = "rt"\nstate_dir = "st"\n')
    clock = Clock()
    asked: list[dict[str, Any]] = []

    def query(_path: Path, cmd: str, **kw: Any) -> dict[str, Any]:
        asked.append({"cmd": cmd, **kw})
        clock.now += answer_seconds
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return {"status": answer}

    monkeypatch.setattr(status_cli, "query", query)
    monkeypatch.setattr(status_cli.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(status_cli.time, "sleep", clock.sleep)
    result = CliRunner().invoke(main, ["status", "--config", str(config), *args])
    return result, clock, asked


def test_wait_exits_0_as_soon_as_everything_named_is_ready(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    behind = profile({"alice/main": True, "alice/g1": False})
    ready = profile({"alice/main": True, "alice/g1": True})
    result, clock, asked = waiting(monkeypatch, tmp_path, [behind, behind, ready, behind],
                                   "--ready", "--wait", "60", "alice/*")
    assert result.exit_code == 0, result.output
    assert len(asked) == 3 and asked[0] == {"cmd": "status", "select": ["alice/*"]}
    assert clock.slept == [status_cli.POLL_SECONDS] * 2
    assert result.stdout == "alice/*: ready (2 keys, 2 files)\n"
    assert "READY after 1.0s" in result.stderr


def test_a_slow_answer_is_asked_for_less_often(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    behind = profile({"alice/main": False})
    ready = profile({"alice/main": True})
    # Thousands of files: the daemon takes 0.4 s to answer (on its event loop).
    result, clock, _ = waiting(monkeypatch, tmp_path, [behind, behind, ready], "--ready",
                               "--wait", "60", "alice", answer_seconds=0.4)
    assert result.exit_code == 0
    assert clock.slept == [pytest.approx(1.6)] * 2


def test_wait_exits_1_at_the_deadline_with_the_reasons(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    behind = profile({"alice/main": True, "alice/g1": False})
    result, clock, _ = waiting(monkeypatch, tmp_path, [behind], "--ready", "--wait", "12",
                               "alice/*")
    assert result.exit_code == 1
    assert clock.now == 1012.0  # not a poll interval past the deadline
    assert "alice/g1/events.jsonl: a holds 12 more bytes" in result.stdout
    # While it waits, a line now and then says what it waits for (a journal shows it).
    assert ("not ready after 10s: alice/g1/events.jsonl: a holds 12 more bytes since "
            "2026-11-30 14:05:29Z") in result.stderr
    assert "NOT READY after 12.0s" in result.stderr


def test_wait_asks_again_while_syncd_is_not_running_but_not_when_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gone = Unreachable("syncd is not running (no control socket at st/syncd.sock)")
    ready = profile({"alice/main": True})
    result, _, asked = waiting(monkeypatch, tmp_path, [gone, gone, ready], "--ready",
                               "--wait", "30", "alice")
    assert result.exit_code == 0 and len(asked) == 3
    assert result.stderr.count("syncd is not running") == 1  # said once
    result, clock, _ = waiting(monkeypatch, tmp_path, [gone], "--ready", "--wait", "5",
                               "alice")
    assert result.exit_code == 2 and "still so after 5s" in result.stderr
    assert clock.now == 1005.0
    denied = ControlError("permission denied on st/syncd.sock (run as the syncd user or root)")
    result, _, asked = waiting(monkeypatch, tmp_path, [denied], "--ready", "--wait", "30",
                               "alice")
    assert result.exit_code == 2 and len(asked) == 1


def test_without_wait_ready_asks_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    behind = profile({"alice/main": False})
    result, clock, asked = waiting(monkeypatch, tmp_path, [behind], "--ready", "alice/main")
    assert result.exit_code == 1 and len(asked) == 1 and clock.slept == []
    gone = Unreachable("syncd is not running")
    result, _, asked = waiting(monkeypatch, tmp_path, [gone], "--ready", "alice/main")
    assert result.exit_code == 2 and len(asked) == 1


def test_ready_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = profile({"alice/main": True, "alice/g1": False})
    result, _, _ = waiting(monkeypatch, tmp_path, [doc], "--ready", "--json", "alice")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["ready"] is False and out["node"] == "b" and out["waited_seconds"] == 0
    assert out["selectors"][0]["ready_files"] == 1


@pytest.mark.parametrize("args, error", [
    (["--ready"], "--ready needs at least one SELECTOR"),
    (["--wait", "5", "k"], "--wait goes with --ready"),
    (["--ready", "--wait", "-1", "k"], "--wait"),
    (["--ready", ""], "an empty selector names no key"),
])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], error: str) -> None:
    result = CliRunner().invoke(main, ["status", "--config", str(tmp_path / "x.toml"), *args])
    assert result.exit_code == 2 and error in result.output, result.output


def test_a_selector_that_begins_with_a_dash_follows_two_dashes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = profile({"-dash/main": True})
    result, _, asked = waiting(monkeypatch, tmp_path, [doc], "--ready", "--wait", "5", "--",
                               "-dash")
    assert result.exit_code == 0, result.output
    assert asked[0]["select"] == ["-dash"] and result.stdout.startswith("-dash: ready")


def test_select_names_profiles_and_globs() -> None:
    assert [f["key"] for f in select(STATUS, ["bot-*"], False)["files"]] == [
        "bot-1", "bot-2", "bot-3"]
    assert [f["key"] for f in select(STATUS, ["bot-[12]"], True)["files"]] == []


def test_render_shows_a_limit_warning_before_the_summary() -> None:
    warned = {**STATUS, "inotify": {"warnings": ["fs.inotify.max_user_watches is 8192, fewer "
                                                 "than the 12034 directories ..."]}}
    lines = render(warned).splitlines()
    assert lines[-3:] == ["warning: fs.inotify.max_user_watches is 8192, fewer than the 12034 "
                          "directories ...", "",
                          "3 files: 1 ahead, 1 behind, 1 in_sync; 2 ready to take over"]
    assert "warning" not in render(STATUS)


def test_render_names_what_the_bot_planted_below_an_instance() -> None:
    planted = copy.deepcopy(STATUS)
    planted["files"] = planted["files"][:1]
    planted["resources"] = [{
        "key": "bot-1", "conflicts": [], "refused": [], "fetching": [],
        "skipped_paths": [
            {"path": "artifacts", "kind": "symlink",
             "reason": "a symbolic link: not followed, not replicated"},
            {"path": "artifacts/private", "kind": "unreadable",
             "reason": "cannot open: Permission denied"}],
        "skipped_paths_count": 3}]
    planted["unsafe_paths"] = {
        "total": 3, "by_kind": {"symlink": 2, "unreadable": 1}, "at_least": False,
        "recent": [{"path": "/rt/bot-1/resources/artifacts", "kind": "symlink",
                    "reason": "a symbolic link: not followed, not replicated"}]}
    assert render(planted).splitlines()[4:] == [
        "",
        "bot-1/resources/artifacts: not followed (symlink): a symbolic link: not followed, "
        "not replicated",
        "bot-1/resources/artifacts/private: not followed (unreadable): cannot open: "
        "Permission denied",
        "bot-1/resources: and 1 more not followed (see --json)",
        "",
        "3 entries below the roots refused, never followed (2 symlink, 1 unreadable)",
        "  /rt/bot-1/resources/artifacts: a symbolic link: not followed, not replicated",
        "",
        "1 file: 1 in_sync; 1 ready to take over",
    ]
