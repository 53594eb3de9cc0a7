"""Can this host take over a key now? The one definition of READY (`decide`, pure).

Its facts come from the per-file shell (daemon/filetask.py), which keeps the log checks of
`syncd verify` current for each file with daemon/logfollow.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from syncd.core.logreport import ProblemKind, Report

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
class Unconfirmed:
    """An online peer whose positions we cannot confirm as complete and recent (freshness.py,
    PeerStreams; or frames of it that arrived and are not handled here yet)."""

    name: str
    since: float | None
    why: str


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
    # Files under resources/ that the log references and this host lacks (core/resources/
    # ResourceMachine.missing), referenced files no host holds, and write-once conflicts.
    missing_resources: tuple[str, ...] = ()
    unheld_resources: int = 0
    resource_conflicts: int = 0
    # Online peers (that may write this key) whose positions are not provably fresh.
    unconfirmed: tuple[Unconfirmed, ...] = ()


@dataclass(frozen=True)
class Readiness:
    ready: bool
    not_ready: list[str]  # every reason, each with "since ..." where known
    notes: list[str]  # information that does not change the answer


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def _since(ts: float | None) -> str:
    return f" since {when(ts)}" if ts is not None else ""


def decide(f: Facts) -> Readiness:
    """READY: starting the bot on this host now loses nothing a peer has announced as durable
    and brings back nothing a peer has discarded.

    Concretely, no reason below applies: this copy is not frozen, stuck, adopting or still
    being checked; every byte any peer (online or not) announced is here; no peer announces
    its copy reset or diverged (from anyone), and we have not diverged from any; a peer that
    was writing when it went offline has been offline for WRITER_SETTLE seconds; we are
    connected to the broker and have been for PEERS_SETTLE seconds; the log checks read the
    whole copy (or all but bytes that arrived within CHECK_GRACE) and found no problem; every
    resource file the log references (an artifact, or an asset some host holds) is here, and
    no write-once resource differs from a peer's copy; and what we know of every online peer
    is provably fresh: none of its frames was lost since it last stated all its positions, one
    arrived within STALE_AFTER, and none waits to be handled (a position the broker dropped
    would otherwise leave us believing an old one: a yes for a copy that lacks bytes).
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
    grew = {p.name: p.grew_at for p in f.peers}
    for u in sorted(f.unconfirmed, key=lambda u: u.name):
        last_write = grew.get(u.name)
        last = f"; it last wrote at {when(last_write)}" if last_write is not None else ""
        why.append(f"what {u.name} holds is not confirmed{_since(u.since)}: {u.why}{last}")
    _log_check(f, why, notes)
    _resources(f, why, notes)
    if f.role == "replica":
        notes.append("role 'replica': a local write freezes this file; change the role before "
                     "moving the bot here")
    if f.note is not None:
        notes.append(f.note)
    return Readiness(not why, why, notes)


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


LINES_SHOWN = 3
TORN_TAIL = str(ProblemKind.TORN_TAIL)


def _where(report: Report, kind: str) -> str:
    """ (at line 12)", " (at lines 12, 40, 41 ...)": where the problems of one kind are, so
    that the operator can look at them (`syncd verify` lists every one)."""
    lines = [p.line for p in report.problems if p.kind == kind]
    if not lines:
        return ""
    shown = ", ".join(str(n) for n in lines[:LINES_SHOWN])
    more = " ..." if len(lines) > LINES_SHOWN or report.problem_counts[kind] > len(lines) else ""
    return f" (at line {shown})" if len(lines) == 1 and not more else f" (at lines {shown}{more})"


def _log_check(f: Facts, why: list[str], notes: list[str]) -> None:
    report = f.report
    counts = dict(report.problem_counts) if report is not None else {}
    if f.checked < f.size:
        # The checks stopped inside a line (a STEP's end, or paused while the file caught
        # up): that unfinished line goes on in bytes not checked yet, so it is no torn tail.
        # (Counted as one, READY flickered to "no" for a whole copy mid-check.)
        counts.pop(TORN_TAIL, None)
    if report is not None and counts:
        kinds = ", ".join(f"{k} {n}{_where(report, k)}" for k, n in counts.items())
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
