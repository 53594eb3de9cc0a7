from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import Broker, Daemon


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(node: str, broker: Broker, start: bool = True, extra: str = "",
             tuning: str = Daemon.TEST_TUNING) -> Daemon:
        """`extra`: more config lines; `tuning` replaces the test tuning (sweep_interval ...)."""
        d = Daemon(tmp_path, node, broker, extra=extra, tuning=tuning)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in made:
        d.kill()


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
