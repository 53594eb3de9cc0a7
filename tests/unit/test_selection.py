"""Selectors (which keys a command names) and the takeover verdict over them: pure."""

from __future__ import annotations

from typing import Any

import pytest

from syncd.core.selection import matches, narrow, problem
from syncd.core.takeover import takeover, to_json

KEYS = ["alice/main", "alice/onebot_123/group_456", "alice/onebot_123/group_789",
        "alicette/main", "bob/main", "bob/cross_大厅", "main", "-dash/main", "odd[1]",
        "odd1"]


def named(selector: str) -> list[str]:
    return [k for k in KEYS if matches(selector, k)]


def test_a_key_names_itself_only() -> None:
    assert named("alice/main") == ["alice/main"]
    assert named("main") == ["main"]
    assert named("-dash/main") == ["-dash/main"]


def test_a_root_name_or_a_level_above_keys_names_every_key_below_it() -> None:
    assert named("alice") == ["alice/main", "alice/onebot_123/group_456",
                              "alice/onebot_123/group_789"]  # not alicette
    assert named("alice/onebot_123") == ["alice/onebot_123/group_456",
                                         "alice/onebot_123/group_789"]
    assert named("alice/") == named("alice")
    assert named("ali") == []  # a prefix of a name is not a level


def test_a_glob_is_matched_against_the_whole_key_as_include_and_exclude_are() -> None:
    assert named("alice/*") == ["alice/main", "alice/onebot_123/group_456",
                                "alice/onebot_123/group_789"]  # * crosses /
    assert named("*/main") == ["alice/main", "alicette/main", "bob/main", "-dash/main"]
    assert named("*/group_4?6") == ["alice/onebot_123/group_456"]
    assert named("bob/*大厅") == ["bob/cross_大厅"]
    assert named("ALICE/*") == []  # case-sensitive


def test_a_key_with_glob_characters_is_still_named_exactly_by_itself() -> None:
    assert named("odd[1]") == ["odd[1]", "odd1"]  # itself, and the class [1]
    assert named("odd[[]1]") == ["odd[1]"]  # a literal [, as fnmatch spells it


@pytest.mark.parametrize("bad", ["", "/", "//", "a\0b"])
def test_selectors_that_name_nothing_are_refused(bad: str) -> None:
    assert problem(bad) is not None


def file_doc(key: str, ready: bool = True, not_ready: list[str] | None = None,
             name: str = "events.jsonl", notes: list[str] | None = None) -> dict[str, Any]:
    return {"key": key, "file": name, "ready": ready, "not_ready": not_ready or [],
            "notes": notes or []}


def status(*files: dict[str, Any]) -> dict[str, Any]:
    ready = sum(1 for f in files if f["ready"])
    return {"node": "b", "files": list(files), "skipped": [
        {"key": "alice/bad\\xff", "path": "/x", "reason": "r"}, {"key": None, "path": "/y",
                                                                "reason": "r"}],
        "resources": [{"key": "alice/main"}, {"key": "bob/main"}],
        "ready_count": {"yes": ready, "no": len(files) - ready}, "peers": {"a": {}}}


def test_narrow_keeps_what_the_selectors_name_and_recounts() -> None:
    doc = status(file_doc("alice/main"), file_doc("alice/x", False, ["a holds 3 more bytes"]),
                 file_doc("bob/main"))
    out = narrow(doc, ["alice"])
    assert [f["key"] for f in out["files"]] == ["alice/main", "alice/x"]
    assert [s["key"] for s in out["skipped"]] == ["alice/bad\\xff"]
    assert [r["key"] for r in out["resources"]] == ["alice/main"]
    assert out["ready_count"] == {"yes": 1, "no": 1}
    assert out["peers"] == doc["peers"] and out["node"] == "b"
    assert narrow(doc, []) == doc  # no selector: everything


def test_ready_only_when_every_named_file_is_ready_and_every_selector_names_one() -> None:
    doc = status(file_doc("alice/main"), file_doc("alice/x"),
                 file_doc("alice/x", False, ["a holds 3 more bytes"], name="other.jsonl"),
                 file_doc("bob/main"))
    assert takeover(doc, ["bob/*"]).ready
    assert takeover(doc, ["bob", "alice/main"]).ready
    partly = takeover(doc, ["alice/*"])
    assert not partly.ready
    [n] = partly.named
    assert n.keys == ("alice/main", "alice/x") and len(n.files) == 3
    assert [(f.key, f.file, f.reasons) for f in n.unready] == [
        ("alice/x", "other.jsonl", ("a holds 3 more bytes",))]
    # A selector that names nothing is not ready, even next to one that is.
    typo = takeover(doc, ["bob/*", "alcie/*"])
    assert not typo.ready and [x.ready for x in typo.named] == [True, False]
    assert not takeover(doc, []).ready
    # A file two selectors name is counted once.
    assert takeover(doc, ["alice", "alice/*"]).unready_files == 1


def test_exact_is_a_key_naming_only_itself() -> None:
    doc = status(file_doc("alice/main"), file_doc("alice/main/x"))
    assert takeover(doc, ["alice/main/x"]).named[0].exact
    assert not takeover(doc, ["alice/main"]).named[0].exact  # names a key below it too
    assert not takeover(doc, ["alice/*"]).named[0].exact
    assert takeover(doc, ["nosuch"]).named[0].exact  # shown as an unknown key


def test_the_verdict_as_json() -> None:
    doc = status(file_doc("alice/main", notes=["turn t in progress"]),
                 file_doc("alice/x", False, ["a holds 3 more bytes"], notes=["n"]))
    assert to_json(takeover(doc, ["alice/*", "zz"])) == {
        "node": "b", "ready": False,
        "selectors": [
            {"selector": "alice/*", "ready": False, "keys": ["alice/main", "alice/x"],
             "files": 2, "ready_files": 1,
             "not_ready": [{"key": "alice/x", "file": "events.jsonl",
                            "reasons": ["a holds 3 more bytes"], "notes": ["n"]}]},
            {"selector": "zz", "ready": False, "keys": [], "files": 0, "ready_files": 0,
             "not_ready": []},
        ]}
