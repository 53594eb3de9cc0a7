"""Names that become paths: instance keys and file names; and node ids, which name hosts.

Keys and file names: every name the writer can create is accepted (its sanitiser replaces only
`<>:"/\\|?*`), so `cross_大厅`, `x+y#z`, `onebot_123 456` or `.hidden` are names like any other.
A name is refused only when it could not be one directory entry of its own, or could climb
out of a runtimes root: empty, `.`, `..`, containing NUL or `/`, longer than 255 bytes of
UTF-8 (the filesystems' limit), or not valid UTF-8 (such a name could not travel between
hosts as text). A key is one or more such names joined by `/` (`onebot_123/group_456`).

Node ids keep the strict rule (letters, digits, ".", "_", "-", not starting with a dot, at
most 128 characters): they name MQTT clients and broker users, and today's topics carry them
as they are (`is_valid_name`, used by the config and `syncd forget`).
"""

from __future__ import annotations

import re

NAME_MAX = 255  # bytes of one path component (ext4, xfs, btrfs, tmpfs)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def is_valid_name(name: str) -> bool:
    """A node id (and, until the wire format carries encoded names, a topic level)."""
    return _NAME.fullmatch(name) is not None


def check_name(name: str, what: str) -> str:
    if not is_valid_name(name):
        raise ValueError(
            f"invalid {what} {name!r}: use letters, digits, '.', '_' or '-' "
            "(not starting with '.', at most 128 characters)"
        )
    return name


def part_problem(part: str) -> str | None:
    """Why `part` cannot be one component of a key or a file name (None: it can)."""
    if part == "":
        return "empty"
    if part in (".", ".."):
        return "not a name ('.' and '..' are a directory itself and its parent)"
    if "\0" in part:
        return "contains NUL"
    if "/" in part:
        return "contains '/'"
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if size > NAME_MAX:
        return f"{size} bytes long (at most {NAME_MAX} bytes of UTF-8)"
    return None


def key_problem(key: str) -> str | None:
    """Why `key` cannot be an instance key (None: it can). Depth is the roots' business."""
    for part in key.split("/"):
        problem = part_problem(part)
        if problem is not None:
            if not part:
                return "an empty component (a leading, trailing or doubled '/')"
            return f"component '{printable(part)}': {problem}"
    return None


def file_problem(file: str) -> str | None:
    """Why `file` cannot be a replicated file's name (None: it can)."""
    problem = part_problem(file)
    return None if problem is None else f"file '{printable(file)}': {problem}"


def check_key(key: str) -> str:
    """`key`, or ValueError saying why it is not an instance key."""
    problem = key_problem(key)
    if problem is not None:
        raise ValueError(f"invalid instance key '{printable(key)}': {problem}")
    return key


def printable(name: str) -> str:
    """`name` for messages and JSON: bytes that are not UTF-8 (surrogate escapes) and control
    characters shown as \\xNN; everything else as it is."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
