"""Adoption: an operator chose a copy (another host's, or this one's as it is) to replace
ours. These decide whether a request may start, how a second request supersedes the one under
way, when an adoption is done, and what the operator is answered. The machine archives,
fetches and checks; its `adoption` (an `Adoption`) is the state of the one under way."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from syncd.core import shellwords
from syncd.core.events import AdoptDone, Effect, Log
from syncd.core.filemachine.state import Adoption, LogPeer
from syncd.core.ledger import Position
from syncd.core.records import Freeze


def refusal(name: str, key: str, node: str, source: str, view: LogPeer | None) -> str | None:
    """Why adopting `source`'s copy (as `view` shows it) cannot start (None: it can)."""
    if source != node and view is not None and view.frozen == "reset":
        return (f"{source}'s copy of {name} is reset (its file was cleared or replaced): "
                f"it holds nothing it can vouch for. On {source}, keep its new copy first "
                f"({shellwords.command('syncd', 'adopt', key, '--from', source)}), "
                "then adopt it here")
    return None


def supersede(ad: Adoption, source: str, ticket: object, wall: float, name: str,
              same_source: bool) -> tuple[Adoption | None, list[Effect]]:
    """A request while adoption `ad` is under way (an operator asking again after a stalled
    `syncd adopt`, or a second one): the earlier request is answered, never left waiting.
    The same source (`same_source`: and we are still adopting it) goes on with the copy taken
    so far, done only on an answer to this request: that adoption is returned. Another source
    starts over (None: the partial copy is archived)."""
    why = ("a later request for the same copy takes it over" if same_source
           else f"the operator now adopts {source}'s copy instead of {ad.peer}'s")
    out: list[Effect] = [
        AdoptDone(ad.ticket, {"error": f"superseded: {why}"}),
        Log(logging.WARNING, f"{name}: adoption of {ad.peer}'s copy superseded: {why}"),
    ]
    if not same_source:
        return None, out
    # Done only when our copy equals what the source held after this request.
    ad.ticket, ad.fresh = ticket, None
    ad.ask = max(ad.ask + 1, first_ask(wall))
    return ad, out


def first_ask(wall: float) -> int:
    """The `ask` of a new adoption's requests: larger than any earlier one of this file's."""
    return max(1, int(wall * 1000))


def archive_reason(freeze: Freeze | None, diverged: Mapping[str, Freeze],
                   source: str) -> dict[str, Any]:
    """What the archive of our copy says about why it was set aside."""
    reasons = [f.detail for f in ([freeze] if freeze else [])]
    reasons += [f"diverged from {n}: {f.detail}" for n, f in diverged.items()]
    return {"reason": "; ".join(reasons) or "operator adopted another copy",
            "adopted_from": source}


def answered(ad: Adoption | None, peer: str, answers: int) -> bool:
    """Whether an announcement of `peer` answers our latest request (so comes after it)."""
    return ad is not None and ad.peer == peer and bool(ad.ask) and answers == ad.ask


def done(ad: Adoption, position: Position) -> bool:
    """Done when our durable copy equals a position the source announced after we asked."""
    return ad.fresh is not None and ad.fresh == position


def asks_again(ad: Adoption, position: Position, online: bool) -> bool:
    """We hold as much as the source announced, but no answer to our asking describes our
    copy (its history moved under us, an answer was lost): ask again until one does."""
    return bool(ad.ask) and ad.fresh != position and online


def finished(ticket: object, file: str, archive: str | None, size: int) -> AdoptDone:
    """The operator's answer: done, our copy (`size` bytes) is the one chosen."""
    return AdoptDone(ticket, {"file": file, "archive": archive, "size": size})


def progress(ad: Adoption | None, size: int, peers: Mapping[str, LogPeer]) -> tuple[int, int]:
    """(bytes we hold, bytes the source announced) of the adoption under way."""
    view = peers.get(ad.peer) if ad else None
    return size, view.position.size if view else 0
