"""An instance's resources/ files as a pure machine: manifests and chunks in, effects out.

The log's rule ("the longer tail wins") does not fit these files: they are not appended to.
Their write patterns (docs/event-logs.md) give two other rules, stated here once, for local
and remote copies alike:

- WRITE-ONCE (blobs: an artifact, an asset's bytes): a name is written once, by a temp file and
  a rename. A host that lacks the name fetches it whole. Two hosts holding different bytes
  under one name are a CONFLICT: neither copy is replaced, both hosts show it (with the offset
  of the first differing byte, found by comparing the peer's bytes with ours chunk by chunk),
  exactly like a divergence of the log. It ends when the copies agree again (an operator moved
  the wrong one away; the other is then fetched).
- REPLACED (sidecars `<name>.json`, `<name>.view`): rewritten whole by its instance's writer.
  Each version carries (stamp, origin): a Lamport count (one more than any version of that
  name this host knew of, and at least the write's mtime in ms) and the host whose local
  write made it. The highest version wins,
  so a writer's newest replacement reaches every host, also after a failover; a version whose
  origin is not among the key's `writers` (when set) never counts.
- Anything else (temp files, names outside include) does not travel; see Rules.

Theory of operation: each host keeps a manifest (name -> ResEntry: size, SHA-256, version) of
the complete files it holds, and what it heard of each peer's. A summary (digest of the whole
manifest) goes to everyone on change, on (re)connect, when a peer comes online and every
SUM_INTERVAL; a peer whose summary is not one we were answered for is asked for its whole
manifest. Entries that changed go to everyone at once. Per name the machine then decides: fetch
(a window of chunks at a time, resumed from the last byte received after a timeout, from any
online peer holding the same digest), adopt a higher version number for identical bytes,
compare (a conflict), or nothing. The shell writes fetched bytes to a temp file and installs
it whole: a write-once name without overwriting anything, a replaced one only over the version
this machine last saw. Deletions are not propagated: a file deleted here is fetched back from a
peer that still holds it (nothing is lost by syncd; the writer never deletes today).

No files, sockets or clocks here: the shell (daemon/resourcefiles.py) and the simulator feed events
with the time and carry out the effects.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from syncd.core import frames
from syncd.core.budget import Holdings
from syncd.core.frames import Kind, ResEntry
from syncd.core.refs import required

DEFAULT_INCLUDE = ("artifacts/**", "assets/**")
DEFAULT_EXCLUDE: tuple[str, ...] = ()
DEFAULT_REPLACED = ("*.json", "*.view")
# Always excluded, whatever the config says: the writer's temp files (`.<name>.<uuid>.tmp`,
# `<name>.json.<uuid>.tmp`) and syncd's own (`.<name>.syncd.tmp`) are never complete files.
TEMP_PATTERNS = ("*.tmp",)
MAX_FILE_BYTES = 32 << 20
# Directories below resources/ that a scan goes into ([resources] max_depth): Ishiki's deepest
# is 2 (artifacts/shake/); a bot-made tree deeper than this is shown, not walked.
MAX_DEPTH = 32
# Files fetched at once per instance: one of any size, more (up to MAX_TRANSFERS) only while
# what they all still need fits in one fetch window. Many small files go in parallel; big ones
# keep at most a window in flight, as the log's fetch does: a broker drops what overflows a
# client's queue (Mosquitto's max_queued_messages), positions included.
BIG_TRANSFERS = 1
MAX_TRANSFERS = 64
SUM_INTERVAL = 30.0  # seconds between two summaries of an unchanged manifest (a safety net)
# A peer coming online makes each instance look again at the names that peer holds and send
# our summary, from the next Tick, and at most once per PRESENCE_PASS per peer: a peer that
# flips its presence hundreds of times (a new connection counter each time, well signed)
# costs one pass per interval, not one pass over every name of every instance per flip.
PRESENCE_PASS = 10.0
ENTRIES_PER_ITEM = 2000
# A transfer whose holder sends nothing is asked again after timeout x 2**misses, at most
# BACKOFF x timeout: a listed host that announces files and never answers (64 transfers per
# instance, hundreds of instances) is asked a few times a minute per file, not every 3 s.
BACKOFF = 16
# What one manifest entry heard from a peer costs here, in bytes (measured: ~220 besides its
# name, as a ResEntry in a dict; names count twice, for non-ASCII text): charged to the
# peer's Holdings while kept.
ENTRY_COST = 240
ENTRY_WIRE = 110  # bytes of an entry in a manifest sent, besides its name and origin
REFUSED_SHOWN = 100  # files refused (too big) that are logged and shown, per instance
MAX_OFFSETS = 4096  # first differences remembered, per instance (the oldest go first)


def entry_cost(e: ResEntry) -> int:
    return ENTRY_COST + 2 * (len(e.name) + len(e.origin))


@dataclass
class PeerBounds:
    """What peers' manifests may hold here (docs/peer-limits.md): `max_files` entries per
    peer's manifest of this instance, within each peer's Holdings; `refuse(peer, reason, n)`
    counts what was refused."""

    holdings: Holdings = field(default_factory=lambda: Holdings(1 << 62))
    max_files: int = 1 << 62
    refuse: Callable[[str, str, int], None] = lambda peer, reason, n: None

    @property
    def max_parts(self) -> int:
        """Parts a whole manifest of at most `max_files` entries is sent in."""
        return max(1, -(-self.max_files // ENTRIES_PER_ITEM))


class FileKind(Enum):
    ONCE = "once"
    REPLACED = "replaced"


def _match(name: str, pattern: str) -> bool:
    # A pattern with a '/' is matched against the whole path (its `*` crosses '/', so
    # `artifacts/**` is everything below artifacts/); one without, against the last component.
    target = name if "/" in pattern else name.rsplit("/", 1)[-1]
    return fnmatch.fnmatchcase(target, pattern)


@dataclass(frozen=True)
class Rules:
    """Which files under resources/ replicate, and by which rule (config [resources])."""

    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    replaced: tuple[str, ...] = DEFAULT_REPLACED
    max_file_bytes: int = MAX_FILE_BYTES
    max_depth: int = MAX_DEPTH

    def kind(self, name: str) -> FileKind | None:
        """The rule for `name` (a path relative to resources/), None: it does not travel."""
        if len(name) > CACHED_NAME:
            return _rule(self, name)
        return _kind(self, name)


# Names up to this long are cached: peers announce names too, and the cache must not become
# a way to hold their memory (at most ~5 MB).
CACHED_NAME = 128


@functools.lru_cache(maxsize=1 << 14)  # asked for every name at every sweep
def _kind(rules: Rules, name: str) -> FileKind | None:
    return _rule(rules, name)


def _rule(rules: Rules, name: str) -> FileKind | None:
    if frames.resource_name_problem(name) is not None:
        return None
    if name.count("/") > rules.max_depth:
        # Deeper than our own scans go: no peer's name makes us create such a tree either.
        return None
    if any(_match(name, p) for p in TEMP_PATTERNS + rules.exclude):
        return None
    if not any(_match(name, p) for p in rules.include):
        return None
    return FileKind.REPLACED if any(_match(name, p) for p in rules.replaced) else FileKind.ONCE


def version(e: ResEntry) -> tuple[int, str]:
    return (e.stamp, e.origin)


def _entry_hash(e: ResEntry) -> int:
    line = f"{e.name}\0{e.size}\0{e.digest.hex()}\0{e.stamp}\0{e.origin}"
    return int.from_bytes(hashlib.sha256(line.encode("utf-8", "surrogateescape")).digest(),
                          "big")


def manifest_digest(entries: Iterable[ResEntry]) -> bytes:
    """The XOR of the entries' SHA-256: equal manifests, equal digests, and one entry's
    change costs one hash (a sorted hash of the whole manifest cost O(n) per file fetched).
    Peers are authenticated, so nobody crafts colliding manifests."""
    acc = 0
    for e in entries:
        acc ^= _entry_hash(e)
    return acc.to_bytes(32, "big")


# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalFile:
    """The shell found a complete file here (new, or its stat changed) with these bytes."""

    name: str
    size: int
    digest: bytes
    mtime_ns: int = 0  # when it was written (a floor for a sidecar's version number)


@dataclass(frozen=True, slots=True)
class LocalGone:
    name: str


@dataclass(frozen=True, slots=True)
class PeerItem:
    """A resource item from a peer (frames.ResSum, ResList, ResHave, ResAsk, ResChunk,
    ResRefuse)."""

    peer: str
    payload: frames.Payload


@dataclass(frozen=True, slots=True)
class PeerPresence:
    peer: str
    online: bool


@dataclass(frozen=True, slots=True)
class Connected:
    pass


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class Installed:
    """A fetched file is in place under its name (`entry`: what was fetched)."""

    entry: ResEntry


@dataclass(frozen=True, slots=True)
class InstallFailed:
    """Not installed: the temp file's digest was wrong, or a local file took the name first."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ServeFailed:
    """A Serve was not carried out: the file is not what was announced any more (it changed,
    or its path now goes through a link). The shell looks at it again; the asker is told."""

    peer: str
    name: str
    digest: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Compared:
    """Our bytes at the offset of a peer's chunk (Compare effect): the first difference, if any."""

    name: str
    theirs: bytes
    end: int  # end of the range compared
    differ_at: int | None


Event = (LocalFile | LocalGone | PeerItem | PeerPresence | Connected | Tick | Installed
         | InstallFailed | Compared | ServeFailed)


# --- effects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    kind: Kind
    payload: frames.Payload
    to: str = ""  # "" for everyone


@dataclass(frozen=True, slots=True)
class Serve:
    """Send `peer` chunks of our `name` (digest `digest`) covering [offset, offset + length)."""

    peer: str
    name: str
    digest: bytes
    size: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Write:
    """Write bytes at `offset` of the temp file for `name` (`fresh`: start it anew)."""

    name: str
    offset: int
    data: bytes
    fresh: bool


@dataclass(frozen=True, slots=True)
class Install:
    """Check the temp file's digest, make it durable and put it in place: without overwriting
    (`expect` None), or only over the file this machine knows as `expect`."""

    entry: ResEntry
    expect: ResEntry | None


@dataclass(frozen=True, slots=True)
class Discard:
    name: str


@dataclass(frozen=True, slots=True)
class Compare:
    """Compare a peer's chunk with our bytes at its offset; answer with Compared."""

    name: str
    theirs: bytes
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Conflict:
    """A write-once name differs from `peer`'s copy: log it (once per pair of digests)."""

    name: str
    peer: str
    offset: int
    ours: ResEntry
    theirs: ResEntry


@dataclass(frozen=True, slots=True)
class Refused:
    """A file that will not travel (too big): log it once."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Save:
    pass


Effect = Send | Serve | Write | Install | Discard | Compare | Conflict | Refused | Save


# --- state ---------------------------------------------------------------------------------


@dataclass
class PeerManifest:
    entries: dict[str, ResEntry] = field(default_factory=dict)
    online: bool = False
    heard: bytes | None = None  # its last summary
    asked: bytes | None = None  # the summary we last asked its manifest for
    asked_at: float = -1e18
    answered: bytes | None = None  # the summary a whole manifest came for
    # Parts of a whole manifest being received (part number -> entries): complete, it
    # replaces `entries`, so a file the peer no longer holds leaves our view of it.
    parts: dict[int, tuple[ResEntry, ...]] = field(default_factory=dict)
    parts_of: int = 0  # how many parts that manifest has
    awaiting: bool = False  # we asked for its whole manifest and it has not come whole yet
    revisit: bool = False  # it came online: its names are looked at again (PRESENCE_PASS)
    revisited_at: float = -1e18
    held: int = 0  # bytes of entries and parts taken from the peer's Holdings


@dataclass
class Transfer:
    entry: ResEntry
    peer: str
    got: int = 0  # bytes received (written, or compared)
    until: int = 0  # end of the window asked for
    deadline: float = 0.0
    compare: bool = False  # a conflict: compare with ours, write nothing
    installing: bool = False
    misses: int = 0  # timeouts in a row without a byte: the next ask waits longer (BACKOFF)


@dataclass(frozen=True)
class ConflictView:
    name: str
    peer: str
    ours: ResEntry
    theirs: ResEntry
    offset: int | None  # None until the comparison is done

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "peer": self.peer, "offset": self.offset,
                "ours": {"size": self.ours.size, "sha256": self.ours.digest.hex()},
                "theirs": {"size": self.theirs.size, "sha256": self.theirs.digest.hex()}}


class ResourceMachine:
    """One instance's resources on this host (see the module docstring)."""

    def __init__(self, node: str, rules: Rules, writers: frozenset[str] | None = None, *,
                 chunk_bytes: int = 256 << 10, window: int = 4 << 20,
                 timeout: float = 3.0, serve_max: int | None = None,
                 bounds: PeerBounds | None = None) -> None:
        self.node = node
        self.rules = rules
        self.writers = writers  # None: every listed host may write
        self.chunk_bytes = chunk_bytes
        self.window = window
        self.timeout = timeout
        # Bytes one request is answered with, at most (a peer asks for its window at once).
        self.serve_max = serve_max if serve_max is not None else window
        self.bounds = bounds or PeerBounds()
        self.refused_more = 0  # files refused past the REFUSED_SHOWN named in `refused`
        self.manifest_bytes = 0  # what our whole manifest costs to send (an RLIST's answer)
        self.local: dict[str, ResEntry] = {}
        self.peers: dict[str, PeerManifest] = {}
        self.transfers: dict[str, Transfer] = {}
        self.offsets: dict[tuple[str, bytes, bytes], int] = {}  # first differences found
        self.refused: dict[str, str] = {}
        self.retry_at: dict[str, float] = {}
        # Names a decision was put off for (transfers at their limit, no holder online, a
        # retry due): looked at again by Tick, so a sweep does not reconsider every name.
        self.waiting: set[str] = set()
        self._acc = 0  # the manifest's digest, kept up entry by entry (manifest_digest)
        self._sum_at = -1e18
        self._changed: list[ResEntry] = []

    # -- queries ----------------------------------------------------------------------------

    @property
    def digest(self) -> bytes:
        return self._acc.to_bytes(32, "big")

    def _set_local(self, e: ResEntry) -> None:
        old = self.local.get(e.name)
        if old is not None:
            self._acc ^= _entry_hash(old)
            self.manifest_bytes -= _wire(old)
        self.local[e.name] = e
        self._acc ^= _entry_hash(e)
        self.manifest_bytes += _wire(e)

    def _drop_local(self, name: str) -> bool:
        old = self.local.pop(name, None)
        if old is None:
            return False
        self._acc ^= _entry_hash(old)
        self.manifest_bytes -= _wire(old)
        return True

    # -- a peer's view, within its bounds ---------------------------------------------------

    def _put_entry(self, peer: str, view: PeerManifest, e: ResEntry) -> bool:
        """Keep `e` in our view of `peer`'s manifest, if its bounds allow."""
        old = view.entries.get(e.name)
        if old is None and len(view.entries) >= self.bounds.max_files:
            self.bounds.refuse(peer, "entries", 1)
            return False
        cost = entry_cost(e) - (entry_cost(old) if old is not None else 0)
        if cost > 0 and not self.bounds.holdings.take(peer, cost):
            self.bounds.refuse(peer, "peer_bytes", 1)
            return False
        if cost < 0:
            self.bounds.holdings.give(peer, -cost)
        view.entries[e.name] = e
        view.held += cost
        return True

    def _drop_entry(self, peer: str, view: PeerManifest, name: str) -> None:
        old = view.entries.pop(name, None)
        if old is not None:
            cost = entry_cost(old)
            self.bounds.holdings.give(peer, cost)
            view.held -= cost

    def _drop_parts(self, peer: str, view: PeerManifest) -> None:
        cost = sum(entry_cost(e) for part in view.parts.values() for e in part)
        self.bounds.holdings.give(peer, cost)
        view.held -= cost
        view.parts = {}
        view.parts_of = 0

    def _add_part(self, peer: str, view: PeerManifest, part: int, parts: int,
                  entries: tuple[ResEntry, ...]) -> bool:
        """Keep one part of a whole manifest until all have come, within the bounds."""
        if not view.awaiting:
            # Nobody asked: a whole manifest answers our RLIST only (a late second answer
            # to a repeated one is dropped too, harmlessly).
            self.bounds.refuse(peer, "unasked", 1)
            return False
        if parts > self.bounds.max_parts:
            # More parts than a manifest of max_files entries is sent in: none is kept (the
            # issue's 2**62 parts, part 0 never sent, held every other one for good).
            self.bounds.refuse(peer, "parts", 1)
            return False
        if part == 0 or parts != view.parts_of:
            self._drop_parts(peer, view)  # a new manifest: what was gathered is stale
            view.parts_of = parts
        if part in view.parts:
            old = view.parts.pop(part)
            cost = sum(entry_cost(e) for e in old)
            self.bounds.holdings.give(peer, cost)
            view.held -= cost
        if sum(len(p) for p in view.parts.values()) + len(entries) > self.bounds.max_files:
            self.bounds.refuse(peer, "entries", len(entries))
            self._drop_parts(peer, view)
            return False
        cost = sum(entry_cost(e) for e in entries)
        if not self.bounds.holdings.take(peer, cost):
            self.bounds.refuse(peer, "peer_bytes", len(entries))
            self._drop_parts(peer, view)
            return False
        view.parts[part] = entries
        view.held += cost
        return True

    def forget_peer(self, peer: str) -> None:
        """A node removed from [peers]: its view goes, and what it held here with it."""
        view = self.peers.pop(peer, None)
        if view is not None:
            self.bounds.holdings.give(peer, view.held)
        for name, t in list(self.transfers.items()):
            if t.peer == peer and not t.installing:
                del self.transfers[name]
                self.waiting.add(name)

    def conflicts(self) -> list[ConflictView]:
        out = []
        for peer, view in sorted(self.peers.items()):
            for name, theirs in sorted(view.entries.items()):
                ours = self.local.get(name)
                if (ours is not None and ours.digest != theirs.digest
                        and self.rules.kind(name) is FileKind.ONCE):
                    out.append(ConflictView(name, peer, ours, theirs,
                                            self.offsets.get((name, ours.digest, theirs.digest))))
        return out

    def frozen(self, name: str) -> bool:
        return any(c.name == name for c in self.conflicts())

    @property
    def busy(self) -> bool:
        """Transfers under way or waiting: its timers matter at every sweep."""
        return bool(self.transfers or self.waiting)

    def due(self, now: float) -> bool:
        """Whether a Tick would do anything: the sweep ticks only instances with work, so an
        idle host with many instances costs a check per instance, not a pass over names."""
        if self.transfers or self.waiting or now - self._sum_at >= SUM_INTERVAL:
            return True
        if any(self._revisit_due(v, now) for v in self.peers.values()):
            return True
        return any(v.online and v.heard is not None and v.heard not in (self.digest, v.answered)
                   and now - v.asked_at >= self.timeout for v in self.peers.values())

    def missing(self, refs: Iterable[str]) -> tuple[list[str], list[str]]:
        """Of the files the references need: (missing here, held by no host we know of).

        Artifacts are written before the log line that names them, so a missing one is
        always missing; an asset's bytes may never have been fetched by its writer, so an
        asset that no peer holds is not missing (shown apart)."""
        missing: list[str] = []
        unheld: list[str] = []
        seen: set[str] = set()
        for ref in refs:
            for name in required(ref):
                if name in seen or name in self.local or self.rules.kind(name) is None:
                    continue
                seen.add(name)
                held = any(name in v.entries for v in self.peers.values())
                (missing if held or name.startswith("artifacts/") else unheld).append(name)
        return missing, unheld

    # -- the machine ------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Effect]:
        out: list[Effect] = []
        match event:
            case LocalFile():
                self._local(event, now, out)
            case LocalGone(name):
                if self._drop_local(name):
                    out.append(Save())
                    t = self.transfers.get(name)
                    if t is not None and t.compare:
                        del self.transfers[name]  # nothing of ours left to compare
                    self._consider(name, now, out)
            case PeerItem(peer, payload):
                self._peer_item(peer, payload, now, out)
            case PeerPresence(peer, online):
                view = self._view(peer)
                if online and not view.online:
                    view.revisit = True  # done by Tick, paced (PRESENCE_PASS): no work here
                view.online = online
            case Connected():
                self._send_sum(now, out)
            case Tick():
                self._tick(now, out)
            case Installed(entry):
                self.transfers.pop(entry.name, None)
                self._set_local(entry)
                self._changed.append(entry)
                out.append(Save())
                # Another peer may hold other bytes under that name (heard meanwhile).
                self._consider(entry.name, now, out)
                self._consider_waiting(now, out)
            case InstallFailed(name, _):
                self.transfers.pop(name, None)
                self.retry_at[name] = now + self.timeout
                self.waiting.add(name)
            case Compared():
                self._on_compared(event, now, out)
            case ServeFailed(peer, name, digest, reason):
                # Not "other bytes held": what we hold is unknown until the shell's rescan,
                # which announces it. The asker forgets our entry and asks again from there.
                out.append(Send(Kind.RREFUSE, frames.ResRefuse(name, digest, None, reason),
                                peer))
        if self._changed:
            for part in _parts(self._changed):
                out.append(Send(Kind.RHAVE, frames.res_have(False, part)))
            self._changed = []
            self._send_sum(now, out)
        return out

    def _view(self, peer: str) -> PeerManifest:
        view = self.peers.get(peer)
        if view is None:
            view = self.peers[peer] = PeerManifest()
        return view

    def _local(self, e: LocalFile, now: float, out: list[Effect]) -> None:
        kind = self.rules.kind(e.name)
        if kind is None:
            return
        if e.size > self.rules.max_file_bytes:
            self._refuse(e.name, f"{e.size} bytes, over max_file_bytes "
                                 f"({self.rules.max_file_bytes})", out)
            return
        old = self.local.get(e.name)
        if old is not None and old.digest == e.digest and old.size == e.size:
            return
        stamp, origin = 0, ""
        if kind is FileKind.REPLACED:
            heard = [v.entries[e.name] for v in self.peers.values() if e.name in v.entries]
            same = [h for h in heard if h.digest == e.digest]
            if same:
                # Bytes a peer announced are that version (we got them from it), not a write.
                best = max(same, key=version)
                stamp, origin = best.stamp, best.origin
            else:
                # One more than any version known here, and at least the write's time in ms:
                # a writer that lost its record of the last version (the sidecar deleted
                # meanwhile, a restart cut off from its peers) still numbers its new write
                # above the versions it wrote before.
                known = [old.stamp] if old is not None else []
                stamp = max(max(known + [h.stamp for h in heard], default=0) + 1,
                            e.mtime_ns // 1_000_000)
                origin = self.node
        entry = ResEntry(e.name, e.size, e.digest, stamp, origin)
        self._set_local(entry)
        self._changed.append(entry)
        out.append(Save())
        if self.transfers.pop(e.name, None) is not None:
            out.append(Discard(e.name))  # the local writer got there first
        self._consider(e.name, now, out)

    def _refuse(self, name: str, reason: str, out: list[Effect]) -> None:
        """Logged once per name (a peer may announce one name with ever other sizes), for the
        first REFUSED_SHOWN names; counted past them."""
        if name in self.refused:
            self.refused[name] = reason
            return
        if len(self.refused) >= REFUSED_SHOWN:
            self.refused_more += 1
            return
        self.refused[name] = reason
        out.append(Refused(name, reason))

    def _peer_item(self, peer: str, p: frames.Payload, now: float, out: list[Effect]) -> None:
        view = self._view(peer)
        match p:
            case frames.ResSum(digest, _):
                view.heard = digest
                self._maybe_list(peer, view, now, out)
            case frames.ResList():
                entries = sorted(self.local.values(), key=lambda e: e.name)
                parts = _parts(entries) or [()]
                for i, part in enumerate(parts):
                    out.append(Send(Kind.RHAVE, frames.res_have(True, part, i, len(parts)),
                                    peer))
            case frames.ResHave(False, entries):
                for e in entries:
                    self._heard(peer, view, e, now, out)
            case frames.ResHave(True, entries, _, part, parts):
                if not self._add_part(peer, view, part, parts, entries):
                    return
                if len(view.parts) < parts or set(view.parts) != set(range(parts)):
                    return  # a part lost on the way: the next summary asks again
                whole = [e for i in range(parts) for e in view.parts[i]]
                self._drop_parts(peer, view)
                view.answered, view.awaiting = view.asked, False
                names = {e.name for e in whole}
                gone = sorted(set(view.entries) - names)
                for name in gone:
                    self._drop_entry(peer, view, name)
                for e in whole:
                    self._heard(peer, view, e, now, out)
                for name in gone:  # two peers that disagreed may agree now
                    self._consider(name, now, out)
            case frames.ResAsk(name, digest, offset, length):
                ours = self.local.get(name)
                if ours is None or ours.digest != digest or offset > ours.size:
                    why = "not held here" if ours is None else "other bytes held here"
                    out.append(Send(Kind.RREFUSE, frames.ResRefuse(
                        name, digest, ours.digest if ours else None, why), peer))
                    return
                out.append(Serve(peer, name, digest, ours.size, offset,
                                 min(length, ours.size - offset, self.serve_max)))
            case frames.ResChunk():
                self._chunk(peer, p, now, out)
            case frames.ResRefuse(name, digest):
                held = view.entries.get(name)
                if held is not None and held.digest == digest:
                    self._drop_entry(peer, view, name)  # it no longer holds what it announced
                    view.answered = None  # ask for its manifest at its next summary
                t = self.transfers.get(name)
                if t is not None and t.peer == peer and t.entry.digest == digest:
                    self._drop(name, t, out)
                self._consider(name, now, out)

    def _maybe_list(self, peer: str, view: PeerManifest, now: float, out: list[Effect]) -> None:
        """Ask for a peer's whole manifest when its summary is neither ours nor one we were
        answered for: at most once per `timeout` (the entries that change reach us anyway;
        the list is the repair), and again from Tick while that holds."""
        if view.heard is None or view.heard in (self.digest, view.answered):
            return
        if now - view.asked_at < self.timeout:
            return
        view.asked, view.asked_at, view.awaiting = view.heard, now, True
        out.append(Send(Kind.RLIST, frames.ResList(view.heard), peer))
        # And ours in return: if our last summary was lost, the peer asks too, now rather
        # than at the next SUM_INTERVAL.
        self._send_sum(now, out)

    def _heard(self, peer: str, view: PeerManifest, e: ResEntry, now: float,
               out: list[Effect]) -> None:
        if e.name not in view.entries and (
                len(view.entries) >= self.bounds.max_files
                or not self.bounds.holdings.room(peer, entry_cost(e))):
            # Refused before any work on it: past its bounds, a peer's entries cost a check.
            self.bounds.refuse(peer, "entries" if len(view.entries) >= self.bounds.max_files
                               else "peer_bytes", 1)
            return
        kind = self.rules.kind(e.name)
        if kind is None:
            return
        if kind is FileKind.REPLACED:
            if self.writers is not None and e.origin not in self.writers:
                return  # a sidecar written on a host that is not this key's writer
            old = view.entries.get(e.name)
            if old is not None and version(old) > version(e):
                return  # an older announcement overtaken by a newer one
        if self._put_entry(peer, view, e):
            self._consider(e.name, now, out)

    def _consider_waiting(self, now: float, out: list[Effect]) -> None:
        for name in sorted(self.waiting):
            if not self._room(0):
                return
            self._consider(name, now, out)

    def _revisit_due(self, view: PeerManifest, now: float) -> bool:
        return view.revisit and view.online and now - view.revisited_at >= PRESENCE_PASS

    def _revisit(self, now: float, out: list[Effect]) -> None:
        """Peers that came online: our summary to everyone once, and another look at the
        names each holds (only those: the others' offers did not change)."""
        due = [(p, v) for p, v in sorted(self.peers.items()) if self._revisit_due(v, now)]
        if not due:
            return
        self._send_sum(now, out)
        for _, view in due:
            view.revisit, view.revisited_at = False, now
            for name in sorted(view.entries):
                self._consider(name, now, out)

    def _consider(self, name: str, now: float, out: list[Effect]) -> None:
        """What to do about `name`: fetch, adopt a version, compare, or nothing."""
        kind = self.rules.kind(name)
        self.waiting.discard(name)
        if kind is None or name in self.transfers:
            return
        if self.retry_at.get(name, -1e18) > now:
            self.waiting.add(name)
            return
        ours = self.local.get(name)
        offers = [(p, v.entries[name]) for p, v in sorted(self.peers.items())
                  if name in v.entries]
        if not offers:
            return
        if kind is FileKind.ONCE:
            if ours is None:
                digests = {e.digest for _, e in offers}
                if len(digests) == 1:  # peers that disagree: no winner is picked here
                    self._fetch(offers, now, out)
                return
            for peer, theirs in offers:
                key = (name, ours.digest, theirs.digest)
                if theirs.digest == ours.digest or key in self.offsets:
                    continue
                if self.peers[peer].online and self._room(theirs.size):
                    self._start(Transfer(theirs, peer, compare=True), now, out)
                    return
                self.waiting.add(name)
            return
        best = max((e for _, e in offers), key=version)
        if ours is not None and self._counts(ours) and version(ours) >= version(best):
            return
        if ours is not None and ours.digest == best.digest:
            self._set_local(best)  # the same bytes: only the version number moves on
            self._changed.append(best)
            out.append(Save())
            return
        self._fetch([(p, e) for p, e in offers if e == best], now, out)

    def _counts(self, e: ResEntry) -> bool:
        """Whether a replaced file's version counts: one written on a host that is not among
        the key's writers (a standby's own rewrite) loses to any writer's version."""
        return self.writers is None or e.origin in self.writers

    def _room(self, size: int) -> bool:
        """Whether a transfer of `size` bytes may start now (see BIG_TRANSFERS)."""
        n = len(self.transfers)
        if n < BIG_TRANSFERS:
            return True
        if n >= MAX_TRANSFERS:
            return False  # before the sum: a peer announcing many names asks this often
        due = sum(t.entry.size - t.got for t in self.transfers.values())
        return due + size <= self.window

    def _fetch(self, offers: list[tuple[str, ResEntry]], now: float, out: list[Effect]) -> None:
        entry = offers[0][1]
        if entry.size > self.rules.max_file_bytes:
            self._refuse(entry.name, f"{entry.size} bytes, over max_file_bytes "
                                     f"({self.rules.max_file_bytes})", out)
            return
        online = [p for p, _ in offers if self.peers[p].online]
        if not self._room(entry.size) or not online:
            self.waiting.add(entry.name)  # started by a later Tick, Installed or presence
            return
        self._start(Transfer(entry, online[0]), now, out)

    def _start(self, t: Transfer, now: float, out: list[Effect]) -> None:
        name = t.entry.name
        self.transfers[name] = t
        if t.compare:
            ours = self.local[name]
            end = min(ours.size, t.entry.size)
            if end == 0:
                self._compared(name, t, 0, now, out)
                return
        elif t.entry.size == 0:
            out.append(Write(name, 0, b"", True))
            t.installing = True
            out.append(Install(t.entry, self._expect(name)))
            return
        self._ask(t, now, out)

    def _expect(self, name: str) -> ResEntry | None:
        return self.local.get(name) if self.rules.kind(name) is FileKind.REPLACED else None

    def _end(self, t: Transfer) -> int:
        if t.compare:
            return min(self.local[t.entry.name].size, t.entry.size)
        return t.entry.size

    def _ask(self, t: Transfer, now: float, out: list[Effect]) -> None:
        t.until = min(self._end(t), t.got + self.window)
        t.deadline = now + self.timeout * min(1 << t.misses, BACKOFF)
        out.append(Send(Kind.RREQ, frames.ResAsk(t.entry.name, t.entry.digest, t.got,
                                                 t.until - t.got), t.peer))

    def _chunk(self, peer: str, c: frames.ResChunk, now: float, out: list[Effect]) -> None:
        t = self.transfers.get(c.name)
        if (t is None or t.peer != peer or t.entry.digest != c.digest or c.offset != t.got
                or t.installing or c.offset + len(c.data) > self._end(t)):
            return  # a duplicate, a late answer to an abandoned request, or not ours
        t.deadline = now + self.timeout
        t.misses = 0
        if t.compare:
            out.append(Compare(c.name, c.digest, c.offset, c.data))
            t.got += len(c.data)
            return
        out.append(Write(c.name, c.offset, c.data, c.offset == 0))
        t.got += len(c.data)
        if t.got >= t.entry.size:
            t.installing = True
            out.append(Install(t.entry, self._expect(c.name)))
        elif t.got >= t.until:
            self._ask(t, now, out)

    def _on_compared(self, e: Compared, now: float, out: list[Effect]) -> None:
        t = self.transfers.get(e.name)
        if t is None or not t.compare or t.entry.digest != e.theirs:
            return
        if e.differ_at is not None:
            self._compared(e.name, t, e.differ_at, now, out)
        elif e.end >= self._end(t):
            self._compared(e.name, t, self._end(t), now, out)  # one is a prefix of the other
        elif t.got >= t.until and e.end >= t.got:
            self._ask(t, now, out)

    def _compared(self, name: str, t: Transfer, offset: int, now: float,
                  out: list[Effect]) -> None:
        del self.transfers[name]
        ours = self.local.get(name)
        if ours is None:
            return
        self.offsets[(name, ours.digest, t.entry.digest)] = offset
        while len(self.offsets) > MAX_OFFSETS:  # a peer may announce ever new digests
            del self.offsets[next(iter(self.offsets))]
        out.append(Conflict(name, t.peer, offset, ours, t.entry))
        self._consider(name, now, out)  # a third host's copy may differ too

    def _drop(self, name: str, t: Transfer, out: list[Effect]) -> None:
        del self.transfers[name]
        if not t.compare:
            out.append(Discard(name))

    def _tick(self, now: float, out: list[Effect]) -> None:
        self._revisit(now, out)
        if now - self._sum_at >= SUM_INTERVAL:
            self._send_sum(now, out)
            for name in [n for n, at in self.retry_at.items() if at <= now]:
                del self.retry_at[name]  # past: no longer holds anything back
        for peer, view in sorted(self.peers.items()):
            if view.online:
                self._maybe_list(peer, view, now, out)
        for name, t in sorted(self.transfers.items()):
            if t.installing or now < t.deadline:
                continue
            # Resume from the last byte received, from any online peer holding these bytes.
            holders = [p for p, v in sorted(self.peers.items())
                       if v.online and v.entries.get(name) == t.entry]
            if t.peer not in holders and holders:
                t.peer, t.misses = holders[0], 0
            else:
                t.misses = min(t.misses + 1, 8)
            self._ask(t, now, out)
        self._consider_waiting(now, out)

    def _send_sum(self, now: float, out: list[Effect]) -> None:
        self._sum_at = now
        out.append(Send(Kind.RSUM, frames.ResSum(self.digest, len(self.local))))

    # -- persistence ------------------------------------------------------------------------

    def restore(self, entries: Iterable[ResEntry]) -> None:
        """The manifest saved before a restart (the shell checks each file against it, and
        first puts back the installs it had recorded as intended: a file syncd installed just
        before a kill -9 is that fetched version, not a local write)."""
        self.local = {e.name: e for e in entries}
        self._acc = 0
        self.manifest_bytes = 0
        for e in self.local.values():
            self._acc ^= _entry_hash(e)
            self.manifest_bytes += _wire(e)

    def status(self) -> dict[str, object]:
        conflicts = self.conflicts()
        return {
            "files": len(self.local),
            "bytes": sum(e.size for e in self.local.values()),
            "manifest": self.digest.hex()[:16],
            "fetching": [{"name": n, "peer": t.peer, "got": t.got, "size": t.entry.size,
                          "compare": t.compare} for n, t in sorted(self.transfers.items())],
            "conflicts": [c.to_json() for c in conflicts],
            "refused": [{"name": n, "reason": r} for n, r in sorted(self.refused.items())],
            "refused_more": self.refused_more,
        }


def _wire(e: ResEntry) -> int:
    return ENTRY_WIRE + len(e.name.encode("utf-8", "surrogateescape")) + len(e.origin)


def _parts(entries: list[ResEntry]) -> list[tuple[ResEntry, ...]]:
    return [tuple(entries[i:i + ENTRIES_PER_ITEM])
            for i in range(0, len(entries), ENTRIES_PER_ITEM)]
