"""References from log lines to resources (syncd/core/refs.py), as the log checker keeps them."""

from __future__ import annotations

import orjson

from syncd.core.logcheck import LogChecker
from syncd.core.refs import line_refs, required
from tests.support.ishiki_writer import image_line, shake_line


def refs(raw: bytes) -> list[str]:
    return line_refs(raw, orjson.loads(raw))


def test_artifacts_are_whole_string_values_and_assets_appear_anywhere() -> None:
    assert refs(shake_line("1", "artifact://shake/shake-0190.log")) == [
        "artifact://shake/shake-0190.log"]
    assert refs(image_line("2", "asset://0190f9f3-3ff8-7000")) == ["asset://0190f9f3-3ff8-7000"]
    # A sentence that mentions the scheme is no reference to an artifact.
    assert refs(b'{"data": {"content": "see artifact://shake/x.log please"}}') == []
    assert refs(b'{"data": {"artifact": "artifact://../x"}}') == []


def test_required_files_are_the_blob_and_its_sidecar() -> None:
    assert required("artifact://compact/compact-1.log") == (
        "artifacts/compact/compact-1.log", "artifacts/compact/compact-1.log.json")
    assert required("asset://i1") == ("assets/i1", "assets/i1.json")
    assert required("artifact://shake/..") == ()
    assert required("https://x") == ()


def test_the_checker_keeps_first_appearances_across_feeds_and_restarts() -> None:
    c = LogChecker()
    a = shake_line("1", "artifact://t/a")
    c.feed(a + image_line("2", "asset://i")[:10])
    c.feed(image_line("2", "asset://i")[10:] + shake_line("3", "artifact://t/a"))
    assert c.references() == {"artifact://t/a": (1, 0), "asset://i": (2, len(a))}
    again = LogChecker.from_state(c.to_state())
    assert again.references() == c.references()
