"""References from a log line to the instance's resources, and the files each one needs.

`artifact://<tool>/<name>` is what `data.artifact` of `ishiki.chat.shake` and
`ishiki.chat.compact` holds (and a large tool output's reference): a JSON string that is the
whole reference. It resolves to `resources/artifacts/<tool>/<name>`, whose read also needs the
sidecar `<name>.json`. `asset://<id>` appears inside message content (`<img src="asset://...">`)
and resolves to `resources/assets/<id>` and its sidecar `<id>.json`. Pure: no files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_ASSET = re.compile(rb"asset://([A-Za-z0-9._~-]+)")
_ARTIFACT = re.compile(r"artifact://([A-Za-z0-9._~@+-]+)/([A-Za-z0-9._~@+-]+)")
_MAX_DEPTH = 32


def line_refs(raw: bytes, entry: Any) -> list[str]:
    """The references in one log line (`raw`, and `entry`, the object parsed from it)."""
    out: list[str] = []
    if b"artifact://" in raw:
        out.extend(s for s in _strings(entry, 0) if _ARTIFACT.fullmatch(s) and required(s))
    if b"asset://" in raw:
        out.extend("asset://" + m.group(1).decode("ascii") for m in _ASSET.finditer(raw))
    return out


def _strings(value: Any, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def required(ref: str) -> tuple[str, ...]:
    """The files under resources/ that `ref` needs: the blob, then its sidecar."""
    if ref.startswith("artifact://"):
        base = "artifacts/" + ref[len("artifact://"):]
    elif ref.startswith("asset://"):
        base = "assets/" + ref[len("asset://"):]
    else:
        return ()
    if any(p in ("", ".", "..") for p in base.split("/")):
        return ()
    return (base, base + ".json")
