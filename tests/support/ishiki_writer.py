"""The Ishiki resource writer, as docs/event-logs.md describes it, for tests.

Blobs: a temp file `.<name>.<uuid>.tmp` opened exclusively, then a rename; sidecars
`<name>.json`: temp `<name>.json.<uuid>.tmp` and a rename, on every put. Run as a script
(`python -m tests.ishiki_writer PATH`) it writes a temp file for PATH, prints "ready" and waits
on stdin: a test kills it there, between the temp file and its rename.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path


def _temp(final: Path, blob: bool) -> Path:
    tag = uuid.uuid4().hex
    return final.with_name(f".{final.name}.{tag}.tmp" if blob else f"{final.name}.{tag}.tmp")


def write_atomic(final: Path, data: bytes, blob: bool = True) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp(final, blob)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    return final


def sidecar(final: Path, **meta: object) -> Path:
    text = json.dumps({"name": final.name, **meta}, sort_keys=True).encode()
    return write_atomic(final.with_name(final.name + ".json"), text, blob=False)


def put_artifact(instance: Path, tool: str, name: str, data: bytes, **meta: object) -> str:
    """Write an artifact and its sidecar; return its `artifact://` reference."""
    blob = write_atomic(instance / "resources" / "artifacts" / tool / name, data)
    sidecar(blob, size=len(data), **meta)
    return f"artifact://{tool}/{name}"


def put_asset(instance: Path, asset_id: str, data: bytes | None, **meta: object) -> str:
    """An asset's sidecar, and its bytes when `data` is given (fetched)."""
    final = instance / "resources" / "assets" / asset_id
    if data is not None:
        write_atomic(final, data)
    final.parent.mkdir(parents=True, exist_ok=True)
    sidecar(final, fetched=data is not None, **meta)
    return f"asset://{asset_id}"


def shake_line(entry_id: str, ref: str) -> bytes:
    entry = {"id": entry_id, "type": "ishiki.chat.shake",
             "data": {"range": [0, 1], "digest": "folded", "artifact": ref}, "timestamp": 1}
    return json.dumps(entry).encode() + b"\n"


def image_line(entry_id: str, ref: str) -> bytes:
    entry = {"id": entry_id, "type": "message",
             "data": {"id": "m-" + entry_id, "role": "custom", "type": "ishiki.message.created",
                      "data": {"content": f'<img src="{ref}"/>'}}, "timestamp": 1}
    return json.dumps(entry).encode() + b"\n"


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp(target, blob=True)
    with open(temp, "wb") as f:
        f.write(os.urandom(300_000))
        f.flush()
    print("ready", temp, flush=True)
    sys.stdin.read()  # killed here, before the rename
    os.rename(temp, target)
