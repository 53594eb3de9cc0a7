"""Keys that begin with `-` (issue #27: a dsh-session key is `--<normalized cwd>--/<id>`) work
in every command that takes a KEY, and the hints syncd prints paste into a shell as printed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from syncd.cli import status as status_cli
from syncd.cli.main import main
from syncd.cli.status import render
from syncd.core.shellwords import command, quote
from tests.support.dsh_histories import HEADER, ev, lines

KEY = "--home-a-proj--/s~002e1"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    session = tmp_path / "rt" / "--home-a-proj--" / "s~002e1"
    session.mkdir(parents=True)
    (session / "session.jsonl").write_bytes(b"".join(lines([
        dict(HEADER), ev("turn/start", turn=1), ev("step/start", turn=1, step=1),
        ev("tool/call", turn=1, step=1, callId="c1", name="bash", arguments="{}")])))
    path = tmp_path / "syncd.toml"
    path.write_text('node = "b"\nruntimes_dir = "rt"\nstate_dir = "st"\nsecret_file = "key"\n'
                    'files = ["session.jsonl"]\n')
    return path


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_verify_a_dash_key_prints_the_dsh_session(config: Path) -> None:
    for args in (["verify", KEY, "--config", str(config)],
                 ["verify", "--config", str(config), KEY],
                 ["verify", f"--config={config}", KEY],
                 ["verify", "--config", str(config), "--", KEY]):
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
        assert ": clean (4 lines" in result.stdout
        assert "dsh session: 3 events; turns: 1 started, 0 ended; steps: 1; tool calls: 1" \
            in result.stdout
        assert "tool call c1 (bash) at line 4 waits for its result" in result.stdout


def test_status_ready_takes_a_dash_key(monkeypatch: pytest.MonkeyPatch, config: Path) -> None:
    asked: list[Any] = []

    def query(_path: Path, cmd: str, **kw: Any) -> dict[str, Any]:
        asked.append(kw)
        return {"status": {"node": "b", "peers": {}, "files": [
            {"key": KEY, "file": "session.jsonl", "ready": True, "not_ready": [],
             "notes": ["tool call c1 (bash) at line 4 waits for its result"]}]}}

    monkeypatch.setattr(status_cli, "query", query)
    result = run("status", "--ready", KEY, "--config", str(config))
    assert result.exit_code == 0, result.output
    assert f"{KEY}: ready" in result.stdout
    assert KEY in str(asked)


def test_adopt_and_inspect_take_a_dash_key(config: Path) -> None:
    result = run("adopt", KEY, "--from", "a", "--yes", "--config", str(config))
    assert result.exit_code == 2, result.output  # reached the daemon, which is not running
    assert "syncd is not running" in result.stderr
    result = run("inspect", "--config", str(config), KEY, "--turn", "t1")
    assert "No such option" not in result.output


def test_an_unknown_option_is_taken_as_a_key_and_said_so(config: Path) -> None:
    result = run("verify", "--config", str(config), "--jsn")
    assert result.exit_code == 2
    assert "--jsn" in result.stderr and "No such option" not in result.stderr


def test_words_are_quoted_only_when_needed() -> None:
    assert quote("bot-1") == "bot-1"
    assert quote(KEY) == "'--home-a-proj--/s~002e1'"
    assert quote("it's") == "'it'\"'\"'s'"
    assert shlex.split(command("syncd", "adopt", "a b'c", "--from", "n")) == [
        "syncd", "adopt", "a b'c", "--from", "n"]


def test_the_adopt_hint_pastes_as_printed() -> None:
    status = {"node": "b", "broker": "x", "connected": True, "peers": {}, "files": [
        {"key": KEY, "file": "session.jsonl", "size": 10, "state": "reset", "ready": False,
         "not_ready": ["frozen"], "diverged": {}, "note": None,
         "freeze": {"reason": "reset", "since": 1_800_000_000.0, "detail": "cleared"},
         "peers": {}}]}
    hint = next(line for line in render(status).splitlines() if "syncd adopt" in line)
    words = shlex.split(hint.split(": ", 1)[1].replace("<node that wins>", "NODE"))
    assert words == ["syncd", "adopt", KEY, "--from", "NODE"]
    # ... and the command line it makes parses: KEY is the KEY, not an option.
    result = run(*words[1:], "--yes", "--config", "/nonexistent.toml")
    assert "No such option" not in result.output


@pytest.mark.parametrize("compressed", [False, True])
def test_inspect_shows_a_dsh_turn_by_its_number(tmp_path: Path, compressed: bool) -> None:
    from tests.support import zstd
    from tests.support.dsh_histories import result
    records = lines([dict(HEADER), ev("turn/start", turn=1), ev("step/start", turn=1, step=1),
                     ev("tool/call", turn=1, step=1, callId="c1", name="bash", arguments="{}"),
                     result(1, 1, "c1"), ev("step/end", turn=1, step=1),
                     ev("turn/end", turn=1, reason={"kind": "completed"}),
                     ev("turn/start", turn=2)])
    path = tmp_path / ("session.jsonl.zstd" if compressed else "session.jsonl")
    path.write_bytes(b"".join(zstd.frame(r) for r in records) if compressed
                     else b"".join(records))
    out = run("inspect", str(path), "--turn", "1")
    assert out.exit_code == 0, out.output
    shown = out.stdout.splitlines()
    assert shown[0] == f"turn 1 in {path}: 6 entries, lines 2-7, ended by turn/end (completed)"
    assert "tool/call" in shown[3] and "bash(c1)" in shown[3]
    assert "result of c1" in shown[4]
    assert run("inspect", str(path), "--turn", "2").stdout.startswith(
        f"turn 2 in {path}: 1 entry, line 8, not ended\n")
    assert run("inspect", str(path), "--turn", "3").exit_code == 1
