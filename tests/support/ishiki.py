"""Ishiki-shaped log lines for the tests (shapes from the seed)."""

from __future__ import annotations

import json
from pathlib import Path

_SEQ = iter(range(1, 10**9))


def ishiki_lines(n: int, turn: str = "e061c676-0701-4e5c-b2c8-565cf9462c91") -> bytes:
    """n realistic Ishiki entries (shapes from the seed), one JSON object per line."""
    out = []
    for _ in range(n):
        i = next(_SEQ)
        entry = {
            "id": f"00000000-0000-4000-8000-{i:012d}",
            "type": "message",
            "data": {"id": f"m-{i}", "timestamp": 1793531049892 + i, "role": "custom",
                     "type": "ishiki.message.created",
                     "data": {"platform": "test", "selfId": "bot", "channelId": "channel",
                              "messageId": f"m{i}", "content": "你好 " * (i % 7 + 1),
                              "isDirect": True, "user": {"id": "u1", "name": "阿岚"}}},
            "timestamp": 1793531049900 + i,
            "turnId": turn,
        }
        out.append(json.dumps(entry, ensure_ascii=False).encode() + b"\n")
    return b"".join(out)


def write_log(path: Path, at_least: int) -> None:
    """A new log of whole Ishiki lines at `path`, at least `at_least` bytes long."""
    path.parent.mkdir(parents=True, exist_ok=True)
    block = ishiki_lines(2000)
    with path.open("wb") as f:
        while f.tell() < at_least:
            f.write(block)
