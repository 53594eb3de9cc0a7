"""Moving a losing copy aside: nothing syncd replaces is ever deleted.

    <state_dir>/archive/<key>/<UTC time>-<file>                 the copy, bit for bit
    <state_dir>/archive/<key>/<UTC time>-<file>.manifest.json   node, key, size, sha256, ...

`<key>` is the key percent-encoded into one directory name (core/statepath.py):
`archive/onebot_123%2Fgroup_456/`; a flat key such as `bot-1` is its own encoding.

Names are never reused (a numeric suffix is added), and the copy is linked or written with
O_EXCL, so an existing archive can never be overwritten.

The losing copy is opened once, from its root one directory at a time (tree.py: no symbolic
link followed, regular files only), and everything after that goes through that descriptor
and its directory's: the hard link is made from it (/proc/self/fd), a copy across filesystems
reads it, the manifest's digest hashes it, the name is unlinked and the directory synced
through the directory's descriptor.
A copy replaced by a link to a secret elsewhere is refused, and nothing of the link's target
reaches the archive (which the daemon's group may read).
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from syncd.core import statepath
from syncd.core.spot import Spot
from syncd.disk import durable, logfile, tree


class ArchiveChanged(logfile.NotRegularFile):
    """The name stopped naming the file we archived while we archived it (nothing removed)."""


def archive_copy(state_dir: Path, node: str, key: str, file: str, where: logfile.Where,
                 manifest: dict[str, Any]) -> Path:
    """Move the file at `where` (if it exists) into the archive with a manifest; return the
    archive path.

    Raises logfile.NotRegularFile, before anything is written, when it is a symbolic link, not
    a regular file, or reached through a directory that is a link (a Spot: every level)."""
    spot = where if isinstance(where, Spot) else Spot(where.parent.parent,
                                                      (where.parent.name, where.name))
    folder = tree.open_dir(spot.parent)
    try:
        try:
            src: int | None = tree.open_in(folder, spot.name, where=spot.path)
        except FileNotFoundError:
            src = None
        try:
            return _archive(state_dir, node, key, file, spot, folder, src, manifest)
        finally:
            if src is not None:
                os.close(src)
    finally:
        os.close(folder)


def _archive(state_dir: Path, node: str, key: str, file: str, spot: Spot, folder_fd: int,
             src: int | None, manifest: dict[str, Any]) -> Path:
    path = spot.path
    folder = statepath.key_dir(state_dir / "archive", key)
    durable.make_dirs(folder)  # a new archive folder is durable in its parent
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        dest = folder / (f"{stamp}-{file}" + (f".{n}" if n else ""))
        try:
            if src is not None:
                _place(src, dest)
            else:
                dest.touch(exist_ok=False)  # reserve the name; the manifest says it was absent
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - a thousand adoptions in one second
        raise FileExistsError(f"no free archive name under {folder}")
    digest = hashlib.sha256()
    size = 0
    if src is not None:
        for chunk in _read(src):
            digest.update(chunk)
            size += len(chunk)
    info = {
        "node": node, "key": key, "file": file, "original_path": str(path),
        "existed": src is not None, "size": size, "sha256": digest.hexdigest(),
        "archived_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **manifest,
    }
    side = dest.with_name(dest.name + ".manifest.json")
    with side.open("xb") as f:
        f.write(orjson.dumps(info, option=orjson.OPT_INDENT_2))
        f.flush()
        os.fsync(f.fileno())
    logfile.sync_dir(folder)
    if src is not None:
        _remove_name(folder_fd, spot, src)
    os.fsync(folder_fd)
    return dest


def _read(fd: int) -> Iterator[bytes]:
    pos = 0
    while chunk := os.pread(fd, logfile.READ_CHUNK, pos):
        yield chunk
        pos += len(chunk)


def _place(src: int, dest: Path) -> None:
    """Make `dest` hold the file open as `src`: a hard link to it, or a copy of its bytes
    across filesystems. Never by the original name, which may name another file by now."""
    try:
        # Follows the descriptor's magic link to the very inode we checked (not the name).
        os.link(f"/proc/self/fd/{src}", dest)  # FileExistsError rather than overwrite
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOENT, errno.EPERM, errno.EACCES):
            raise
        _copy(src, dest)  # another filesystem (or no /proc): copy through the descriptor
    else:
        os.fsync(src)


def _copy(src: int, dest: Path) -> None:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o666)
    try:
        for chunk in _read(src):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
        os.fsync(out)
    except BaseException:
        os.close(out)
        dest.unlink(missing_ok=True)
        raise
    os.close(out)


def _remove_name(folder_fd: int, spot: Spot, src: int) -> None:
    """Unlink the name if it still names the file we archived (else leave it, and say so),
    in the directory checked when the file was opened, never by a path again."""
    here = os.stat(spot.name, dir_fd=folder_fd, follow_symlinks=False)
    ours = os.fstat(src)
    if (here.st_dev, here.st_ino) != (ours.st_dev, ours.st_ino):
        raise ArchiveChanged(errno.EAGAIN, f"{spot} was replaced while it was being archived; "
                             "it was left in place", str(spot), tree.LINK)
    os.unlink(spot.name, dir_fd=folder_fd)
