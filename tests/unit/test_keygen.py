"""`syncd keygen`: makes this host's key once and prints exactly its [peers] line."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from syncd.cli.main import main
from syncd.core.identity import parse_public
from syncd.disk.keyfile import load_identity


def config(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "syncd.toml"
    p.write_text(f'node = "host-a"\nruntimes_dir = "r"\nstate_dir = "state"\n{extra}'
                 '[mqtt]\nhost = "127.0.0.1"\n')
    return p


def keygen(path: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["keygen", "--config", str(path)])
    return result.exit_code, result.stdout, result.stderr


def test_creates_the_key_once_and_prints_one_line(tmp_path: Path) -> None:
    code, out, err = keygen(config(tmp_path))
    assert code == 0, err
    key_file = tmp_path / "state" / "identity.key"  # the default: in state_dir
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert f"created {key_file}" in err
    node, public = out.rstrip("\n").split(" ")
    assert out.count("\n") == 1 and node == "host-a"
    parse_public(public)  # a valid key text
    assert public == load_identity(key_file).public
    again = keygen(config(tmp_path))  # never replaced: the same line again
    assert again[0] == 0 and again[1] == out and "created" not in again[2]


def test_refuses_a_key_file_others_can_read(tmp_path: Path) -> None:
    path = config(tmp_path, 'identity_file = "id.key"\n')
    assert keygen(path)[0] == 0
    (tmp_path / "id.key").chmod(0o640)
    code, out, err = keygen(path)
    assert code == 2 and out == ""
    assert "readable or writable by others (mode 0640); run: chmod 600" in err


def test_a_key_listed_for_this_host_must_match(tmp_path: Path) -> None:
    """check-config names a [peers] line for this host that is not its key."""
    path = config(tmp_path)
    assert keygen(path)[0] == 0
    other = "Jb0mR2x7LQ5sKpE1nV9cW3yT6uA8dF4gH2jZ5kM7oPw="
    path.write_text(path.read_text() + f'[peers]\nhost-a = "{other}"\nhost-b = "{other}"\n')
    (tmp_path / "r").mkdir()
    result = CliRunner().invoke(main, ["check-config", "--config", str(path)])
    assert result.exit_code == 2
    assert "peers: lists another public key for host-a than identity_file" in result.stderr
