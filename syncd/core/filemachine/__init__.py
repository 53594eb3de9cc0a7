"""One replicated file as a pure state machine: events in, effects out.

Everything that decides anything about one copy of one file lives in this package: whether bytes are
appended, shipped, served, refused; when a file freezes and why; when it is done adopting.
It does not know whether bytes come from the local writer or a peer beyond what the
rule needs, and it touches no file, socket, thread or clock.

Theory of operation
-------------------
The caller (the shell, `daemon/filetask.py`, or the simulator in `tests/sim/`) runs this loop, one
event at a time, never two at once for the same file:

    plan = machine.reads_for(event)         # which bytes of the file the decision needs
    snap = <stat + those bytes, read through one descriptor>
    effects = machine.handle(event, snap, now, wall)
    <carry out each effect in order; an effect with a result (Append, Sync, Rehash, Archive,
     FindLine) is answered at once with its completion event, handled the same way>

so the machine always decides on bytes read for that very decision, and nothing else happens
to its state between an effect and its completion. `deadline()` says when it wants a Tick.

State: a ledger (size and prefix digests of the history we hold), the (dev, inode) it
describes, what every peer announced, and a mode:

    LOADING     start-up: the record is checked against the file (rehashed if it changed)
    UNREADABLE  the file cannot be read at all; a reload is tried every few seconds
    LIVE        replicating: local growth is shipped, a peer's bytes that extend ours appended
                (from every peer but those whose copies diverged from ours: see below)
    FROZEN      a local reason: a reset (our file was deleted, replaced or truncated), a write
                on a `replica`, another process writing while we append: nothing is written or
                sent for it; it still answers requests with refusals and probes
    ADOPTING    an operator chose another host's copy: ours is archived, theirs is fetched

    LOADING -> LIVE | FROZEN | UNREADABLE      UNREADABLE -> LOADING
    LIVE -> FROZEN | ADOPTING                  FROZEN -> LIVE | ADOPTING
    ADOPTING -> LIVE | FROZEN

A LIVE file may also have troubles, each kept until it clears: `paused` (the disk refuses our
appends; retried every PAUSE_RETRY) and `failing` (a look at the file or a sync failed,
EMFILE, EIO; retried with backoff). Either shows in status instead of in_sync.

The rule, for local and remote bytes alike, lives in `reconcile`: bytes are appended only at
our end and only after a prefix whose digest equals ours; `judge_local` says whether our
recorded history is still a prefix of the file. Three predicates gate the rest:
`may_accept(peer)`, `may_ship()`, `may_serve(force)`.

A divergence is per peer (`diverged`): a copy that differs from ours inside the common prefix
isolates that peer only. Nothing is taken from it or fetched from it, its requests are refused
(an adopting peer's forced requests excepted), and we say in our announcement that we know;
with every other peer the file stays LIVE. One listed host with another history (a compromised
one, a stale one, the other side of a split brain) therefore stops nothing between the rest.
It clears when the peer announces a copy consistent with ours past the point where they
parted (it adopted ours, or we adopted its), by `forget`, or by an adoption here.
Layout
------
    machine.py    FileMachine: dispatch of every event, and the decisions the pieces share
    state.py      the record types (Mode, Tuning, LogPeer, Fetch, Trouble, Adoption, ...)
    loading.py    start-up verdicts: the record against the file, a start-up rehash
    localfile.py  the writer's file: records held back, pieces, appends of ours cut short
    serving.py    answering peers: what a request or a probe reads, and the frames it gets
    locating.py   where two copies part (Locator: probes, refusals, retries per peer)
    peers.py      peer bookkeeping: announcements, readiness times, fetch candidates, status
    adoption.py   adoption: may it start, superseding, when it is done, the answers
"""

from syncd.core.filemachine.machine import FileMachine
from syncd.core.filemachine.state import (
    ANNOUNCE_GAP,
    HOLD_BACK_MAX,
    LOCATE_RETRY,
    LOOK_RETRY_MAX,
    LOOK_RETRY_MIN,
    OWN_REMOVAL_WINDOW,
    PAGE,
    PAUSE_RETRY,
    RELOAD_RETRY,
    SETTLE,
    STAT_ONLY,
    TRANSITIONS,
    Adoption,
    Fetch,
    LogPeer,
    Mode,
    Settle,
    Trouble,
    Tuning,
    Unsettled,
    effects_of_kind,
)

__all__ = [
    "ANNOUNCE_GAP", "HOLD_BACK_MAX", "LOCATE_RETRY", "LOOK_RETRY_MAX", "LOOK_RETRY_MIN",
    "OWN_REMOVAL_WINDOW", "PAGE", "PAUSE_RETRY", "RELOAD_RETRY", "SETTLE", "STAT_ONLY",
    "TRANSITIONS", "Adoption", "Fetch", "FileMachine", "LogPeer", "Mode", "Settle", "Trouble",
    "Tuning", "Unsettled", "effects_of_kind",
]
