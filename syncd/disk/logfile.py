"""Blocking file I/O on one local copy. Small functions; the replica decides when to call them.

Files are opened per operation, except that the descriptors of the last reads and appends
below the roots stay open (openfiles.py: as many as RLIMIT_NOFILE allows, and each used again
only where the name still means its inode). Every open goes through
`open_file`: a file below a runtimes root is a Spot, reached from its root one directory at a
time with no symbolic link followed (tree.py), and only a regular file is accepted, so a copy
replaced by a link to a secret elsewhere, or by a FIFO, or reached through a directory swapped
for a link, is refused with an error that says so, never read, shipped or appended to.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from syncd.core import recordkinds, zstdframes
from syncd.core.errors import ConcurrentWrite, FileReplaced, FileShrank
from syncd.core.ledger import BLOCK, Ledger
from syncd.core.recordkinds import LINES, ZSTD_FRAMES
from syncd.core.records import Stat, line_around  # noqa: F401  (re-exported)
from syncd.core.spot import Spot
from syncd.disk import tree
from syncd.disk.openfiles import APPEND, OPEN, READ
from syncd.disk.tree import NotRegularFile as NotRegularFile  # re-exported

READ_CHUNK = 1 << 20
Where = Spot | Path  # a Spot below a runtimes root; a plain Path elsewhere (see open_file)


def open_file(where: Where, flags: int = os.O_RDONLY, mode: int = 0o666, *,
              key_dir: bool = True) -> int:
    """A descriptor on the regular file at `where`, reached through no symbolic link.

    A Spot (every file below a runtimes root) is opened from its trusted top one component
    at a time (tree.open_file). A plain Path (a file the operator named, outside the roots)
    only guards its last component and, with `key_dir`, its parent directory. Raises
    NotRegularFile otherwise (FileNotFoundError when absent). The checks are made on the
    descriptor returned, so a name swapped for a link afterwards changes nothing."""
    if isinstance(where, Spot):
        return tree.open_file(where, flags, mode)
    if not key_dir:
        return tree.open_in(None, os.fspath(where), flags, mode, where=where)
    try:
        parent = os.open(where.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                         | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotRegularFile(errno.ELOOP, f"{where.parent} is a symbolic link or not a "
                                 "directory; syncd follows no symbolic links",
                                 str(where.parent), tree.LINK) from None
        raise
    try:
        return tree.open_in(parent, where.name, flags, mode, where=where)
    finally:
        os.close(parent)


class _Reader:
    """A read-only descriptor on a regular file reached through no symbolic link: a replicated
    file that is a link (to /etc/shadow, say) is refused, not shipped."""

    def __init__(self, where: Where) -> None:
        self.fd = open_file(where)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def stat(where: Where) -> Stat | None:
    """The file's stat; a symbolic link is not followed (and so is refused when opened)."""
    try:
        st = tree.lstat(where) if isinstance(where, Spot) else os.lstat(where)
    except FileNotFoundError:
        st = None
    if isinstance(where, Spot):
        OPEN.vouch(where, None if st is None else (st.st_dev, st.st_ino))
    if st is None:
        return None
    return Stat(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_range(path: Where, start: int, end: int) -> bytes:
    """Bytes [start, end) of the file; shorter if the file is shorter."""
    if end <= start:
        return b""
    with _Reader(path) as fd:
        return os.pread(fd, end - start, start)


def read_known(path: Where, start: int, end: int) -> bytes:
    """Bytes [start, end) that syncd already read or appended (the log check's reads of a
    live file), through the descriptor they were last read or appended through when it is
    still open (openfiles.py): the inode those bytes are in, whatever the name means now,
    as for a sync. Else opened by name, as read_range. (Reopening per write was an openat2
    walk, an fstat, two fcntl and a close for every write of every busy file, on both
    hosts.)"""
    if end <= start:
        return b""
    held = OPEN.take_any(path) if isinstance(path, Spot) else None
    if held is not None:
        try:
            return os.pread(held.fd, end - start, start)
        except OSError as e:
            if e.errno != errno.EBADF:  # EBADF: a write-only descriptor (opened so
                raise  # before appends were opened read-write): read by name
        finally:
            OPEN.give_back(held)  # try/finally: a generator's context manager per write
    return read_range(path, start, end)


def last_line_end(path: Where, start: int, end: int) -> int:
    """Offset just past the last '\\n' in [start, end), or `start` when there is none.

    Searches backwards so that a large backlog costs one read in the common case.
    """
    with _Reader(path) as fd:
        return _last_line_end(fd, start, end)


def _last_line_end(fd: int, start: int, end: int) -> int:
    hi = end
    while hi > start:
        lo = max(start, hi - READ_CHUNK)
        chunk = os.pread(fd, hi - lo, lo)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return lo + i + 1
        hi = lo
    return start


def snapshot(path: Where, ranges: tuple[tuple[int, int], ...], line_end_from: int | None,
             records: str = LINES, record_start: int | None = None
             ) -> tuple[Stat | None, dict[tuple[int, int], bytes], int | None]:
    """The file's stat, the bytes of each range (shorter where the file is shorter) and,
    when asked, the end of its last whole record past `line_end_from` (a line, or a frame:
    recordkinds.py): all through one descriptor, so that they describe one file even if the
    name is replaced meanwhile. A missing file gives (None, {}, None); a symbolic link is
    refused (NotRegularFile)."""
    held = OPEN.take_read(path) if isinstance(path, Spot) else None
    if held is not None:
        fd = held.fd
    else:
        try:
            fd = open_file(path)
        except FileNotFoundError:
            return None, {}, None
    try:
        st = os.fstat(fd)
        if held is None and isinstance(path, Spot):
            held = OPEN.keep(path, READ, fd, (st.st_dev, st.st_ino))
        return _read(fd, st, ranges, line_end_from, records, record_start)
    finally:
        if held is not None:
            OPEN.give_back(held)
        else:
            os.close(fd)


def look(spot: Spot, ranges: tuple[tuple[int, int], ...], line_end_from: int | None,
         records: str = LINES, record_start: int | None = None
         ) -> tuple[Stat | None, dict[tuple[int, int], bytes], int | None]:
    """stat() then snapshot(), with one resolution of the name: its directory is reached as
    stat() reaches it (descriptors, no link followed) and the name stat'ed there; the bytes
    are read through the descriptor of the last read when the name still means its inode
    (openfiles.py, as after a stat()), else through a descriptor opened in that same
    directory (snapshot() would walk from the top once more). What snapshot() returns; the
    stat is of the inode the bytes were read from."""
    try:
        parent = tree.open_parent(spot)
    except FileNotFoundError:
        OPEN.vouch(spot, None)
        return None, {}, None
    try:
        try:
            named = os.stat(spot.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            OPEN.vouch(spot, None)
            return None, {}, None
        OPEN.vouch(spot, (named.st_dev, named.st_ino))
        held = OPEN.take_read(spot)
        if held is None:
            try:
                fd = tree.open_in(parent, spot.name, where=spot.path)
            except FileNotFoundError:
                return None, {}, None
    finally:
        os.close(parent)
    if held is not None:
        # The name's inode is the descriptor's: its stat is the one just taken.
        try:
            return _read(held.fd, named, ranges, line_end_from, records, record_start)
        finally:
            OPEN.give_back(held)
    try:
        st = os.fstat(fd)
        held = OPEN.keep(spot, READ, fd, (st.st_dev, st.st_ino))
    except BaseException:
        os.close(fd)
        raise
    try:
        return _read(fd, st, ranges, line_end_from, records, record_start)
    finally:
        OPEN.give_back(held)


def _read(fd: int, st: os.stat_result, ranges: tuple[tuple[int, int], ...],
          line_end_from: int | None, records: str, record_start: int | None
          ) -> tuple[Stat, dict[tuple[int, int], bytes], int | None]:
    """snapshot()'s reads through `fd`, whose stat is `st`."""
    # No further than the size just seen: a range may reach a fetch window past the end,
    # and pread allocates the whole length it is asked for before it reads.
    size = st.st_size
    reads = {(a, b): os.pread(fd, min(b, size) - a, a) if min(b, size) > a else b""
             for a, b in ranges}
    line_end = None
    if line_end_from is not None and records == ZSTD_FRAMES:
        read_end = max((b for _, b in ranges), default=line_end_from)
        line_end = recordkinds.frame_end_past(
            line_end_from, record_start,
            lambda at: _last_frame_end(fd, at, size, reads, read_end))
    elif line_end_from is not None:
        line_end = _line_end_from_reads(reads, line_end_from, size)
        if line_end is None:
            line_end = _last_line_end(fd, line_end_from, size)
    return Stat(st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns), reads, line_end


def _last_frame_end(fd: int, start: int, size: int,
                    reads: dict[tuple[int, int], bytes] | None = None,
                    stop_at: int | None = None) -> int:
    """End of the last whole Zstandard frame in [start, size), `start` being a frame's start
    (or `start`): the frame and block headers only are read, from `reads` where they hold
    them, else from the file. With `stop_at`, the first frame end at or past it will do (a
    look ships at most what it read: a backlog of a million frames is not walked whole at
    every look)."""
    def read(at: int, n: int) -> bytes:
        for (a, _), data in (reads or {}).items():
            if a <= at and at + n <= a + len(data):
                return data[at - a: at - a + n]
        return os.pread(fd, n, at)

    scanner = zstdframes.FrameScanner(start)
    zstdframes.walk(scanner, read, size, stop_at)
    end = scanner.pos if scanner.at_boundary else scanner.record_start
    return start if end is None else end


def _line_end_from_reads(reads: dict[tuple[int, int], bytes], start: int,
                         size: int) -> int | None:
    """The last line end in [start, size) from a read that already holds those bytes."""
    for (a, _), data in reads.items():
        if a <= start and a + len(data) >= size:
            cut = data.rfind(b"\n", start - a, size - a)
            return a + cut + 1 if cut >= 0 else start
    return None


def append_at(path: Where, offset: int, data: bytes, inode: tuple[int, int] | None) -> Stat:
    """Append `data` at `offset` to the file whose (dev, ino) is `inode`; with inode None,
    create the file, which must not exist yet. Not made durable (the caller syncs once for a
    batch). Raises FileReplaced when the name now holds another file, ConcurrentWrite when
    the size is not `offset` before or `offset + len(data)` after, OSError otherwise (with
    nothing partial left behind)."""
    if isinstance(path, Spot):
        held = OPEN.take_append(path, inode) if inode is not None else None
        if held is not None:
            try:
                return _append_fd(held.fd, offset, data)
            except BaseException:
                OPEN.forget(path)  # opened afresh next time: the error may be the inode's
                raise
            finally:
                OPEN.give_back(held)
    # Read-write: the log check reads the appended bytes back through it (read_known).
    flags = os.O_RDWR | os.O_APPEND
    if inode is None:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        # The umask decides the mode: under the systemd unit (UMask=0007) a copy created here
        # is group-writable, so the bot's user can take it over after a failover.
        fd = open_file(path, flags, 0o666)
    except FileExistsError:
        raise FileReplaced(f"{path} was created by someone else meanwhile") from None
    except FileNotFoundError:
        raise FileReplaced(f"{path} was removed") from None
    kept = False
    try:
        st = os.fstat(fd)
        if inode is not None and (st.st_dev, st.st_ino) != inode:
            raise FileReplaced(f"{path} is another file now (inode {st.st_ino})")
        done = _append_fd(fd, offset, data)
        if isinstance(path, Spot):
            OPEN.give_back(OPEN.keep(path, APPEND, fd, (st.st_dev, st.st_ino)))
            kept = True
        return done
    finally:
        if not kept:
            os.close(fd)


def _append_fd(fd: int, offset: int, data: bytes) -> Stat:
    before = os.fstat(fd).st_size
    if before != offset:
        raise ConcurrentWrite(f"expected {offset} bytes before appending, found {before}")
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError:
        _undo_partial_append(fd, offset, len(data) - len(view))
        raise
    st = os.fstat(fd)
    if st.st_size != offset + len(data):
        raise ConcurrentWrite(f"expected {offset + len(data)} bytes after appending, "
                              f"found {st.st_size}")
    return Stat(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _undo_partial_append(fd: int, offset: int, written: int) -> None:
    """A write failed midway (disk full): take back the bytes this call wrote, and only those,
    so the copy stays a whole-lines prefix of the sender's. If the size says someone else
    appended meanwhile, leave everything as it is (the replica then sees two histories)."""
    if written and os.fstat(fd).st_size == offset + written:
        os.ftruncate(fd, offset)


def sync(path: Where) -> None:
    """fdatasync a file before its bytes are announced: through the descriptor they were last
    read or appended through, when it is still open (openfiles.py), else opened by name."""
    held = OPEN.take_any(path) if isinstance(path, Spot) else None
    if held is not None:
        try:
            os.fdatasync(held.fd)
        finally:
            OPEN.give_back(held)
        return
    try:
        fd = open_file(path)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Where) -> None:
    if isinstance(path, Spot):
        tree.sync_dir(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def chunks(path: Where, start: int, end: int) -> Iterator[bytes]:
    """The bytes [start, end) in reads of at most READ_CHUNK (fewer if the file is shorter)."""
    with _Reader(path) as fd:
        pos = start
        while pos < end:
            chunk = os.pread(fd, min(READ_CHUNK, end - pos), pos)
            if not chunk:
                return
            yield chunk
            pos += len(chunk)


def hash_file(path: Where, limit: int | None = None, whole_lines: bool = True,
              hold: int = 0, records: str = LINES) -> Ledger:
    """A ledger of the file's bytes up to `limit` (or its end); by default only whole records
    (lines, or frames), but never fewer than `hold` bytes (bytes already recorded as held are
    ours, mid-record or not)."""
    ledger = Ledger(records)
    st = stat(path)
    if st is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    size = st.size
    end = size if limit is None else limit
    if whole_lines and records == ZSTD_FRAMES:
        with _Reader(path) as fd:
            end = max(_last_frame_end(fd, 0, end), min(hold, size))
    elif whole_lines:
        end = max(last_line_end(path, 0, end), min(hold, size))
    for chunk in chunks(path, 0, end):
        ledger.extend(chunk)
    return ledger


def partial_block(path: Where, offset: int) -> bytes:
    """The bytes [block_start(offset), offset): what Ledger.digest_at needs."""
    start = offset - offset % BLOCK
    data = read_range(path, start, offset)
    if len(data) != offset - start:
        raise FileShrank(f"{path} is shorter than {offset} bytes")
    return data


def line_number(path: Where, offset: int, records: str = LINES) -> int:
    """1-based number of the line (or frame) that holds byte `offset`."""
    if records == ZSTD_FRAMES:
        with _Reader(path) as fd:
            return zstdframes.record_number(lambda at, n: os.pread(fd, n, at), offset)
    return 1 + sum(chunk.count(b"\n") for chunk in chunks(path, 0, offset))
