"""The shell around one instance's ResourceMachine: scans resources/, hashes, writes, serves.

Every decision is the machine's (core/resources/); this file only does the I/O it asks for,
and every file and directory below resources/ is reached through descriptors, from the
instance's root one level at a time with no symbolic link followed (disk/tree.py): the local
bot owns these directories and may swap any of them for a link at any moment, timed by inotify.

- scan: walk resources/ (iteratively, at most [resources] max_depth levels; a link, a device,
  an unreadable or vanished directory is a problem shown in status and reported once, never
  followed, and the walk goes on), and hash each file whose (inode, size, mtime, ctime)
  changed since it was last hashed, like git's index, so a sweep costs a stat per file. The
  file is hashed through the descriptor the walk's directory gave, and reported only if its
  stat did not change while it was read and its name still names it; then it is made durable
  (the file, then its directory) before it is announced: a file announced and then lost to
  a power cut would come back empty or old, and be announced again under a higher version.
- serve: the file is opened through descriptors again and its stat must be the one it was
  hashed at, before and after every chunk read, or nothing is sent: the asker is refused and
  the file rescanned (and announced anew). Bytes that are not the announced ones never leave.
- fetched bytes go to `.<name>.syncd.tmp` next to the final name; installing checks the whole
  file's SHA-256 through its descriptor, fsyncs it, then links it in place without
  overwriting (write-once: a name that exists meanwhile is never replaced) or renames it over
  the sidecar the machine last saw (if the sidecar changed meanwhile, its local writer came
  first: nothing is replaced), all relative to the directory's descriptor, and fsyncs the
  directory before the file counts as held. Scans and installs hold one lock, so a scan never
  reports a file syncd itself is installing as a local write.
- the manifest and the stats it was hashed at are saved in state_dir (resources.json), so a
  restart rehashes only what changed while syncd was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
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
    ServeFailed,
    Tick,
    Write,
)
from syncd.core.spot import Spot
from syncd.disk import durable as durable_mod
from syncd.disk import logfile, tree
from syncd.disk.tree import NotRegularFile, Problem

log = logging.getLogger("syncd.resources")

TEMP_SUFFIX = ".syncd.tmp"
STATE_VERSION = 1
PROBLEMS_SHOWN = 20
Ident = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns
# What names the same bytes across a link(2) or rename(2), which change the ctime.
Same = tuple[int, int, int]  # inode, size, mtime_ns


class ResourceHost(Protocol):
    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None: ...

    def note_unsafe(self, path: str, kind: str, reason: str) -> None:
        """An entry refused below an instance (links, devices, unreadable directories):
        counted, logged once, shown in status."""

    async def answer_room(self, peer: str) -> None:
        """Return once what we answered `peer` and is not acknowledged yet is under the
        bound (daemon/answers.py)."""


def temp_name(name: str) -> str:
    return f".{name}{TEMP_SUFFIX}"


def _ident(st: os.stat_result) -> Ident:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _same(st: os.stat_result) -> Same:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _hash_at(dir_fd: int, name: str, where: Path, durable: bool
             ) -> tuple[int, bytes, Ident] | None:
    """(size, sha256, stat) of the file `name` in `dir_fd`, if its stat did not change while
    it was read and the name still names it afterwards; `durable`: fsynced too (the caller
    syncs the directory)."""
    try:
        fd = tree.open_in(dir_fd, name, where=where)
    except FileNotFoundError:
        return None
    try:
        before = _ident(os.fstat(fd))
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
        if durable:
            os.fsync(fd)
        after = _ident(os.fstat(fd))
    finally:
        os.close(fd)
    try:
        named = _ident(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except OSError:
        return None
    if before != after or after != named or size != after[1]:
        return None  # changed (or replaced) while read: the next scan looks again
    return size, h.digest(), after


@dataclass
class ScanResult:
    """What a scan found, handed from its thread to the loop in one piece."""

    events: list[Event] = field(default_factory=list)
    idents: dict[str, Ident] = field(default_factory=dict)  # hashed now
    gone: list[str] = field(default_factory=list)  # names no longer found
    problems: list[Problem] = field(default_factory=list)
    more_problems: int = 0  # past the walk's max_problems: counted only
    errors: list[str] = field(default_factory=list)  # logged as warnings


class ResourceFiles:
    def __init__(self, host: ResourceHost, key: str, folder: Spot, state_file: Path,
                 machine: ResourceMachine) -> None:
        self.host = host
        self.key = key
        self.folder = folder  # <instance>/resources
        self.state_file = state_file
        self.intents_file = state_file.with_name(state_file.stem + ".intents.json")
        self.machine = machine
        # The stat each file was hashed (or installed) at: changed only on the loop, at the
        # moment the machine learns the matching digest, so a Serve the machine decides
        # checks the file against the stat of the very bytes it announced.
        self.idents: dict[str, Ident] = {}
        self.problems: list[Problem] = []  # the last scan's: what it did not follow or read
        self.more_problems = 0  # and how many more (not kept: see tree.Walk.max_problems)
        self.loaded = False
        self._pending: list[Event] = []
        self._lock = asyncio.Lock()
        self._scan_task: asyncio.Task[None] | None = None
        self._rescan = False
        self._hinted = False  # a hint came while loading
        self._tasks: set[asyncio.Task[None]] = set()
        self._save_soon = False
        self._intents: dict[str, ResEntry] = {}  # installs under way (saved: see _recover)
        self._ready: list[Install] = []  # checked, durable temp files waiting to be put
        self._checked: dict[str, Same] = {}  # the temp file each ready install checked
        self._installer: asyncio.Task[None] | None = None
        self.installed = 0
        self.scanned_at = -1e18  # when the last scan started (monotonic)
        self.served_bytes = 0
        self.serves_refused = 0  # serves not carried out: the file changed or is unsafe

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
        await asyncio.to_thread(self._remove_temps)
        await self._scan()
        self.loaded = True
        pending, self._pending = self._pending, []
        for event in pending:
            self.deliver(event)
        if self._hinted:
            self.hint()

    def _recover(self, intents: list[ResEntry]) -> None:
        """Installs recorded as intended before a kill -9: where the file holds exactly those
        bytes, it is that fetched version (else the scan judges it as a local write)."""
        for e in intents:
            spot = self.folder / e.name
            try:
                folder = tree.open_dir(spot.parent)
            except OSError:
                continue
            try:
                hashed = _hash_at(folder, spot.name, spot.path, durable=True)
                if hashed is not None and hashed[1] == e.digest:
                    os.fsync(folder)  # the rename too, before it is announced as held
                    self.machine.local[e.name] = e
                    self.idents[e.name] = hashed[2]
            except OSError:
                continue
            finally:
                os.close(folder)
        if intents:
            self.machine.restore(self.machine.local.values())

    def _remove_temps(self) -> None:
        try:
            top = tree.open_dir(self.folder)
        except OSError:
            return  # none yet, or not walkable: the scan says why
        try:
            for entry in tree.Walk(top, self.machine.rules.max_depth):
                if entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=entry.dir_fd)
        finally:
            os.close(top)

    # -- events in --------------------------------------------------------------------------

    def deliver(self, event: Event) -> None:
        if not self.loaded:
            self._pending.append(event)
            return
        self._perform(self.machine.handle(event, time.monotonic()))

    def hint(self, path: str | None = None) -> None:
        """Something under resources/ changed: scan soon (one scan at a time). A hint about a
        file whose stat is the one recorded (most often one syncd just installed) is none.
        (That stat is taken by name: it only decides whether to look, never what is read.)"""
        if not self.loaded:
            self._hinted = True  # after the load's scan, which may have started before it
            return
        if path is not None:
            try:
                name = str(Path(path).relative_to(self.folder.path))
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
            found = await asyncio.to_thread(self._scan_files, set(self.machine.local),
                                            dict(self.idents))
        # The stats and the digests reach the machine together (see self.idents).
        self.idents.update(found.idents)
        for name in found.gone:
            self.idents.pop(name, None)
        self.problems = found.problems
        self.more_problems = found.more_problems
        for p in found.problems:
            if p.kind != tree.VANISHED:  # removed while walked: shown, nothing to refuse
                self.host.note_unsafe(self._shown(p.rel), p.kind, p.reason)
        for text in found.errors:
            log.warning("resources of %s: %s", printable(self.key), text)
        for event in found.events:
            if self.loaded:
                self.deliver(event)
            else:
                self._perform(self.machine.handle(event, time.monotonic()))

    def _shown(self, rel: str) -> str:
        return printable(str(self.folder.path / rel))

    def _scan_files(self, known: set[str], idents: dict[str, Ident]) -> ScanResult:
        out = ScanResult()
        try:
            top = tree.open_dir(self.folder)
        except FileNotFoundError:
            out.gone = sorted(idents)
            out.events = [LocalGone(n) for n in sorted(known)]
            return out
        except OSError as e:
            kind = e.kind if isinstance(e, NotRegularFile) else tree.UNREADABLE
            out.problems.append(Problem(".", kind, e.strerror or str(e)))
            if kind != tree.UNREADABLE:  # a link's target is not ours: nothing is here
                out.gone = sorted(idents)
                out.events = [LocalGone(n) for n in sorted(known)]
            return out
        try:
            found = self._walk_and_hash(top, known, idents, out)
        finally:
            os.close(top)
        # What could not be read (a directory, or an entry's stat) is not known to be gone.
        hidden = {p.rel for p in out.problems if p.kind == tree.UNREADABLE}

        def seen(name: str) -> bool:
            return (name in found or name in hidden
                    or any(name.startswith(h + "/") for h in hidden))

        out.gone = sorted(n for n in idents if not seen(n))
        out.events += [LocalGone(n) for n in sorted(known) if not seen(n)]
        return out

    def _walk_and_hash(self, top: int, known: set[str], idents: dict[str, Ident],
                       out: ScanResult) -> set[str]:
        """Walk resources/, hash what changed; each directory that holds a file hashed anew
        is fsynced as the walk leaves it, and its files are reported only then."""
        rules = self.machine.rules
        found: set[str] = set()
        hashed: dict[str, list[LocalFile]] = {}  # directory (rel, with '/') -> its new files

        def leaving(fd: int, rel: str) -> None:
            files = hashed.pop(rel, [])
            if not files:
                return
            try:
                os.fsync(fd)  # the renames that published them: durable before announced
            except OSError as e:
                out.errors.append(f"cannot make {self._shown(rel)} durable ({e.strerror}); "
                                  "its new files are announced at a later scan")
                for f in files:
                    del out.idents[f.name]
                return
            out.events.extend(files)

        walk = tree.Walk(top, rules.max_depth, leaving=leaving)
        for entry in walk:
            name = entry.rel
            if rules.kind(name) is None:
                continue
            found.add(name)
            st = entry.stat
            if idents.get(name) == _ident(st) and name in known:
                continue
            if st.st_size > rules.max_file_bytes:
                out.events.append(LocalFile(name, st.st_size, b""))
                continue
            try:
                done = _hash_at(entry.dir_fd, entry.name, self.folder.path / name, durable=True)
            except NotRegularFile as e:  # swapped for something else since its stat
                out.problems.append(Problem(name, e.kind, e.strerror or str(e)))
                continue
            except OSError as e:  # unknown this time: kept as it was, neither new nor gone
                out.errors.append(f"cannot read {self._shown(name)}: {e.strerror or e}")
                continue
            if done is None:
                continue
            size, digest, ident = done
            out.idents[name] = ident
            folder = name[:len(name) - len(entry.name)]
            hashed.setdefault(folder, []).append(LocalFile(name, size, digest, ident[2]))
        out.problems = walk.problems + out.problems
        out.more_problems = walk.more_problems
        return found

    # -- effects out ------------------------------------------------------------------------

    def _perform(self, effects: list[Effect]) -> None:
        for e in effects:
            match e:
                case Send(kind, payload, to):
                    self.host.send(kind, self.key, frames.RESOURCES, payload, to)
                case Serve():
                    self._spawn(self._serve(e, self.idents.get(e.name)))
                case Write():
                    self._write(e)
                case Install():
                    self._intents[e.entry.name] = e.entry
                    self._spawn(self._install(e))
                case Discard(name):
                    self._discard(name)
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

    def _unsafe(self, err: NotRegularFile) -> None:
        self.host.note_unsafe(printable(err.where), err.kind, err.strerror or str(err))

    def _in_folder(self, name: str, create: bool = False) -> tuple[int, str]:
        """(descriptor of the directory `name` is in, its last component). `create`: make
        the directories below resources/ (the instance directory must exist)."""
        spot = self.folder / name
        try:
            return tree.open_dir(spot.parent), spot.name  # most often there (one openat2)
        except FileNotFoundError:
            if not create:
                raise
        return tree.open_dir(spot.parent, create_from=len(self.folder.parts) - 1), spot.name

    def _discard(self, name: str) -> None:
        with contextlib.suppress(OSError):
            folder, base = self._in_folder(name)
            try:
                os.unlink(temp_name(base), dir_fd=folder)
            finally:
                os.close(folder)

    def _write(self, e: Write) -> None:
        try:
            folder, base = self._in_folder(e.name, create=True)
            try:
                tmp = temp_name(base)
                if e.fresh:
                    # A new file of ours, never an existing inode (one a bot linked there).
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=folder)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
                else:
                    flags = os.O_WRONLY
                fd = tree.open_in(folder, tmp, flags, 0o644,
                                  where=self.folder.path / e.name)
            finally:
                os.close(folder)
            try:
                if os.fstat(fd).st_nlink != 1:
                    raise OSError(errno.EMLINK, "the temp file has another name too; not "
                                  "written")
                if e.data:
                    os.pwrite(fd, e.data, e.offset)
            finally:
                os.close(fd)
        except OSError as err:
            if isinstance(err, NotRegularFile):
                self._unsafe(err)
            log.warning("resource %s: cannot write %s: %s", printable(self.key),
                        printable(e.name), err.strerror or err)
            self.deliver(InstallFailed(e.name, str(err)))

    async def _install(self, e: Install) -> None:
        name = e.entry.name
        try:
            # Checked and made durable outside the lock: installs of many small files overlap.
            self._checked[name] = await asyncio.to_thread(self._check_temp, e)
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
            checked = {e.entry.name: self._checked.pop(e.entry.name) for e in group}
            async with self._lock:
                done = await asyncio.to_thread(self._put_group, group, checked, intents,
                                               dict(self.idents))
            for e, outcome in zip(group, done, strict=True):
                if isinstance(outcome, Exception):
                    self._install_failed(e.entry.name, outcome)
                    continue
                self.idents[e.entry.name] = outcome
                self.installed += 1
                self._intents.pop(e.entry.name, None)
                self.deliver(Installed(e.entry))

    def _put_group(self, group: list[Install], checked: dict[str, Same], intents: bytes,
                   idents: dict[str, Ident]) -> list[Ident | Exception]:
        # The intents are durable before any rename (see _recover): the group's directory
        # fsync below makes the renames durable, and a power loss must not keep a rename
        # whose intent it took back.
        _write_atomic(self.intents_file, intents, durable=True)
        out: list[Ident | Exception] = []
        folders: dict[str, list[int]] = {}  # directory below resources/ -> its installs
        for i, e in enumerate(group):
            try:
                out.append(self._put(e, checked[e.entry.name], idents.get(e.entry.name)))
                folders.setdefault(e.entry.name.rpartition("/")[0], []).append(i)
            except (OSError, ValueError) as err:
                out.append(err)
        for rel, members in sorted(folders.items()):
            try:
                tree.sync_dir(self.folder / rel if rel else self.folder)
            except OSError as err:  # not durable: announce none of that directory's files
                for i in members:
                    out[i] = err
        return out

    def _install_failed(self, name: str, err: Exception) -> None:
        self._discard(name)
        self._checked.pop(name, None)
        if isinstance(err, NotRegularFile):
            self._unsafe(err)
        log.info("resource %s of %s not installed: %s", printable(name), printable(self.key),
                 err)
        self._intents.pop(name, None)
        self.deliver(InstallFailed(name, str(err)))
        self.hint()

    def _check_temp(self, e: Install) -> Same:
        """The temp file holds the announced bytes: checked and fsynced through one
        descriptor; what it was (inode, size, mtime) is what must be put in place."""
        folder, base = self._in_folder(e.entry.name)
        try:
            fd = tree.open_in(folder, temp_name(base), where=self.folder.path / e.entry.name)
        finally:
            os.close(folder)
        try:
            h = hashlib.sha256()
            size = 0
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
                size += len(chunk)
            if size != e.entry.size or h.digest() != e.entry.digest:
                raise ValueError("the bytes received do not have the announced SHA-256 (the "
                                 "file changed at the sender meanwhile); fetching again")
            os.fsync(fd)
            return _same(os.fstat(fd))
        finally:
            os.close(fd)

    def _put(self, e: Install, checked: Same, known: Ident | None) -> Ident:
        folder, base = self._in_folder(e.entry.name)
        try:
            tmp = temp_name(base)
            if _same(os.stat(tmp, dir_fd=folder, follow_symlinks=False)) != checked:
                raise ValueError("the temp file was replaced after it was checked; left as "
                                 "it is")
            if e.expect is None:
                # Write-once: link() fails if the name exists, so nothing is ever overwritten.
                try:
                    os.link(tmp, base, src_dir_fd=folder, dst_dir_fd=folder,
                            follow_symlinks=False)
                except FileExistsError:
                    raise ValueError("a file took this name here meanwhile; left as it "
                                     "is") from None
                os.unlink(tmp, dir_fd=folder)
            else:
                try:
                    now = _ident(os.stat(base, dir_fd=folder, follow_symlinks=False))
                except FileNotFoundError:
                    now = None
                if now is not None and now != known:
                    raise ValueError("the sidecar changed here meanwhile (its local writer "
                                     "came first); left as it is")
                os.replace(tmp, base, src_dir_fd=folder, dst_dir_fd=folder)
            st = os.stat(base, dir_fd=folder, follow_symlinks=False)
            if _same(st) != checked:
                # Swapped between the check and the rename: what is there is not what was
                # fetched. The scan judges it like any local write.
                raise ValueError("the temp file was replaced while it was installed")
            return _ident(st)  # durable once the group's directories are synced
        finally:
            os.close(folder)

    def _compare(self, e: Compare) -> None:
        try:
            ours = logfile.read_range(self.folder / e.name, e.offset, e.offset + len(e.data))
        except OSError as err:
            if isinstance(err, NotRegularFile):
                self._unsafe(err)
            ours = b""
        differ = None
        if ours != e.data:
            n = min(len(ours), len(e.data))
            differ = e.offset + next((i for i in range(n) if ours[i] != e.data[i]), n)
        event = Compared(e.name, e.theirs, e.offset + len(e.data), differ)
        asyncio.get_running_loop().call_soon(self.deliver, event)

    async def _serve(self, e: Serve, hashed_at: Ident | None) -> None:
        """Send the bytes the machine announced, and only those: the file must still have
        the stat it was hashed at (`hashed_at`, taken when the machine decided), checked on
        the descriptor before and after each read."""
        chunk = self.machine.chunk_bytes
        at, end = e.offset, e.offset + e.length
        await self.host.answer_room(e.peer)  # nothing read while its answers are in flight
        try:
            fd = await asyncio.to_thread(self._open_served, e.name, hashed_at)
        except OSError as err:
            if isinstance(err, NotRegularFile):
                self._unsafe(err)
            self._serve_failed(e, f"cannot be read here: {err.strerror or err}")
            return
        if fd is None:
            self._serve_failed(e, "changed here since it was announced; looking again")
            return
        try:
            while at < end:
                if at > e.offset:
                    await self.host.answer_room(e.peer)
                data = await asyncio.to_thread(_read_unchanged, fd, at, min(end, at + chunk),
                                               hashed_at)
                if data is None:
                    self._serve_failed(e, "changed here while it was sent; looking again")
                    return
                if not data:
                    return
                self.host.send(Kind.RDATA, self.key, frames.RESOURCES,
                               frames.ResChunk(e.name, e.digest, e.size, at, data), e.peer)
                self.served_bytes += len(data)
                at += len(data)
        finally:
            os.close(fd)

    def _open_served(self, name: str, hashed_at: Ident | None) -> int | None:
        fd = tree.open_file(self.folder / name)
        if hashed_at is None or _ident(os.fstat(fd)) != hashed_at:
            os.close(fd)
            return None
        return fd

    def _serve_failed(self, e: Serve, reason: str) -> None:
        self.serves_refused += 1
        log.info("resource %s of %s not served to %s: %s", printable(e.name),
                 printable(self.key), e.peer, reason)
        self.deliver(ServeFailed(e.peer, e.name, e.digest, reason))
        self.hint()

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
                   served_bytes=self.served_bytes, serves_refused=self.serves_refused,
                   skipped_paths=[p.to_json() for p in self.problems[:PROBLEMS_SHOWN]],
                   skipped_paths_count=len(self.problems) + self.more_problems)
        return out


def _read_unchanged(fd: int, start: int, end: int, hashed_at: Ident | None) -> bytes | None:
    """Bytes [start, end) through `fd`, or None if the file's stat is not `hashed_at` after
    the read (written to meanwhile: the bytes may not be the announced ones)."""
    data = os.pread(fd, end - start, start)
    if _ident(os.fstat(fd)) != hashed_at:
        return None
    return data


def _entries_json(entries: Iterable[ResEntry]) -> bytes:
    return orjson.dumps([[e.name, e.size, e.digest.hex(), e.stamp, e.origin] for e in entries])


def _write_atomic(path: Path, blob: bytes, durable: bool = False) -> None:
    # The manifest is not fsynced: a record lost to a power cut costs a rehash (and a
    # sidecar version number taken from its mtime), never a wrong file. Intents are.
    durable_mod.replace_file(path, blob, 0o666, durable=durable)

