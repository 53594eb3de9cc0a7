"""The two ways disk/tree.py reaches a directory, for tests that run each: openat2 (where the
kernel has it) and the walk one level at a time."""

from __future__ import annotations

import pytest

from syncd.disk import tree

RESOLVERS = ["openat2", "one level at a time"]


def use_resolver(which: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if which != "openat2":
        monkeypatch.setattr(tree._openat2, "works", False)
    elif not tree._openat2.works:
        pytest.skip("no openat2 here")
    return which
