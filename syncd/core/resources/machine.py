"""The resources machine: one instance's manifest, its peers' and the transfers between them.

The rules it applies (write-once, replaced, who fetches what from whom) are the package's
docstring (resources/__init__.py); its inputs and outputs are messages.py, which files count
rules.py, and the manifests manifest.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from syncd.core import frames
from syncd.core.frames import Kind, ResEntry
from syncd.core.refs import required
from syncd.core.resources.manifest import (
    PeerBounds,
    PeerManifest,
    entry_cost,
    entry_hash,
    in_parts,
    wire_size,
)
from syncd.core.resources.messages import (
    Compare,
    Compared,
    Conflict,
    Connected,
    Discard,
    Effect,
    Event,
    Install,
    Installed,
    InstallFailed,
    LocalFile,
    LocalGone,
    PeerItem,
    PeerPresence,
    Refused,
    Save,
    Send,
    Serve,
    ServeFailed,
    Tick,
    Write,
)
from syncd.core.resources.rules import FileKind, Rules, version

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
# A transfer whose holder sends nothing is asked again after timeout x 2**misses, at most
# BACKOFF x timeout: a listed host that announces files and never answers (64 transfers per
# instance, hundreds of instances) is asked a few times a minute per file, not every 3 s.
BACKOFF = 16
REFUSED_SHOWN = 100  # files refused (too big) that are logged and shown, per instance
MAX_OFFSETS = 4096  # first differences remembered, per instance (the oldest go first)


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
    """One instance's resources on this host (see the package docstring)."""

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
            self._acc ^= entry_hash(old)
            self.manifest_bytes -= wire_size(old)
        self.local[e.name] = e
        self._acc ^= entry_hash(e)
        self.manifest_bytes += wire_size(e)

    def _drop_local(self, name: str) -> bool:
        old = self.local.pop(name, None)
        if old is None:
            return False
        self._acc ^= entry_hash(old)
        self.manifest_bytes -= wire_size(old)
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
            for part in in_parts(self._changed):
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
                parts = in_parts(entries) or [()]
                for i, part in enumerate(parts):
                    out.append(Send(Kind.RHAVE, frames.res_have(True, part, i, len(parts)),
                                    peer))
            case frames.ResHave(False, entries):
                for e in entries:
                    self._heard(peer, view, e, now, out)
            case frames.ResHave(True, entries, _, part, parts):
                if not view.add_part(peer, part, parts, entries, self.bounds):
                    return
                if len(view.parts) < parts or set(view.parts) != set(range(parts)):
                    return  # a part lost on the way: the next summary asks again
                whole = [e for i in range(parts) for e in view.parts[i]]
                view.drop_parts(peer, self.bounds)
                view.answered, view.awaiting = view.asked, False
                names = {e.name for e in whole}
                gone = sorted(set(view.entries) - names)
                for name in gone:
                    view.drop(peer, name, self.bounds)
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
                    view.drop(peer, name, self.bounds)  # it no longer holds what it announced
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
        if view.put(peer, e, self.bounds):
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
            self._acc ^= entry_hash(e)
            self.manifest_bytes += wire_size(e)

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
