"""The shell around one instance's ResourceMachine: scans resources/, hashes, writes, serves.

Every decision is the machine's (core/resources.py); this file only does the I/O it asks for:

- scan: list resources/ (no symbolic link followed), and hash each file whose (inode, size,
  mtime, ctime) changed since it was last hashed, like git's index, so a sweep costs a stat
  per file. A file whose stat changes while it is hashed is left for the next scan: only
  complete, published files are reported (the writer publishes by rename).
- fetched bytes go to `.<name>.syncd.tmp` next to the final name; installing checks the whole
  file's SHA-256, fsyncs it, then links it in place without overwriting (write-once: a name
  that exists meanwhile is never replaced) or renames it over the sidecar the machine last
  saw (if the sidecar changed meanwhile, its local writer came first: nothing is replaced),
  and fsyncs the directory. Scans and installs hold one lock, so a scan never reports a file
  syncd itself is installing as a local write.
- the manifest and the stats it was hashed at are saved in state_dir (resources.json), so a
  restart rehashes only what changed while syncd was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat as stat_mode
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import orjson

from syncd.core import frames
from syncd.core.frames import Kind, ResEntry
from syncd.core.names import printable
from syncd.core.resources import (
    Compare,
    Compared,
    Conflict,
    Discard,
    Effect,
    Event,
    Install,
    Installed,
    InstallFailed,
    LocalFile,
    LocalGone,
    Refused,
    ResourceMachine,
    Save,
    Send,
    Serve,
    Tick,
    Write,
)
from syncd.disk import store

log = logging.getLogger("syncd.resources")

TEMP_SUFFIX = ".syncd.tmp"
STATE_VERSION = 1
Ident = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns


class ResourceHost(Protocol):
    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None: ...


def temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{TEMP_SUFFIX}")


def _ident(st: os.stat_result) -> Ident:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _walk(folder: Path, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """(name relative to resources/, stat) of every regular file; links are not followed."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        name = prefix + e.name
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat_mode.S_ISDIR(st.st_mode):
            yield from _walk(Path(e.path), name + "/")
        elif stat_mode.S_ISREG(st.st_mode):
            yield name, st


def _hash(path: Path) -> tuple[int, bytes, Ident] | None:
    """(size, sha256, stat) of a file whose stat did not change while it was read."""
    try:
        fd = store.open_file(path, key_dir=False)
    except OSError:
        return None
    try:
        before = _ident(os.fstat(fd))
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
        after = _ident(os.fstat(fd))
    finally:
        os.close(fd)
    try:
        named = _ident(os.lstat(path))
    except OSError:
        return None
    if before != after or after != named or size != after[1]:
        return None  # changed (or replaced) while read: the next scan looks again
    return size, h.digest(), after


class ResourceFiles:
    def __init__(self, host: ResourceHost, key: str, folder: Path, state_file: Path,
                 machine: ResourceMachine) -> None:
        self.host = host
        self.key = key
        self.folder = folder  # <instance>/resources
        self.state_file = state_file
        self.intents_file = state_file.with_name(state_file.stem + ".intents.json")
        self.machine = machine
        self.idents: dict[str, Ident] = {}
        self.loaded = False
        self._pending: list[Event] = []
        self._lock = asyncio.Lock()
        self._scan_task: asyncio.Task[None] | None = None
        self._rescan = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._save_soon = False
        self._intents: dict[str, ResEntry] = {}  # installs under way (saved: see _recover)
        self._ready: list[Install] = []  # checked, durable temp files waiting to be put
        self._installer: asyncio.Task[None] | None = None
        self.installed = 0
        self.scanned_at = -1e18  # when the last scan started (monotonic)
        self.served_bytes = 0

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._load())

    async def stop(self) -> None:
        extra = [t for t in (self._scan_task, self._installer) if t is not None]
        for t in list(self._tasks) + extra:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._save()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self) -> None:
        try:
            saved = orjson.loads(self.state_file.read_bytes())
            if saved.get("version") == STATE_VERSION:
                self.machine.restore(ResEntry(e[0], e[1], bytes.fromhex(e[2]), e[3], e[4])
                                     for e in saved["entries"])
                self.idents = {n: (i[0], i[1], i[2], i[3]) for n, i in saved["idents"].items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("%s: saved resource manifest unusable (%s); hashing every file again",
                        self.state_file, e)
        try:
            intents = [ResEntry(e[0], e[1], bytes.fromhex(e[2]), e[3], e[4])
                       for e in orjson.loads(self.intents_file.read_bytes())]
            await asyncio.to_thread(self._recover, intents)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("%s: saved installs unusable (%s)", self.intents_file, e)
        # Our own temp files from a run that ended mid-transfer: never complete, never shown.
        for name, _ in await asyncio.to_thread(lambda: list(_walk(self.folder))):
            if name.endswith(TEMP_SUFFIX) and name.rsplit("/", 1)[-1].startswith("."):
                with contextlib.suppress(OSError):
                    (self.folder / name).unlink()
        await self._scan()
        self.loaded = True
        pending, self._pending = self._pending, []
        for event in pending:
            self.deliver(event)

    def _recover(self, intents: list[ResEntry]) -> None:
        """Installs recorded as intended before a kill -9: where the file holds exactly those
        bytes, it is that fetched version (else the scan judges it as a local write)."""
        for e in intents:
            hashed = _hash(self.folder / e.name)
            if hashed is not None and hashed[1] == e.digest:
                self.machine.local[e.name] = e
                self.idents[e.name] = hashed[2]
        if intents:
            self.machine.restore(self.machine.local.values())

    # -- events in --------------------------------------------------------------------------

    def deliver(self, event: Event) -> None:
        if not self.loaded:
            self._pending.append(event)
            return
        self._perform(self.machine.handle(event, time.monotonic()))

    def hint(self, path: str | None = None) -> None:
        """Something under resources/ changed: scan soon (one scan at a time). A hint about a
        file whose stat is the one recorded (most often one syncd just installed) is none."""
        if not self.loaded:
            return
        if path is not None:
            try:
                name = str(Path(path).relative_to(self.folder))
                if self.idents.get(name) == _ident(os.lstat(path)):
                    return
            except (ValueError, OSError):
                pass
        if self._scan_task is not None and not self._scan_task.done():
            self._rescan = True
            return
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop())

    def sweep(self, rescan: bool) -> None:
        """The node's sweep: timers, and (`rescan`) the safety net under inotify's hints."""
        if self.loaded:
            if self.machine.due(time.monotonic()):
                self.deliver(Tick())
            if rescan:
                self.hint()

    async def _scan_loop(self) -> None:
        while True:
            self._rescan = False
            await self._scan()
            if not self._rescan:
                return

    async def _scan(self) -> None:
        self.scanned_at = time.monotonic()
        async with self._lock:
            events = await asyncio.to_thread(self._scan_files, set(self.machine.local))
        for event in events:
            if self.loaded:
                self.deliver(event)
            else:
                self._perform(self.machine.handle(event, time.monotonic()))

    def _scan_files(self, known: set[str]) -> list[Event]:
        rules = self.machine.rules
        found: dict[str, os.stat_result] = {}
        for name, st in _walk(self.folder):
            if rules.kind(name) is not None:
                found[name] = st
        events: list[Event] = []
        for name, st in sorted(found.items()):
            if self.idents.get(name) == _ident(st) and name in known:
                continue
            if st.st_size > rules.max_file_bytes:
                events.append(LocalFile(name, st.st_size, b""))
                continue
            hashed = _hash(self.folder / name)
            if hashed is None:
                continue
            size, digest, ident = hashed
            self.idents[name] = ident
            events.append(LocalFile(name, size, digest, ident[2]))
        for name in sorted(set(self.idents) - set(found)):
            del self.idents[name]
        for name in sorted(known - set(found)):
            events.append(LocalGone(name))
        return events

    # -- effects out ------------------------------------------------------------------------

    def _perform(self, effects: list[Effect]) -> None:
        for e in effects:
            match e:
                case Send(kind, payload, to):
                    self.host.send(kind, self.key, frames.RESOURCES, payload, to)
                case Serve():
                    self._spawn(self._serve(e))
                case Write():
                    self._write(e)
                case Install():
                    self._intents[e.entry.name] = e.entry
                    self._spawn(self._install(e))
                case Discard(name):
                    with contextlib.suppress(OSError):
                        temp_path(self.folder / name).unlink()
                case Compare():
                    self._compare(e)
                case Conflict(name, peer, offset, ours, theirs):
                    log.error("resource %s of %s differs from %s's copy from byte %d on (here "
                              "%d bytes sha256 %s, there %d bytes sha256 %s): a write-once file,"
                              " neither copy is replaced (frozen)", printable(name),
                              printable(self.key), peer, offset, ours.size, ours.digest.hex(),
                              theirs.size, theirs.digest.hex(), extra={"peer": peer})
                case Refused(name, reason):
                    log.error("resource %s of %s is not replicated: %s", printable(name),
                              printable(self.key), reason)
                case Save():
                    if not self._save_soon:
                        self._save_soon = True
                        asyncio.get_running_loop().call_soon(self._save)

    def _write(self, e: Write) -> None:
        final = self.folder / e.name
        try:
            _make_dirs(self.folder, final.parent)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if e.fresh else 0)
            fd = store.open_file(temp_path(final), flags, 0o644)
            try:
                if e.data:
                    os.pwrite(fd, e.data, e.offset)
            finally:
                os.close(fd)
        except OSError as err:
            log.warning("resource %s: cannot write %s: %s", printable(self.key),
                        printable(e.name), err)
            self.deliver(InstallFailed(e.name, str(err)))

    async def _install(self, e: Install) -> None:
        name = e.entry.name
        try:
            # Checked and made durable outside the lock: installs of many small files overlap.
            await asyncio.to_thread(self._check_temp, e)
        except (OSError, ValueError) as err:
            self._install_failed(name, err)
            return
        self._ready.append(e)
        if self._installer is None or self._installer.done():
            self._installer = asyncio.get_running_loop().create_task(self._install_ready())

    async def _install_ready(self) -> None:
        """Put checked files in place in groups: one fsync per directory per group (a group
        commit), then announce them; what becomes ready meanwhile is the next group."""
        while self._ready:
            group, self._ready = self._ready, []
            intents = _entries_json(self._intents.values())
            async with self._lock:
                done = await asyncio.to_thread(self._put_group, group, intents)
            for e, outcome in zip(group, done, strict=True):
                if isinstance(outcome, Exception):
                    self._install_failed(e.entry.name, outcome)
                    continue
                self.idents[e.entry.name] = outcome
                self.installed += 1
                self._intents.pop(e.entry.name, None)
                self.deliver(Installed(e.entry))

    def _put_group(self, group: list[Install], intents: bytes) -> list[Ident | Exception]:
        # The intents are on disk before any rename (see _recover).
        _write_atomic(self.intents_file, intents)
        out: list[Ident | Exception] = []
        folders: set[Path] = set()
        for e in group:
            try:
                out.append(self._put(e))
                folders.add((self.folder / e.entry.name).parent)
            except (OSError, ValueError) as err:
                out.append(err)
        for folder in sorted(folders):
            try:
                store.sync_dir(folder)
            except OSError as err:  # not durable: announce none of that directory's files
                out = [err if not isinstance(o, Exception) and (
                    self.folder / e.entry.name).parent == folder else o
                    for e, o in zip(group, out, strict=True)]
        return out

    def _install_failed(self, name: str, err: Exception) -> None:
        with contextlib.suppress(OSError):
            temp_path(self.folder / name).unlink()
        log.info("resource %s of %s not installed: %s", printable(name), printable(self.key),
                 err)
        self._intents.pop(name, None)
        self.deliver(InstallFailed(name, str(err)))
        self.hint()

    def _check_temp(self, e: Install) -> None:
        tmp = temp_path(self.folder / e.entry.name)
        hashed = _hash(tmp)
        if hashed is None or hashed[0] != e.entry.size or hashed[1] != e.entry.digest:
            raise ValueError("the bytes received do not have the announced SHA-256 (the file "
                             "changed at the sender meanwhile); fetching again")
        store.sync(tmp)

    def _put(self, e: Install) -> Ident:
        final = self.folder / e.entry.name
        tmp = temp_path(final)
        if e.expect is None:
            # Write-once: link() fails if the name exists, so nothing is ever overwritten.
            try:
                os.link(tmp, final, follow_symlinks=False)
            except FileExistsError:
                raise ValueError("a file took this name here meanwhile; left as it is") from None
            tmp.unlink()
        else:
            try:
                now = _ident(os.lstat(final))
            except FileNotFoundError:
                now = None
            if now is not None and now != self.idents.get(e.entry.name):
                raise ValueError("the sidecar changed here meanwhile (its local writer came "
                                 "first); left as it is")
            os.replace(tmp, final)
        return _ident(os.lstat(final))  # durable once the group's directories are synced

    def _compare(self, e: Compare) -> None:
        try:
            ours = store.read_range(self.folder / e.name, e.offset, e.offset + len(e.data))
        except OSError:
            ours = b""
        differ = None
        if ours != e.data:
            n = min(len(ours), len(e.data))
            differ = e.offset + next((i for i in range(n) if ours[i] != e.data[i]), n)
        event = Compared(e.name, e.theirs, e.offset + len(e.data), differ)
        asyncio.get_running_loop().call_soon(self.deliver, event)

    async def _serve(self, e: Serve) -> None:
        path = self.folder / e.name
        chunk = self.machine.chunk_bytes
        at, end = e.offset, e.offset + e.length
        while at < end:
            try:
                data = await asyncio.to_thread(store.read_range, path, at, min(end, at + chunk))
            except OSError:
                return  # the requester asks again after its timeout, and gets a refusal
            if not data:
                return
            self.host.send(Kind.RDATA, self.key, frames.RESOURCES,
                           frames.ResChunk(e.name, e.digest, e.size, at, data), e.peer)
            self.served_bytes += len(data)
            at += len(data)

    def _save(self) -> None:
        self._save_soon = False
        blob = orjson.dumps({
            "version": STATE_VERSION,
            "entries": [[e.name, e.size, e.digest.hex(), e.stamp, e.origin]
                        for e in self.machine.local.values()],
            "idents": self.idents,
        })
        try:
            _write_atomic(self.state_file, blob)
        except OSError as err:
            log.warning("%s: cannot save the resource manifest: %s", self.state_file, err)

    def status(self) -> dict[str, object]:
        out = self.machine.status()
        out.update(key=self.key, path=str(self.folder), installed=self.installed,
                   served_bytes=self.served_bytes)
        return out


def _make_dirs(top: Path, folder: Path) -> None:
    """Create `folder` below `top` (its parent, the instance directory, must exist), one
    level at a time, refusing to go through a symbolic link."""
    rel = folder.relative_to(top)
    at = top
    for part in (".", *rel.parts):
        at = at / part if part != "." else at
        try:
            st = os.lstat(at)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(at)
            st = os.lstat(at)
        if not stat_mode.S_ISDIR(st.st_mode):
            raise store.NotRegularFile(20, f"{at} is not a directory (or is a symbolic link)",
                                       str(at))


def _entries_json(entries: Iterable[ResEntry]) -> bytes:
    return orjson.dumps([[e.name, e.size, e.digest.hex(), e.stamp, e.origin] for e in entries])


def _write_atomic(path: Path, blob: bytes) -> None:
    # No fsync: a record lost to a power cut costs a rehash (and a sidecar version number
    # taken from its mtime), never a wrong file.
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(blob)
    tmp.replace(path)
