"""Words of a command line that syncd prints as a hint, quoted so that the line can be pasted
into a POSIX shell as printed (issue #27: dsh keys begin with `--` and may hold any character).

`quote` leaves a word of plain characters as it is and puts anything else in single quotes
(a single quote inside becomes '"'"'). A word beginning with `-` needs no `--` before it: the
key-taking commands accept such a word as a KEY (cli/common.py, KeyCommand). Pure."""

from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9@%+=:,./_-]+")


def quote(word: str) -> str:
    if _PLAIN.fullmatch(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command(*words: str) -> str:
    """`syncd adopt KEY --from NODE` with each word quoted as needed."""
    return " ".join(quote(w) for w in words)
