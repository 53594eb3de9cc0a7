"""What survives a restart, per replicated file, under `state_dir/files/<encoded key>/`.

    <file>.json    size, identity (dev, inode, mtime, ctime) and partial-block digest of the
                   copy when it was last recorded, and the freeze, if any (atomic rename)
    <file>.chain   the ledger's chain values, 32 bytes each; only ever appended to, except
                   when the ledger is rebuilt after a detected edit

    <file>.verify  the incremental log check's state (daemon/logfollow.py)

The key is percent-encoded into a directory name (core/statepath.py): a nested key such as
`onebot_123/group_456` is one directory, `onebot_123%2Fgroup_456`, and a key of the old flat
form (`bot-1`) is its own encoding, so records written before nesting existed still load.

A restart trusts the chain only if the file's identity is unchanged (git's index does the same;
ctime cannot be set from user space), and otherwise rehashes the file before replicating it.

Routine position records (not fsync'ed) are written by one worker thread (`save_later`): on the
event loop, a thousand busy files' temp-file-and-rename every few seconds each waited on the
filesystem's journal while frames queued (31 % of a standby's samples at 1000 busy keys).
Durable saves (freezes, intents) are made durable for real: chain fdatasync'ed, record
fsynced, renamed, and the folder fsynced (disk/durable.py); the daemon runs them on a thread
and waits for them before its next effect. Every save of a file carries an order number, so
an older record queued for the worker never lands after a newer one. At a stop, the records
that the disk does not hold durably yet are saved together (`save_all`): the same steps in the
same order, each for every file at once, with the fsyncs from a pool of threads.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from syncd.core import statepath
from syncd.core.ledger import DIGEST_SIZE
from syncd.core.records import Appending, FileRecord, Freeze
from syncd.disk import durable as durable_mod

log = logging.getLogger("syncd.persist")

VERSION = 1


FILE_PATHS = 10_000  # files whose record paths are kept made at most (cleared past that)
NOTE_SIZE = 512  # bytes of an `.appending` note (longer only for very long node names)


@dataclass(frozen=True, slots=True)
class Save:
    """One file's durable save in a batch (`save_all`). `chain` None: the chain file is kept
    as it is; `rebuilt`: it is written whole."""
    key: str
    file: str
    record: FileRecord
    chain: list[bytes] | None
    rebuilt: bool = False


@dataclass
class _Unsynced:
    """A file of a `save_all` batch between its steps."""
    key: str
    file: str
    chain_tmp: Path | None  # the chain, written whole; None: appended in place, or kept
    meta_tmp: Path
    chain_count: int | None  # chain values on disk once done; None: the chain file kept
    to_sync: list[Path]


@dataclass
class _Job:
    order: int
    record: FileRecord
    chain: list[bytes]
    count: int  # entries of `chain` that belong to `record` (the list may grow meanwhile)


class RecordFiles:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "files"
        self._chain_written: dict[tuple[str, str], int] = {}
        self._io = threading.Lock()  # saves, loads and chain resets, one at a time
        self._queue = threading.Lock()  # the pending jobs
        self._pending: dict[tuple[str, str], _Job] = {}
        self._order = itertools.count()
        self._done: dict[tuple[str, str], int] = {}  # order of the newest save of each file
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self._folders: dict[str, Path] = {}  # key -> folder(key)
        # (<file>.json, <file>.chain, <file>.appending) per key and file: joined at every
        # save and every note otherwise (3-5 % of a host's CPU at 1000 busy keys).
        self._file_paths: dict[tuple[str, str], tuple[Path, Path, Path]] = {}
        # Keys' folders make_dirs made or found in this process (under _io): a routine save
        # asked for its folder twice, a stat and a mkdir's EEXIST each time, for nothing but
        # a key's first save (half a standby's record-saving samples at 3000 busy keys).
        self._made: set[Path] = set()

    def folder(self, key: str) -> Path:
        """The directory of `key`'s records (every file of state that names a key is in it)."""
        found = self._folders.get(key)
        if found is None:
            # Asked several times per file at every start (the encoding and the joins were
            # 4 % of a 1000-key start-up); a key that is gone costs one entry until restart.
            found = self._folders[key] = statepath.key_dir(self.root, key)
        return found

    def _file_paths_of(self, key: str, file: str) -> tuple[Path, Path, Path]:
        """(<file>.json, <file>.chain, <file>.appending) of `key`'s folder."""
        paths = self._file_paths.get((key, file))
        if paths is None:
            if len(self._file_paths) >= FILE_PATHS:
                self._file_paths.clear()
            d = self.folder(key)
            paths = self._file_paths[(key, file)] = (
                d / f"{file}.json", d / f"{file}.chain", d / f"{file}.appending")
        return paths

    def _paths(self, key: str, file: str) -> tuple[Path, Path]:
        meta, chain, _ = self._file_paths_of(key, file)
        return meta, chain

    def load(self, key: str, file: str) -> tuple[FileRecord, list[bytes]] | None:
        with self._io:
            return self._load(key, file)

    def _load(self, key: str, file: str) -> tuple[FileRecord, list[bytes]] | None:
        meta_path, chain_path = self._paths(key, file)
        try:
            meta = orjson.loads(meta_path.read_bytes())
            raw = chain_path.read_bytes()
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as e:
            raise ValueError(f"unreadable state for {key}/{file}: {e}") from None
        if meta.get("version") != VERSION:
            return None
        chain = [raw[i : i + DIGEST_SIZE] for i in range(0, len(raw) - DIGEST_SIZE + 1,
                                                          DIGEST_SIZE)]

        def freeze(d: dict[str, Any] | None) -> Freeze | None:
            return Freeze(**d) if d else None

        record = FileRecord(
            size=meta["size"], digest=bytes.fromhex(meta["digest"]),
            file_size=meta["file_size"], dev=meta["dev"], ino=meta["ino"],
            mtime_ns=meta["mtime_ns"], ctime_ns=meta["ctime_ns"],
            partial=bytes.fromhex(meta["partial"]),
            freeze=freeze(meta.get("freeze")),
            diverged_peers={k: Freeze(**v) for k, v in meta.get("diverged_peers", {}).items()},
            note=meta.get("note"),
            intent=_intent(meta.get("intent")),
            appending=self.load_appending(key, file),
        )
        self._chain_written[(key, file)] = len(chain)
        return record, chain

    def save(self, key: str, file: str, record: FileRecord, chain: list[bytes],
             durable: bool = True) -> None:
        """Persist now: chain first (appending what is new), then the record.

        Routine position updates may skip fsync (durable=False): losing one to a power cut
        only costs a rehash of that file at the next start. Freezes are always durable.
        """
        order = self._supersede(key, file)
        with self._io:
            self._save(key, file, record, chain, len(chain), durable, order)

    def save_later(self, key: str, file: str, record: FileRecord, chain: list[bytes]) -> None:
        """A routine record (not fsync'ed), written soon by the worker thread; a newer one of
        the same file queued before it is written replaces it."""
        job = _Job(next(self._order), record, chain, len(chain))
        with self._queue:
            self._pending[(key, file)] = job
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="records", daemon=True)
            self._worker.start()
        self._wake.set()

    def flush(self) -> None:
        """Write every queued record now, in the caller's thread (shutdown)."""
        self._drain()

    def _work(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._queue:
                if not self._pending:
                    return
                (key, file), job = self._pending.popitem()
            try:
                with self._io:
                    self._save(key, file, job.record, job.chain, job.count, False, job.order)
            except OSError as e:
                log.error("%s/%s: cannot record the position in %s: %s", key, file, self.root,
                          e.strerror or e)

    def _supersede(self, key: str, file: str) -> int:
        """An order number newer than every save of this file queued so far, which drops."""
        order = next(self._order)
        with self._queue:
            self._pending.pop((key, file), None)
        return order

    def _save(self, key: str, file: str, record: FileRecord, chain: list[bytes], count: int,
              durable: bool, order: int) -> None:
        if order < self._done.get((key, file), -1):
            return  # a newer record of this file is written already
        self._done[(key, file)] = order
        meta_path, chain_path = self._paths(key, file)
        folder = meta_path.parent
        known = folder in self._made
        if not known:
            durable_mod.make_dirs(folder)  # a new key's folder: durable in files/
            self._made.add(folder)
        try:
            self._write(key, file, record, chain, count, durable, meta_path, chain_path,
                        known)
        except FileNotFoundError:
            if not known:
                raise
            # The folder went from under us (by hand): made again, as for a new key. The
            # steps start over: each finds what the failed one left (_chain_on_disk).
            self._made.discard(folder)
            self._save(key, file, record, chain, count, durable, order)

    def _write(self, key: str, file: str, record: FileRecord, chain: list[bytes], count: int,
               durable: bool, meta_path: Path, chain_path: Path, known: bool) -> None:
        """_save's writes, the folder there; `known`: made before this save (no mkdir)."""
        written = self._chain_on_disk(key, file, count, chain_path)
        mode = "ab" if written else "wb"
        if mode == "wb":
            _atomic_write(chain_path, b"".join(chain[:count]), durable, known)
        elif written < count:
            with chain_path.open("ab") as f:
                f.write(b"".join(chain[written:count]))
                f.flush()
                if durable:
                    os.fdatasync(f.fileno())
        self._chain_written[(key, file)] = count
        _atomic_write(meta_path, _meta_bytes(record), durable, known)

    def _chain_on_disk(self, key: str, file: str, count: int, chain_path: Path) -> int:
        """Chain values already in the chain file that a save of `count` values may append
        to; 0: the file is written whole (gone, or it holds more than this save's history)."""
        written = self._chain_written.get((key, file), 0)
        return 0 if written > count or not chain_path.exists() else written

    def save_all(self, saves: list[Save]) -> None:
        """Durable saves of many files at once (the daemon's stop): as `save` does for each,
        but each step for all files together, so that the fsyncs can run at once
        (durable.sync_files): every file's bytes written, then synced; the chains' temp files
        renamed and their folders synced; then the records' likewise. So a record never
        names chain values that are not durable, as with `save`. A file that fails is
        logged and left as it was on disk; the others go on."""
        failed: dict[Path, OSError] = {}
        with self._io:
            batch = [b for save in saves if (b := self._write_unsynced(save, failed))]
            failed |= durable_mod.sync_files(p for b in batch for p in b.to_sync)
            for step in ("chain", "meta"):
                batch = [b for b in batch if not any(p in failed for p in b.to_sync)]
                folders = []
                for b in batch:
                    renamed = b.chain_tmp if step == "chain" else b.meta_tmp
                    if renamed is None:
                        continue
                    final = renamed.with_name(renamed.name.removesuffix(".tmp"))
                    try:
                        os.replace(renamed, final)
                    except OSError as renaming:
                        failed[b.meta_tmp] = renaming
                        continue
                    folders.append(final.parent)
                for folder, why in durable_mod.sync_files(folders, directories=True).items():
                    failed |= {b.meta_tmp: why for b in batch if b.meta_tmp.parent == folder}
            for b in batch:
                if b.meta_tmp not in failed and b.chain_count is not None:
                    self._chain_written[(b.key, b.file)] = b.chain_count
        for path, why in failed.items():
            shown = path.with_name(path.name.removesuffix(".tmp"))
            log.error("cannot record the position in %s: %s", shown, why.strerror or why)

    def _write_unsynced(self, save: Save, failed: dict[Path, OSError]) -> _Unsynced | None:
        """`save_all`'s first step for one file: its chain's new values and its record's
        temp file written, nothing synced or renamed. None: nothing to do, or it failed."""
        key, file = save.key, save.file
        order = self._supersede(key, file)
        if order < self._done.get((key, file), -1):
            return None
        self._done[(key, file)] = order
        meta_path, chain_path = self._paths(key, file)
        chain_tmp, count, to_sync = None, None, []
        try:
            durable_mod.make_dirs(meta_path.parent)
            if save.rebuilt:
                self._chain_written.pop((key, file), None)
            if save.chain is not None:
                count = len(save.chain)
                done = self._chain_on_disk(key, file, count, chain_path)
                if not done:
                    chain_tmp = durable_mod.write_temp(chain_path, b"".join(save.chain))
                    to_sync.append(chain_tmp)
                elif done < count:
                    with chain_path.open("ab") as f:
                        f.write(b"".join(save.chain[done:count]))
                    to_sync.append(chain_path)
            meta_tmp = durable_mod.write_temp(meta_path, _meta_bytes(save.record))
        except OSError as e:
            failed[meta_path] = e
            return None
        return _Unsynced(key, file, chain_tmp, meta_tmp, count, [*to_sync, meta_tmp])

    def note_appending(self, key: str, file: str, appending: Appending | None,
                       durable: bool = False) -> None:
        """Write `appending` in place: a pwrite, synced only if `durable`. Before an append it
        must outlive a kill of this process; it is not synced then (a sync per frame doubled
        the lag: a power loss may drop it, and the piece's bytes it kept are then refused as
        a divergence). At a start after a crash, when such bytes may sit past our end and
        will be synced, the machine asks for it durable: the file and its folder synced.
        Padded to a fixed length, so that a shorter note never leaves a longer one's end
        behind."""
        path = self._file_paths_of(key, file)[2]
        data = orjson.dumps(list(appending) if appending else None).ljust(NOTE_SIZE)
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:  # the key's first note, maybe before its first record
            if appending is None:
                return  # nothing to clear
            durable_mod.make_dirs(path.parent)  # a new key's folder: rare, made durable
            fd = os.open(path, flags | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, 0)
            if durable:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        if durable:  # the note file's entry too (it was created without a sync)
            durable_mod.sync_dir(path.parent)

    def load_appending(self, key: str, file: str) -> Appending | None:
        try:
            raw = self._file_paths_of(key, file)[2].read_bytes()
            return _appending(orjson.loads(raw))
        except (OSError, orjson.JSONDecodeError):
            return None  # none, or unreadable: bytes past our end are then judged without it

    def forget_chain(self, key: str, file: str) -> None:
        """The ledger was rebuilt: the next save rewrites the chain file whole (atomically),
        and no record queued before it (of the old history) is written."""
        order = self._supersede(key, file)
        with self._io:
            self._chain_written.pop((key, file), None)
            self._done[(key, file)] = order


def _appending(value: Any) -> Appending | None:
    """A note as written; None for anything else (a note of an older syncd, without the
    piece's offset and digest: bytes past our end are then judged without it)."""
    if (isinstance(value, list) and len(value) == 5 and isinstance(value[0], str)
            and all(type(v) is int for v in value[1:4]) and isinstance(value[4], str)):
        return (value[0], value[1], value[2], value[3], value[4])
    return None


def _meta_bytes(record: FileRecord) -> bytes:
    return orjson.dumps({
        "version": VERSION, "size": record.size, "digest": record.digest.hex(),
        "file_size": record.file_size, "dev": record.dev, "ino": record.ino,
        "mtime_ns": record.mtime_ns, "ctime_ns": record.ctime_ns,
        "partial": record.partial.hex(),
        "freeze": record.freeze.to_json() if record.freeze else None,
        "diverged_peers": {k: v.to_json() for k, v in record.diverged_peers.items()},
        "note": record.note,
        "intent": list(record.intent) if record.intent else None,
    }, option=orjson.OPT_INDENT_2)


def _intent(value: Any) -> tuple[str, int, int, str] | None:
    if (isinstance(value, list) and len(value) == 4 and isinstance(value[0], str)
            and all(isinstance(v, int) for v in value[1:3]) and isinstance(value[3], str)):
        return (value[0], value[1], value[2], value[3])
    return None


def _atomic_write(path: Path, data: bytes, durable: bool = True, made: bool = False) -> None:
    """Durable: the temp file fsynced, renamed, and the directory fsynced (disk/durable.py).
    `made`: the folder is there (RecordFiles._made): a routine record is a temp file and a
    rename, no mkdir first."""
    if made and not durable:
        os.replace(durable_mod.write_temp(path, data, 0o666), path)
        return
    durable_mod.replace_file(path, data, 0o666, durable=durable)
