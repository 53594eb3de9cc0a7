"""Names that travel in topics and become paths: node ids, instance keys, file names.

One rule for all three, so that a name can never climb out of `runtimes_dir` ("..", "/"),
never act as an MQTT wildcard ("+", "#") and never carry NUL: letters, digits, ".", "_", "-",
not starting with a dot, at most 128 characters.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def is_valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_name(name: str, what: str) -> str:
    if not is_valid_name(name):
        raise ValueError(
            f"invalid {what} {name!r}: use letters, digits, '.', '_' or '-' "
            "(not starting with '.', at most 128 characters)"
        )
    return name


MAX_COMPONENT_BYTES = 255  # NAME_MAX of the filesystems syncd runs on
MAX_KEY_DEPTH = 4


def component_problem(part: str) -> str | None:
    """Why one path component cannot be a directory or file name here (None: it can)."""
    if part in ("", ".", ".."):
        return f"{part!r} is not a name"
    if "\x00" in part or "/" in part:
        return f"{part[:60]!r} holds NUL or '/'"
    if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
        return f"{part[:40]!r}... is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def key_problem(key: str) -> str | None:
    """Why an instance key (a '/'-separated relative path) cannot be used (None: it can)."""
    parts = key.split("/")
    if len(parts) > MAX_KEY_DEPTH:
        return f"key {key[:80]!r} is nested deeper than {MAX_KEY_DEPTH} levels"
    for part in parts:
        problem = component_problem(part)
        if problem:
            return f"key {key[:80]!r}: {problem}"
    return None


def file_problem(file: str) -> str | None:
    problem = component_problem(file)
    return f"file {file[:80]!r}: {problem}" if problem else None
