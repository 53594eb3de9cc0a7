"""Which instance keys a command names: the SELECTORs of `syncd status` and `--ready`.

A selector names keys in one of three ways, so that a whole profile is named at once:

    bot-1                    the key itself
    alice                    every key below it: a root's name (keys `alice/...`), or any level
                             above instances (`onebot_123`: every chat of that bot)
    'alice/*', '*/group_*'   a shell glob over the whole key, as `include` and `exclude` are:
                             `*` and `?` match `/` too, `[...]` is a class (`[[]` is a `[`)

A key matches a selector when any of the three holds, so a key that holds `*`, `?` or `[` is
still named exactly by itself. Pure: the caller passes the keys it has; nothing here knows
whether a key exists.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

GLOB_CHARS = frozenset("*?[")
MAX_SELECTORS = 1000  # per request: a control request is bounded anyway (64 KiB)
# Characters in one selector: a key is at most 4 levels of 255 bytes and a root's name. Also
# what one pattern costs in fnmatch's cache of compiled patterns, which a client fills.
MAX_SELECTOR = 2048


def problem(selector: str) -> str | None:
    """Why `selector` can name no key (None: it can)."""
    if not selector.strip("/"):
        return "an empty selector names no key"
    if "\0" in selector:
        return "a selector cannot hold NUL"
    if len(selector) > MAX_SELECTOR:
        return f"longer than {MAX_SELECTOR} characters (no key is)"
    return None


def is_glob(selector: str) -> bool:
    return not GLOB_CHARS.isdisjoint(selector)


def matches(selector: str, key: str) -> bool:
    """Whether `selector` names `key`: the key itself, a key below it, or a glob match."""
    below = selector.rstrip("/")
    return (key == selector or key.startswith(below + "/")
            or (is_glob(selector) and fnmatch.fnmatchcase(key, selector)))


def matching(selectors: Iterable[str], key: str) -> bool:
    return any(matches(s, key) for s in selectors)


def narrow(status: Mapping[str, Any], selectors: Iterable[str]) -> dict[str, Any]:
    """A status document (Host.status) with only what `selectors` name: the files, the
    directories not replicated and the instances' resources of matched keys, and
    `ready_count` of those files. No selector: everything. The other fields (node, broker,
    peers, limits) are kept as they are."""
    wanted = tuple(selectors)
    if not wanted:
        return dict(status)

    def kept(items: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [i for i in items if i.get("key") and matching(wanted, i["key"])]

    out = dict(status)
    for field in ("files", "skipped", "resources"):
        if field in status:
            out[field] = kept(status[field])
    if "files" in status and "ready_count" in status:
        ready = sum(1 for f in out["files"] if f["ready"])
        out["ready_count"] = {"yes": ready, "no": len(out["files"]) - ready}
    return out
