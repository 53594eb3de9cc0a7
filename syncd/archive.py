"""Moving a losing copy aside: nothing syncd replaces is ever deleted.

    <state_dir>/archive/<key>/<UTC time>-<file>                 the copy, bit for bit
    <state_dir>/archive/<key>/<UTC time>-<file>.manifest.json   node, key, size, sha256, ...

`<key>` is the key percent-encoded into one directory name (statepath.py):
`archive/onebot_123%2Fgroup_456/`; a flat key such as `bot-1` is its own encoding.

Names are never reused (a numeric suffix is added), and the copy is linked or written with
O_EXCL, so an existing archive can never be overwritten.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from syncd import statepath, store


def archive_copy(state_dir: Path, node: str, key: str, file: str, path: Path,
                 manifest: dict[str, Any]) -> Path:
    """Move `path` (if it exists) into the archive with a manifest; return the archive path."""
    folder = statepath.key_dir(state_dir / "archive", key)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    exists = path.exists()
    for n in range(1000):
        dest = folder / (f"{stamp}-{file}" + (f".{n}" if n else ""))
        try:
            if exists:
                _move_exclusive(path, dest)
            else:
                dest.touch(exist_ok=False)  # reserve the name; the manifest says it was absent
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - a thousand adoptions in one second
        raise FileExistsError(f"no free archive name under {folder}")
    digest = hashlib.sha256()
    size = 0
    if exists:
        with dest.open("rb") as f:
            while chunk := f.read(store.READ_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    info = {
        "node": node, "key": key, "file": file, "original_path": str(path),
        "existed": exists, "size": size, "sha256": digest.hexdigest(),
        "archived_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **manifest,
    }
    side = dest.with_name(dest.name + ".manifest.json")
    with side.open("xb") as f:
        f.write(orjson.dumps(info, option=orjson.OPT_INDENT_2))
        f.flush()
        os.fsync(f.fileno())
    store.sync_dir(folder)
    store.sync_dir(path.parent)
    return dest


def _move_exclusive(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)  # fails with FileExistsError rather than overwrite
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        with src.open("rb") as fin, dest.open("xb") as fout:
            shutil.copyfileobj(fin, fout, store.READ_CHUNK)
            fout.flush()
            os.fsync(fout.fileno())
    else:
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    src.unlink()
