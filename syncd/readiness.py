"""Can this host take over a key now? The one definition of READY (`decide`, pure), and the
log checks of `syncd verify` that it needs, kept up incrementally (`IncrementalVerifier`).

Each replicated file has a checker that has seen the file's first `size` bytes. After growth
(at most once a second) it reads only the bytes it has not seen (fresh in the page cache) and
parses them on the event loop in small slices, spread out in time while it keeps up with a live
file, so that neither this daemon nor the other processes on the host wait behind a burst.
Its state is saved in `state_dir` (at most every SAVE_INTERVAL seconds, and on shutdown)
together with the size it covers, so a restart goes on from there instead of re-reading whole
files. When the file's history is replaced (an adopted
copy, a noticed edit) the checker starts again from byte 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from syncd import store
from syncd.verify import LogChecker, Report

log = logging.getLogger("syncd.readiness")

STEP = 4 << 20
SLICE = 16 << 10
SPREAD = 0.002  # seconds between two slices of a live file's new bytes
BACKLOG = 1 << 20
INLINE_READ = 256 << 10  # bytes read on the loop at most (page cache); more: in a thread
SAVE_INTERVAL = 30.0
FOLLOW_INTERVAL = 1.0  # seconds between two catch-ups of one file


class IncrementalVerifier:
    def __init__(self, path: Path, state_file: Path) -> None:
        self.path = path
        self.state_file = state_file
        self.checker = LogChecker()
        self.size = 0  # bytes of the file the checker has seen
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._report: Report | None = None
        self._last: Report | None = None  # the last report made, shown while a catch-up runs
        self._saved_at = 0.0
        self._saved_size = -1
        self.bytes_read = 0  # since start: shows that a restart did not re-read the file
        self._followed_at = -FOLLOW_INTERVAL
        self._later: asyncio.TimerHandle | None = None
        self.caught_up_at: float | None = None  # wall time a catch-up last reached its end

    def restore(self, limit: int) -> None:
        """Continue from the saved state if it covers no more than `limit` bytes (the ledger)."""
        try:
            saved = orjson.loads(self.state_file.read_bytes())
            size = saved["size"]
            if not 0 <= size <= limit:
                return
            self.checker = LogChecker.from_state(saved["checker"].encode())
            self.size = self._saved_size = size
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("%s: saved verification state unusable (%s); verifying from the start",
                        self.path, e)

    def restart(self) -> None:
        """The file's history was replaced: check it again from byte 0."""
        self._generation += 1
        self.checker = LogChecker()
        self.size = 0
        self._report = self._last = None
        self._saved_size = -1

    def follow(self, target: Callable[[], int],
               paused: Callable[[], bool] = lambda: False) -> None:
        """Catch up to target() in the background: one catch-up at a time, and at most one
        start per FOLLOW_INTERVAL, so that a busy file is read in few large steps. A catch-up
        stops early once `paused()` says so (the next follow goes on from there)."""
        if self._task is not None and not self._task.done():
            return
        if target() <= self.size:
            # Nothing to read: at most the state to save, and no task for that. (Each idle file
            # started a catch-up task every sweep, forever: the task's own save() was refused
            # while it ran, and the sweep's came just after the next one started.)
            self.save()
            return
        loop = asyncio.get_running_loop()
        wait = self._followed_at + FOLLOW_INTERVAL - loop.time()
        if wait > 0:
            if self._later is None:
                self._later = loop.call_later(wait, self._follow_later, target, paused)
            return
        self._followed_at = loop.time()
        self._task = loop.create_task(self._catch_up(target, paused))

    def _follow_later(self, target: Callable[[], int], paused: Callable[[], bool]) -> None:
        self._later = None
        self.follow(target, paused)

    async def _catch_up(self, target: Callable[[], int], paused: Callable[[], bool]) -> None:
        generation = self._generation
        checker = self.checker
        while (end := target()) > self.size and not paused():
            start = self.size
            stop = min(end, start + STEP)
            # A live file's few new bytes are in the page cache: reading them here costs less
            # than the hop to a thread; a backlog is read in a thread, a STEP at a time.
            if stop - start <= INLINE_READ:
                data = store.read_range(self.path, start, stop)
            else:
                data = await asyncio.to_thread(store.read_range, self.path, start, stop)
            if not data:
                break
            # Parse on the event loop, a slice at a time, yielding in between: parsed in a
            # worker thread, the whole chunk held the GIL for milliseconds while frames waited
            # (it set the lag's 99th percentile); a slice costs ~0.2 ms.
            for at in range(0, len(data), SLICE):
                if generation != self._generation:
                    return  # restarted meanwhile; the new history gets its own catch-up
                if paused():
                    break
                piece = data[at : at + SLICE]
                checker.feed(piece)
                self.size += len(piece)
                self.bytes_read += len(piece)
                self._report = None
                # Keeping up with a live file, spread the slices out (no burst of parsing
                # for the other processes on the host to wait behind); a backlog goes at once.
                await asyncio.sleep(SPREAD if end - self.size < BACKLOG else 0)
            if self.size >= end and target() - self.size < BACKLOG:
                # Keeping up with a live file: what it got meanwhile waits for the next
                # follow (at most FOLLOW_INTERVAL away), not for another read right now.
                break
        if generation == self._generation and self.size >= end:
            self.caught_up_at = time.time()
        self._save(in_task=True)

    @property
    def unsaved(self) -> bool:
        return self.size != self._saved_size

    def report(self) -> Report | None:
        """The current report, or the last one while a catch-up is feeding the checker."""
        if self._report is None and (self._task is None or self._task.done()):
            self._report = self._last = self.checker.report()
        return self._report if self._report is not None else self._last

    def save(self, force: bool = False) -> None:
        self._save(force=force)

    def _save(self, force: bool = False, in_task: bool = False) -> None:
        """`in_task`: called by the catch-up itself at its end (not a save mid-catch-up)."""
        if self.size == self._saved_size:
            return
        if not force and time.monotonic() - self._saved_at < SAVE_INTERVAL:
            return
        if self._task is not None and not self._task.done() and not (force or in_task):
            return
        blob = orjson.dumps({"size": self.size, "checker": self.checker.to_state().decode()})
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        with contextlib.suppress(OSError):
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            # No fsync: a state lost to a power cut only means checking the file again.
            tmp.write_bytes(blob)
            tmp.replace(self.state_file)
            self._saved_at, self._saved_size = time.monotonic(), self.size

    async def close(self) -> None:
        if self._later is not None:
            self._later.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.save(force=True)


# --- the one definition of READY ---------------------------------------------------------

# A peer that was writing when it went offline: its last frames and its last announcement
# (sent at most ANNOUNCE_GAP = 0.5 s after its bytes were durable) may still be on their way.
WRITER_SETTLE = 2.0
# After (re)connecting, the broker hands us every retained position at once; until then what
# we know of the peers may be old (a reset we have not heard of yet, say).
PEERS_SETTLE = 1.0
# Bytes that arrived moments ago and are not checked yet are the normal state of a live copy
# (the checks follow at most once a second): a note. Longer than this, a reason.
CHECK_GRACE = 5.0


@dataclass(frozen=True)
class PeerFacts:
    """What this host knows of one peer's copy of the file (times are wall clock, seconds)."""

    name: str
    online: bool
    offline_since: float | None  # when this daemon learned it went (or was) offline
    size: int  # what it announced (or what we know it holds from its bytes)
    ahead_by: int  # bytes it holds beyond ours, consistent with ours (0: none, or diverged)
    ahead_since: float | None
    frozen: str | None  # its own freeze, as it announces it: "reset", "diverged" (local)
    frozen_since: float | None  # when we first heard it frozen
    diverged: bool  # our copy and its copy differ inside their common prefix
    diverged_since: float | None
    grew_at: float | None  # when we last learned its copy grew (it was writing)
    # When we last heard of its copy at all. Shown, not a reason: positions are retained and
    # announced on every change, so an old heard_at only means its copy has not changed; what
    # makes our knowledge stale is the broker connection (Facts.connected, connected_since).
    heard_at: float | None
    # The listed hosts it announces diverged from (this host among them, perhaps), and since
    # when we have heard it announce any.
    disputes: tuple[str, ...] = ()
    disputes_since: float | None = None


@dataclass(frozen=True)
class Facts:
    """Everything READY depends on, for one file on this host."""

    now: float
    state: str  # the status word: in_sync, behind, verifying, reset, paused, error, ...
    freeze: str | None  # our own freeze ("reset", "diverged"): None if only diverged from peers
    freeze_since: float | None
    freeze_detail: str | None
    size: int  # bytes we hold, durable and accounted for
    checked: int  # bytes the log checks have read
    report: Report | None  # their verdict on the bytes read so far (None before the first)
    checked_at: float | None  # when the checks last reached the end they were sent to
    connected: bool  # to the broker
    connected_since: float | None
    trouble: str | None = None  # paused (disk full) or error (unreadable): what it says
    adopting: str | None = None  # the node an adoption fetches from
    role: str = "symmetric"
    note: str | None = None  # a local edit noticed (status "note")
    peers: tuple[PeerFacts, ...] = ()
    node: str = ""  # this host's name, as the peers name it in their divergences
    # Files under resources/ that the log references and this host lacks (resources.py
    # ResourceMachine.missing), referenced files no host holds, and write-once conflicts.
    missing_resources: tuple[str, ...] = ()
    unheld_resources: int = 0
    resource_conflicts: int = 0


@dataclass(frozen=True)
class Verdict:
    ready: bool
    not_ready: list[str]  # every reason, each with "since ..." where known
    notes: list[str]  # information that does not change the answer


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def _since(ts: float | None) -> str:
    return f" since {when(ts)}" if ts is not None else ""


def decide(f: Facts) -> Verdict:
    """READY: starting the bot on this host now loses nothing a peer has announced as durable
    and brings back nothing a peer has discarded.

    Concretely, no reason below applies: this copy is not frozen, stuck, adopting or still
    being checked; every byte any peer (online or not) announced is here; no peer announces
    its copy reset or diverged (from anyone), and we have not diverged from any; a peer that
    was writing when it went offline has been offline for WRITER_SETTLE seconds; we are
    connected to the broker and have been for PEERS_SETTLE seconds; the log checks read the
    whole copy (or all but bytes that arrived within CHECK_GRACE) and found no problem; every
    resource file the log references (an artifact, or an asset some host holds) is here, and
    no write-once resource differs from a peer's copy.
    """
    why: list[str] = []
    notes: list[str] = []
    if f.freeze is not None:
        detail = f": {f.freeze_detail}" if f.freeze_detail else ""
        why.append(f"frozen here ({f.freeze}){_since(f.freeze_since)}{detail}")
    if f.state == "verifying":
        why.append("start-up check of the file running")
    if f.trouble is not None:
        why.append(f"{f.state}: {f.trouble}")
    if f.adopting is not None:
        why.append(f"adopting {f.adopting}'s copy")
    if not f.connected:
        why.append("not connected to the broker: what the peers hold now is unknown")
    elif f.connected_since is None or f.now - f.connected_since < PEERS_SETTLE:
        why.append(f"connected to the broker{_since(f.connected_since)}: "
                   "the peers' positions are still arriving")
    # A divergence with any peer is a reason, not only with the writer: nothing here can tell
    # a second writer (the other side of a split brain, whose lines a takeover here would
    # leave out) from a stale or compromised host. The operator decides: adopt, or unlist a
    # host that is not to be trusted (its divergence goes with it).
    diverged_here = {p.name for p in f.peers if p.diverged}
    for p in sorted(f.peers, key=lambda p: p.name):
        where = "" if p.online else f" (offline{_since(p.offline_since)})"
        if p.diverged:
            why.append(f"diverged from {p.name}{_since(p.diverged_since)}: the copies differ "
                       "inside their common prefix")
        # Its quarrels with hosts we quarrel with too (or with it) are said once, above.
        disputed = [("this host" if n == f.node else n) for n in p.disputes
                    if n not in diverged_here] if not p.diverged else []
        if disputed:
            why.append(f"{p.name} announces its copy diverged from {', '.join(disputed)}"
                       f"{_since(p.disputes_since)}{where}: which history is right is not "
                       "decided yet")
        if p.frozen == "reset":
            why.append(f"{p.name} announces its copy reset{_since(p.frozen_since)}{where}: its "
                       "file was cleared, replaced or truncated, and this host holds the "
                       "history it discarded")
        elif p.frozen is not None and not p.diverged:
            why.append(f"{p.name} announces its copy {p.frozen}{_since(p.frozen_since)}{where}:"
                       " which history is right is not decided yet")
        if p.ahead_by > 0 and not p.diverged:
            why.append(f"{p.name} holds {p.ahead_by} more bytes{_since(p.ahead_since)}{where}")
        if not p.online:
            wrote = (p.grew_at is not None and p.offline_since is not None
                     and p.offline_since - p.grew_at < WRITER_SETTLE)
            if wrote and p.offline_since is not None and f.now - p.offline_since < WRITER_SETTLE:
                why.append(f"{p.name} went offline at {when(p.offline_since)} while writing: its "
                           f"last bytes may still be on their way (wait {WRITER_SETTLE:g} s)")
            elif p.ahead_by <= 0 and p.frozen is None and not p.diverged:
                notes.append(f"{p.name} offline{_since(p.offline_since)}: what it wrote after "
                             "that is not here")
    _log_check(f, why, notes)
    _resources(f, why, notes)
    if f.role == "replica":
        notes.append("role 'replica': a local write freezes this file; change the role before "
                     "moving the bot here")
    if f.note is not None:
        notes.append(f.note)
    return Verdict(not why, why, notes)


MISSING_SHOWN = 5


def _resources(f: Facts, why: list[str], notes: list[str]) -> None:
    if f.missing_resources:
        names = ", ".join(f.missing_resources[:MISSING_SHOWN])
        more = len(f.missing_resources) - MISSING_SHOWN
        why.append(f"{len(f.missing_resources)} resource file(s) the log references are not "
                   f"here: {names}" + (f" and {more} more" if more > 0 else ""))
    if f.resource_conflicts:
        why.append(f"{f.resource_conflicts} write-once resource file(s) differ from a peer's "
                   "copy (see resources.conflicts): which copy is right is not decided yet")
    if f.unheld_resources:
        notes.append(f"{f.unheld_resources} asset file(s) the log references are held by no "
                     "host (never fetched by the writer)")


def _log_check(f: Facts, why: list[str], notes: list[str]) -> None:
    report = f.report
    if report is not None and not report.clean:
        kinds = ", ".join(f"{k} {n}" for k, n in report.problem_counts.items())
        why.append(f"log check found problems: {kinds}")
    if f.checked < f.size or report is None:
        recent = f.checked_at is not None and f.now - f.checked_at < CHECK_GRACE
        text = f"log check running ({f.checked} of {f.size} bytes)"
        if recent and report is not None:
            notes.append(text)
        else:
            why.append(text + (f", last caught up {when(f.checked_at)}"
                               if f.checked_at is not None else ""))
    if report is not None:
        notes.extend(report.notes)
