"""`syncd adopt` asks before it archives a copy, unless --yes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from syncd.cli.main import main


def config(tmp_path: Path) -> Path:
    (tmp_path / "rt").mkdir()
    path = tmp_path / "syncd.toml"
    path.write_text('node = "host-b"\nruntimes_dir = "rt"\nstate_dir = "state"\n'
                    'secret_file = "key"\n')
    return path


def test_adopt_without_yes_and_without_a_terminal_changes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["adopt", "bot-1", "--from", "host-a", "--config",
                                       str(config(tmp_path))], input="y\n")
    assert result.exit_code == 1
    assert "Archive this host's copy of bot-1" in result.stderr
    assert "not a terminal, nothing changed: confirm with --yes" in result.stderr


def test_adopt_with_yes_goes_to_the_daemon(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["adopt", "bot-1", "--from", "host-a", "--yes",
                                       "--config", str(config(tmp_path))])
    assert result.exit_code == 2  # asked the daemon, which is not running here
    assert "syncd is not running" in result.stderr
