"""Instance keys as file names in state_dir (`files/<key>/`, `archive/<key>/`), reversibly.

A key may hold `/`, spaces, `%` or any other character, and be up to a few KiB long; a file
name may hold none of `/` and NUL and at most 255 bytes. So a key is percent-encoded: the
bytes of its UTF-8 that are letters, digits, `_`, `-` or `.` (except a leading `.`) stay as
they are, every other byte becomes `%XX`. `onebot_123/group_456` is `onebot_123%2Fgroup_456`,
`cross_大厅` is `cross_%E5%A4%A7%E5%8E%85`. A key written by the old code (letters, digits,
`.`, `_`, `-`, not starting with `.`) is its own encoding: its records are found where they
always were.

An encoding longer than SEGMENT characters is cut into segments of SEGMENT, one directory
level each, every segment but the last ending in `~` (a character the encoding never
produces), so that no key's directory can be another key's segment.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote

SEGMENT = 240
_SAFE = "_-."  # with letters and digits (quote keeps those): the old code's key alphabet


def encode(key: str) -> str:
    """`key` as one string of `[A-Za-z0-9_.%-]` (not starting with `.`), reversibly."""
    text = quote(key, safe=_SAFE, encoding="utf-8", errors="strict")
    text = text.replace("~", "%7E")  # quote keeps "~"; it marks continued segments here
    return "%2E" + text[1:] if text.startswith(".") else text


def decode(text: str) -> str:
    return unquote(text, encoding="utf-8", errors="strict")


def key_dir(base: Path, key: str) -> Path:
    """The directory under `base` that belongs to `key` (one level, or more for long keys)."""
    text = encode(key)
    pieces = [text[i:i + SEGMENT] for i in range(0, len(text), SEGMENT)]
    return base.joinpath(*(p + "~" for p in pieces[:-1]), pieces[-1])


def key_of_dir(base: Path, folder: Path) -> str:
    """The key whose directory is `folder` (the inverse of key_dir)."""
    pieces = folder.relative_to(base).parts
    return decode("".join(p.removesuffix("~") for p in pieces))
