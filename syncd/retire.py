"""Retired nodes (`syncd forget NODE`): who they are, and when one counts as back.

A node retired for good leaves, on the broker, a retirement notice in place of its presence:
an authenticated Presence(online=False, retired=True), retained, stamped when `syncd forget`
ran. Every host that sees it drops the node from its status, metrics and divergences, and
records the retirement in `state_dir/forgotten.json`, so that a restart (or a broker that lost
its retained messages) does not bring it back. Frames from a retired node are then ignored.

A retired node that comes back for real is accepted again: its daemon announces a fresh
presence, online, stamped after the retirement (a presence older than the notice, replayed or
restored from an old broker, is not fresh). We chose this over "retired forever" because a
host name is often reused for a rebuilt machine, and refusing it silently would be worse than
replicating with it; `syncd forget` again retires it again.

The decisions are pure (`Retired.on_presence`); `load` and `save` are the only I/O.
"""

from __future__ import annotations

import contextlib
import os
from enum import Enum
from pathlib import Path

import orjson

FILE_NAME = "forgotten.json"


class Seen(Enum):
    RETIRE = "retire"  # a retirement notice: forget the node now
    RETURN = "return"  # a retired node is back: accept it again
    IGNORE = "ignore"  # from a retired node, not fresh: drop it
    NORMAL = "normal"  # nothing to do with retirement


class Retired:
    def __init__(self, nodes: dict[str, int] | None = None) -> None:
        self.nodes: dict[str, int] = dict(nodes or {})  # node -> retired at (ms, its stamp)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def on_presence(self, node: str, online: bool, retired: bool, ts: int) -> Seen:
        """What an authentic, non-replayed presence from `node` stamped `ts` means."""
        if retired:
            return Seen.IGNORE if self.nodes.get(node, -1) >= ts else Seen.RETIRE
        if node not in self.nodes:
            return Seen.NORMAL
        return Seen.RETURN if online and ts > self.nodes[node] else Seen.IGNORE

    def retire(self, node: str, ts: int) -> None:
        self.nodes[node] = ts

    def back(self, node: str) -> None:
        self.nodes.pop(node, None)


def load(state_dir: Path) -> Retired:
    try:
        raw = orjson.loads((state_dir / FILE_NAME).read_bytes())
    except FileNotFoundError:
        return Retired()
    except (OSError, orjson.JSONDecodeError) as e:
        raise ValueError(f"{state_dir / FILE_NAME}: unreadable ({e})") from None
    nodes = raw.get("retired", {}) if isinstance(raw, dict) else {}
    return Retired({n: int(ts) for n, ts in nodes.items()
                    if isinstance(n, str) and isinstance(ts, int)})


def save(state_dir: Path, retired: Retired) -> None:
    path = state_dir / FILE_NAME
    tmp = path.with_name(path.name + ".tmp")
    data = orjson.dumps({"retired": dict(sorted(retired.nodes.items()))},
                        option=orjson.OPT_INDENT_2)
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    with contextlib.suppress(OSError):  # the rename itself, durable
        fd = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
