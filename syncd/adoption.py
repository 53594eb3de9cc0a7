"""Resolution: an operator decides which copy wins (`syncd adopt KEY --from NODE`).

On the host whose copy loses, the local copy is moved into the archive (never deleted), the
file starts again from nothing, and the winner's whole copy is fetched and checked against the
digest the winner announces. Adopting from this host itself keeps the local copy as it is now
(after a deliberate reset, say); peers holding another history then show the divergence until
they adopt it in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from syncd import store
from syncd.archive import archive_copy
from syncd.ledger import Ledger
from syncd.reconcile import PeerState

if TYPE_CHECKING:
    from syncd.replica import Replica

log = logging.getLogger("syncd.replica")


@dataclass
class Adoption:
    """An adoption under way: our copy was archived; take `peer`'s whole copy."""

    peer: str
    done: asyncio.Future[dict[str, object]]
    archive: Path


async def adopt(r: Replica, source: str, done: asyncio.Future[dict[str, object]]) -> None:
    """Archive our copy, start from nothing, and take `source`'s whole copy."""
    if r._unsynced:
        await r._make_durable()
    if source == r.host.node:
        await keep_local(r, done)
        return
    r._own_move_until = time.monotonic() + 5.0
    reasons = [f.detail for f in ([r.freeze] if r.freeze else [])]
    reasons += [f"diverged from {n}: {f.detail}" for n, f in r.diverged.items()]
    archive = await asyncio.to_thread(
        archive_copy,
        r.host.state_dir,
        r.host.node,
        r.key,
        r.file,
        r.path,
        {"reason": "; ".join(reasons) or "operator adopted another copy", "adopted_from": source},
    )
    log.warning("%s: operator adopts %s's copy; ours is archived at %s", r.name, source, archive)
    r.ledger = Ledger()
    r.freeze, r.diverged, r.note = None, {}, None
    r._replaced = False
    r._locating.clear()
    r.fetch = None
    r._adopt_stat(None)
    for view in r.peers.values():
        view.verified, view.probed, view.state = False, False, PeerState.AHEAD
    r.host.records.forget_chain(r.key, r.file)
    r.record_dirty = True
    r.persist(force=True)
    r.adopting = Adoption(source, done, archive)
    r.verifier.restart()
    r.announce(now=True)
    check_done(r)
    r._maybe_fetch()


async def keep_local(r: Replica, done: asyncio.Future[dict[str, object]]) -> None:
    """The operator keeps this host's copy as it is now (e.g. after a deliberate clear())."""
    st = store.stat(r.path)
    r.ledger = await asyncio.to_thread(store.hash_file, r.path) if st else Ledger()
    r.host.records.forget_chain(r.key, r.file)
    r.freeze, r.diverged, r.note = None, {}, None
    r._locating.clear()
    r._adopt_stat(st)
    for view in r.peers.values():
        view.verified, view.probed = False, False
    r.record_dirty = True
    r.persist(force=True)
    log.warning(
        "%s: operator keeps the local copy (%d bytes); replication resumes from it",
        r.name,
        r.position.size,
    )
    r.verifier.restart()
    r._verify_follow()
    r.announce(now=True)
    for sender, v in r.peers.items():
        r._assess(sender, v)
    done.set_result({"file": r.file, "archive": None, "size": r.position.size})


def check_done(r: Replica) -> None:
    """Done when our copy equals what the source announces (verified by digest)."""
    a = r.adopting
    if a is None:
        return
    view = r.peers.get(a.peer)
    if view is None or view.position != r.position or r._unsynced:
        return
    r.adopting = None
    log.info("%s: now identical to %s's copy (%d bytes)", r.name, a.peer, r.position.size)
    if not a.done.done():
        a.done.set_result({"file": r.file, "archive": str(a.archive), "size": r.position.size})
    for sender, v in r.peers.items():
        r._assess(sender, v)


def progress(r: Replica) -> tuple[int, int]:
    a = r.adopting
    view = r.peers.get(a.peer) if a else None
    return r.position.size, view.position.size if view else 0
