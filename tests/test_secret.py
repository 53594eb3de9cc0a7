from __future__ import annotations

from pathlib import Path

import pytest

from syncd.secret import SecretError, load_secret

SECRET = "correct horse battery staple, long enough"


def test_reads_a_private_secret(tmp_path: Path) -> None:
    p = tmp_path / "cluster.key"
    p.write_text(SECRET + "\n")
    p.chmod(0o600)
    assert load_secret(p) == SECRET.encode()


@pytest.mark.parametrize(("mode", "content", "message"), [
    (0o644, SECRET, "readable or writable by others (mode 0644); run: chmod 600"),
    (0o640, SECRET, "mode 0640"),
    (0o600, "short", "fewer than 16 bytes"),
])
def test_unsafe_or_weak_secrets_are_refused_without_showing_them(
    tmp_path: Path, mode: int, content: str, message: str
) -> None:
    p = tmp_path / "cluster.key"
    p.write_text(content)
    p.chmod(mode)
    with pytest.raises(SecretError) as e:
        load_secret(p)
    assert message in str(e.value)
    assert content not in str(e.value)


def test_missing_secret_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match=r"does not exist .*chmod 600"):
        load_secret(tmp_path / "nope.key")
