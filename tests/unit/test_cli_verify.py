"""`syncd verify` and `syncd inspect` as an operator reads them: exact text, JSON, exit codes."""

from __future__ import annotations

import shutil
from pathlib import Path

import click
import orjson
import pytest
from click.testing import CliRunner, Result

from syncd.cli import inspect as inspect_cli
from syncd.cli import verify as verify_cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verify"
T1 = "e061c676-0701-4e5c-b2c8-565cf9462c91"
T2 = "5b0c4a7e-2f1d-4c55-9a3e-8d2f6b1c7e40"

COUNTS = """\
turns: 2 started, 2 ended (2 done, 0 failed, 0 aborted)
entries by type:
      4 event
      1 ishiki.compact
      1 ishiki.images
      7 message
messages by role or custom type:
      3 assistant
      1 ishiki.attachment
      2 ishiki.message.created
      1 tool
"""


@click.group()
def cli() -> None:
    """The two commands on a group of their own, as the real group will hold them."""


cli.add_command(verify_cli.command)
cli.add_command(inspect_cli.command)


@pytest.fixture(autouse=True)
def in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative paths keep the file names in the golden text short and machine-independent.
    monkeypatch.chdir(FIXTURES)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def parse_error_of(name: str, number: int) -> str:
    bad = (FIXTURES / name).read_bytes().splitlines()[number - 1]
    try:
        orjson.loads(bad)
    except orjson.JSONDecodeError as error:
        return str(error.msg)  # orjson's wording changes between versions
    raise AssertionError("fixture line parses")


# -- verify: text ---------------------------------------------------------------------------


def test_clean() -> None:
    result = run("verify", "clean.jsonl")
    assert result.exit_code == 0
    assert result.stdout == "clean.jsonl: clean (13 lines, 4750 bytes)\n" + COUNTS
    assert result.stderr == ""


def test_bad_line() -> None:
    result = run("verify", "bad_line.jsonl")
    assert result.exit_code == 1
    assert result.stdout == (
        "bad_line.jsonl: 2 problems (13 lines, 4750 bytes)\n"
        "  line 4 (byte 1066): tool call call_8Jq2dM1xV4 (read) has no later tool result\n"
        f"  line 5 (byte 1585): not valid JSON: {parse_error_of('bad_line.jsonl', 5)}\n"
        "turns: 2 started, 2 ended (2 done, 0 failed, 0 aborted)\n"
        "entries by type:\n"
        "      4 event\n"
        "      1 ishiki.compact\n"
        "      1 ishiki.images\n"
        "      6 message\n"
        "messages by role or custom type:\n"
        "      3 assistant\n"
        "      1 ishiki.attachment\n"
        "      2 ishiki.message.created\n"
    )


def test_unpaired_tool_call() -> None:
    result = run("verify", "unpaired_tool_call.jsonl")
    assert result.exit_code == 1
    assert result.stdout == (
        "unpaired_tool_call.jsonl: 1 problem (12 lines, 4360 bytes)\n"
        "  line 4 (byte 1066): tool call call_8Jq2dM1xV4 (read) has no later tool result\n"
        + COUNTS.replace("      7 message", "      6 message").replace("      1 tool\n", "")
    )


def test_torn_tail() -> None:
    result = run("verify", "torn_tail.jsonl")
    assert result.exit_code == 1
    assert result.stdout == (
        "torn_tail.jsonl: 1 problem (12 lines, 4546 bytes)\n"
        "  line 13 (byte 4439): torn tail: 107 bytes without a final newline (not valid JSON)\n"
        + COUNTS.replace("      1 ishiki.compact\n", "")
    )


def test_a_turn_in_progress_is_a_note() -> None:
    result = run("verify", "open_turn.jsonl")
    assert result.exit_code == 0
    assert result.stdout == (
        "open_turn.jsonl: clean (11 lines, 4115 bytes)\n"
        f"  note: turn {T2} in progress since line 10 (2026-11-01 11:05:12Z)\n"
        "turns: 2 started, 1 ended (1 done, 0 failed, 0 aborted)\n"
        "entries by type:\n"
        "      3 event\n"
        "      1 ishiki.images\n"
        "      7 message\n"
        "messages by role or custom type:\n"
        "      3 assistant\n"
        "      1 ishiki.attachment\n"
        "      2 ishiki.message.created\n"
        "      1 tool\n"
    )


def test_missing_anchor() -> None:
    result = run("verify", "missing_anchor.jsonl")
    assert result.exit_code == 1
    assert result.stdout == (
        "missing_anchor.jsonl: 1 problem (14 lines, 5490 bytes)\n"
        '  line 14 (byte 4750): ishiki.chat.compact anchor lastEntryId "onet" is not an entry id'
        " in this file\n"
        + COUNTS.replace(
            "      1 ishiki.compact\n", "      1 ishiki.chat.compact\n      1 ishiki.compact\n"
        )
    )


def test_empty_file_and_blank_lines(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    result = run("verify", str(empty))
    assert result.exit_code == 0
    assert result.stdout == (
        f"{empty}: clean (0 lines, 0 bytes)\n"
        "turns: 0 started, 0 ended (0 done, 0 failed, 0 aborted)\n"
        "entries by type: none\n"
        "messages by role or custom type: none\n"
    )
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n")
    assert run("verify", str(blank)).stdout.splitlines()[0] == (
        f"{blank}: clean (1 line, 1 blank, 1 byte)"
    )


def test_long_lists_are_cut(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("syncd.core.logcheck.MAX_LISTED", 2)
    broken = tmp_path / "events.jsonl"
    broken.write_bytes(b"[]\n" * 5)
    lines = run("verify", str(broken)).stdout.splitlines()
    assert lines[:4] == [
        f"{broken}: 5 problems (5 lines, 15 bytes)",
        "  line 1 (byte 0): valid JSON but not an object (array)",
        "  line 2 (byte 3): valid JSON but not an object (array)",
        "  ... and 3 more not listed",
    ]


def test_large_file_is_read_in_chunks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(verify_cli, "CHUNK_SIZE", 7)  # lines span many reads
    path = tmp_path / "events.jsonl"
    shutil.copy(FIXTURES / "bad_line.jsonl", path)
    chunked = run("verify", "--json", str(path)).stdout
    monkeypatch.setattr(verify_cli, "CHUNK_SIZE", 1 << 20)
    assert chunked == run("verify", "--json", str(path)).stdout


# -- verify: JSON ---------------------------------------------------------------------------


def test_json_output() -> None:
    result = run("verify", "--json", "torn_tail.jsonl")
    assert result.exit_code == 1
    assert orjson.loads(result.stdout) == {
        "clean": False,
        "files": [
            {
                "path": "torn_tail.jsonl",
                "clean": False,
                "bytes": 4546,
                "lines": 12,
                "blank_lines": 0,
                "entries": 12,
                "problem_total": 1,
                "problem_counts": {"torn_tail": 1},
                "problems": [
                    {
                        "kind": "torn_tail",
                        "line": 13,
                        "offset": 4439,
                        "message": "torn tail: 107 bytes without a final newline (not valid JSON)",
                    }
                ],
                "turn_events": {
                    "turn.start": 2,
                    "turn.done": 2,
                    "turn.failed": 0,
                    "turn.aborted": 0,
                },
                "entry_types": {"event": 4, "ishiki.images": 1, "message": 7},
                "message_types": {
                    "assistant": 3,
                    "ishiki.attachment": 1,
                    "ishiki.message.created": 2,
                    "tool": 1,
                },
                "late_projections": {},
                "turn_in_progress": None,
                "pending_tool_calls": [],
                "notes": [],
            }
        ],
    }
    assert result.stdout.count("\n") == 1  # one object, one line


def test_json_clean_exit_zero_and_parse_detail() -> None:
    assert orjson.loads(run("verify", "--json", "clean.jsonl").stdout)["clean"] is True
    result = run("verify", "--json", "bad_line.jsonl")
    problems = orjson.loads(result.stdout)["files"][0]["problems"]
    assert problems[1] == {
        "kind": "invalid_json",
        "line": 5,
        "offset": 1585,
        "message": "not valid JSON",
        "detail": parse_error_of("bad_line.jsonl", 5),
    }
    assert problems[0]["tool_call_id"] == "call_8Jq2dM1xV4"
    assert problems[0]["turn_id"] == T1


# -- verify: unusable arguments -------------------------------------------------------------


def test_missing_file_without_config() -> None:
    result = run("verify", "nope.jsonl")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "syncd verify: nope.jsonl: no such file (to name an instance key, pass --config FILE)\n"
    )


def test_instance_directory(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "clean.jsonl", tmp_path / "events.jsonl")
    result = run("verify", str(tmp_path))
    assert result.exit_code == 0
    assert result.stdout.startswith(f"{tmp_path / 'events.jsonl'}: clean (13 lines")
    empty_dir = tmp_path / "other"
    empty_dir.mkdir()
    result = run("verify", str(empty_dir))
    assert result.exit_code == 2
    assert result.stderr == f"syncd verify: {empty_dir} is a directory without an events.jsonl\n"


def test_unreadable_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify_cli, "read_chunks", refuse)
    result = run("verify", "clean.jsonl")
    assert result.exit_code == 2
    assert result.stderr == "syncd verify: cannot read clean.jsonl: Permission denied\n"


def test_missing_config_file() -> None:
    result = run("verify", "somekey", "--config", "/nonexistent/syncd.toml")
    assert result.exit_code == 2
    assert result.stderr == "syncd verify: /nonexistent/syncd.toml: no such config file\n"


# -- inspect --------------------------------------------------------------------------------

TURN1_TEXT = (
    f"turn {T1} in clean.jsonl: 6 entries, lines 3-8, ended by turn.done\n"
    "  3  2026-11-01T11:04:09.903Z  event          turn.start\n"
    "  4  2026-11-01T11:04:09.957Z  message        assistant -> read(call_8Jq2dM1xV4)\n"
    "  5  2026-11-01T11:04:09.957Z  message        "
    "tool: read(call_8Jq2dM1xV4): image/png 1280×960，已展示给模型\n"
    "  6  2026-11-01T11:04:09.958Z  ishiki.images  shown 1, released 1\n"
    "  7  2026-11-01T11:04:09.966Z  message        "
    "assistant: 看到了，是一只橘猫趴在窗台上晒太阳，尾巴垂在暖气片边上。\n"
    "  8  2026-11-01T11:04:09.968Z  event          turn.done\n"
)


def test_inspect_a_turn() -> None:
    result = run("inspect", "clean.jsonl", "--turn", T1)
    assert result.exit_code == 0
    assert result.stdout == TURN1_TEXT
    assert result.stderr == ""


def test_inspect_an_open_turn() -> None:
    result = run("inspect", "open_turn.jsonl", "--turn", T2)
    assert result.exit_code == 0
    assert result.stdout == (
        f"turn {T2} in open_turn.jsonl: 2 entries, lines 10-11, not ended\n"
        "  10  2026-11-01T11:05:12.352Z  event    turn.start\n"
        "  11  2026-11-01T11:05:13.020Z  message  assistant: 年糕这个名字很适合它！\n"
    )


def test_inspect_json() -> None:
    result = run("inspect", "--json", "clean.jsonl", "--turn", T2)
    assert result.exit_code == 0
    assert orjson.loads(result.stdout) == {
        "turnId": T2,
        "files": [
            {
                "path": "clean.jsonl",
                "status": "ended by turn.done",
                "entries": [
                    {
                        "line": 10,
                        "offset": 3462,
                        "timestamp": 1793531112352,
                        "time": "2026-11-01T11:05:12.352Z",
                        "type": "event",
                        "detail": "turn.start",
                    },
                    {
                        "line": 11,
                        "offset": 3674,
                        "timestamp": 1793531113020,
                        "time": "2026-11-01T11:05:13.020Z",
                        "type": "message",
                        "detail": "assistant: 年糕这个名字很适合它！",
                    },
                    {
                        "line": 12,
                        "offset": 4115,
                        "timestamp": 1793531113024,
                        "time": "2026-11-01T11:05:13.024Z",
                        "type": "event",
                        "detail": "turn.done",
                    },
                ],
            }
        ],
    }


def test_inspect_warns_about_a_bad_line_of_the_turn() -> None:
    result = run("inspect", "bad_line.jsonl", "--turn", T1)
    assert result.exit_code == 0
    assert result.stderr == (
        "syncd inspect: bad_line.jsonl: line 5 mentions the turn but is not valid JSON"
        " (see syncd verify)\n"
    )
    assert "  5  " not in result.stdout
    assert result.stdout.startswith(f"turn {T1} in bad_line.jsonl: 5 entries, lines 3-8,")


def test_inspect_turn_not_found() -> None:
    result = run("inspect", "clean.jsonl", "--turn", "no-such-turn")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == "syncd inspect: turn no-such-turn not found in clean.jsonl\n"


def test_inspect_unusable_arguments() -> None:
    result = run("inspect", "nope.jsonl", "--turn", T1)
    assert result.exit_code == 2
    assert result.stderr == (
        "syncd inspect: nope.jsonl: no such file (to name an instance key, pass --config FILE)\n"
    )
    assert run("inspect", "clean.jsonl").exit_code == 2  # --turn is required


def test_inspect_details_of_other_entries(tmp_path: Path) -> None:
    turn = "t-1"
    entries = [
        {"id": "1", "type": "event", "data": {"type": "turn.start", "turnId": turn}},
        {
            "id": "2",
            "type": "message",
            "data": {"role": "user", "content": [{"type": "text", "text": "line one\n  line two"}]},
        },
        {
            "id": "3",
            "type": "message",
            "data": {
                "role": "custom",
                "type": "ishiki.message.created",
                "data": {"content": "x" * 80, "user": {"id": "u1", "name": "阿岚"}},
            },
        },
        {"id": "4", "type": "ishiki.narrative", "data": {"text": "…"}, "timestamp": "soon"},
        {
            "id": "5",
            "type": "event",
            "data": {"type": "turn.failed", "turnId": turn, "error": {"message": "boom"}},
        },
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps({**e, "turnId": turn}) + b"\n" for e in entries))
    result = run("inspect", str(path), "--turn", turn)
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"turn {turn} in {path}: 5 entries, lines 1-5, ended by turn.failed",
        "  1  -                         event             turn.start",
        "  2  -                         message           user: line one line two",
        "  3  -                         message           ishiki.message.created: 阿岚: "
        + "x" * 55
        + "…",
        "  4  -                         ishiki.narrative",
        "  5  -                         event             turn.failed: boom",
    ]


# -- instance keys through the config ----------------------------------------------------------


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    key_dir = tmp_path / "runtimes" / "bot-1"
    key_dir.mkdir(parents=True)
    shutil.copy(FIXTURES / "open_turn.jsonl", key_dir / "events.jsonl")
    config = tmp_path / "syncd.toml"
    config.write_text('node = "a"\nruntimes_dir = "runtimes"\nstate_dir = "state"\n'
                      'secret_file = "cluster.key"\n')
    return config


def test_verify_an_instance_key(config_file: Path) -> None:
    result = run("verify", "bot-1", "--config", str(config_file))
    assert result.exit_code == 0
    path = config_file.parent.resolve() / "runtimes" / "bot-1" / "events.jsonl"
    assert result.stdout.splitlines()[:2] == [
        f"{path}: clean (11 lines, 4115 bytes)",
        f"  note: turn {T2} in progress since line 10 (2026-11-01 11:05:12Z)",
    ]


def test_inspect_an_instance_key(config_file: Path) -> None:
    result = run("inspect", "bot-1", "--config", str(config_file), "--turn", T2)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].endswith(": 2 entries, lines 10-11, not ended")


def test_unknown_and_invalid_keys(config_file: Path) -> None:
    runtimes = config_file.parent.resolve() / "runtimes"
    result = run("verify", "bot-2", "--config", str(config_file))
    assert result.exit_code == 2
    assert result.stderr == (
        f"syncd verify: bot-2: neither a file nor an instance key with files under {runtimes}\n"
    )
    result = run("verify", "../bot-1", "--config", str(config_file))
    assert result.exit_code == 2
    assert result.stderr == ("syncd verify: ../bot-1: neither a file nor a valid instance key: "
                             "component '..': not a name ('.' and '..' are a directory itself "
                             "and its parent)\n")


def test_broken_config(tmp_path: Path) -> None:
    config = tmp_path / "syncd.toml"
    config.write_text('node = "a"\n')
    result = run("verify", "bot-1", "--config", str(config))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"syncd verify: {config}")
    assert result.stderr.count("\n") == 1


def test_an_instance_directory_names_lines_whose_resources_are_missing(tmp_path: Path) -> None:
    from tests.support.ishiki_writer import image_line, put_artifact, shake_line
    inst = tmp_path / "bot-1"
    inst.mkdir()
    put_artifact(inst, "shake", "here.log", b"x")
    (inst / "events.jsonl").write_bytes(
        shake_line("1", "artifact://shake/here.log") + shake_line("2", "artifact://shake/gone.log")
        + image_line("3", "asset://i1"))
    (inst / "resources" / "artifacts" / "shake" / "here.log.json").unlink()
    result = run("verify", str(inst))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1:5] == [
        "  line 1 (byte 0): references artifact://shake/here.log, but "
        "resources/artifacts/shake/here.log.json is missing",
        "  line 2 (byte 145): references artifact://shake/gone.log, but "
        "resources/artifacts/shake/gone.log is missing",
        "  line 2 (byte 145): references artifact://shake/gone.log, but "
        "resources/artifacts/shake/gone.log.json is missing",
        "  note: 2 file(s) of referenced assets not in resources/assets (not fetched here)",
    ]
    result = run("verify", str(inst), "--json")
    doc = orjson.loads(result.stdout)
    assert doc["files"][0]["problem_counts"] == {"missing_resource": 3}
    assert doc["files"][0]["problems"][0]["reference"] == "artifact://shake/here.log"
