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
