"""Which names can be instance keys and file names (syncd/core/names.py)."""

from __future__ import annotations

import pytest

from syncd.core.names import check_key, is_valid_name, key_problem, part_problem, printable

# What Ishiki's sanitiser (it replaces only <>:"/\|?* with _) lets through, and more.
WRITER_NAMES = [
    "cross_大厅",
    "matrix_@bot_example.org_!room_example.org",
    "x+y#z",
    "onebot_123 456",
    "UPPER.lower",
    "大" * 40,  # 120 bytes of UTF-8
    "é" * 127,  # 254 bytes
    ".hidden",
    "trailing.",
    "%2F",
    "~tilde",
    "tab\there",
    "-leading-dash",
]


@pytest.mark.parametrize("name", WRITER_NAMES)
def test_every_name_the_writer_can_create_is_accepted(name: str) -> None:
    assert part_problem(name) is None
    assert key_problem(name) is None
    assert key_problem(f"onebot_123/{name}") is None
    assert check_key(f"{name}/{name}") == f"{name}/{name}"


@pytest.mark.parametrize(("key", "problem"), [
    ("", "an empty component"),
    ("a//b", "an empty component"),
    ("a/", "an empty component"),
    ("/a", "an empty component"),
    (".", "component '.': not a name"),
    ("a/..", "component '..': not a name"),
    ("../etc", "component '..': not a name"),
    ("a\0b", "component 'a\\x00b': contains NUL"),
    ("é" * 128, "256 bytes long (at most 255 bytes of UTF-8)"),
    ("bad\udcffname", "component 'bad\\xffname': not valid UTF-8"),
])
def test_names_that_could_escape_or_cannot_exist_are_refused_with_the_reason(
    key: str, problem: str
) -> None:
    found = key_problem(key)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match="invalid instance key"):
        check_key(key)


def test_node_ids_keep_the_strict_rule() -> None:
    assert is_valid_name("host-a") and is_valid_name("bot.1")
    for bad in ("x+y", "a b", "大厅", ".x", "a/b", "", "x" * 129):
        assert not is_valid_name(bad)


def test_printable_shows_bytes_that_are_not_utf8() -> None:
    assert printable("bad\udcff") == "bad\\xff"
    assert printable("cross_大厅") == "cross_大厅"
