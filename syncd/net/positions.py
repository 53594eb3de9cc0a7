"""How this host's position announcements leave (the event loop's side of core/retained.py).

Every announcement goes to the peers online in the batch for everyone (`P/a/<node>`). Routine
ones are not on the data path: held POSITION_TICK, one frame (one signature, one verification
on each peer) carries those of every busy file, not one per file and write. A freeze, a
divergence or an answer to an adopting peer goes at once, and drops the older one held back
for that file, which must not follow it (a later frame's position counts as the newer one).

The retained copy per file (`P/p/<node>/<key>/<file>`) is for hosts that connect later: paced
by RetainPacer, published when due.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from syncd.core import frames
from syncd.core.frames import Kind
from syncd.core.retained import RetainPacer

POSITION_TICK = 0.05  # seconds routine positions wait to share a frame

Where = tuple[str, str]  # (key, file)


class PositionSender:
    def __init__(self, batch: Callable[[frames.Item], None],
                 retain: Callable[[str, str, frames.Item], None]) -> None:
        self._batch = batch  # queue an item in the batch for everyone
        self._retain = retain  # publish one file's position retained, now
        self._pacer = RetainPacer()
        self._held: dict[Where, frames.Item] = {}  # routine, not sent yet
        self._held_timer: asyncio.TimerHandle | None = None
        self._retain_timer: asyncio.TimerHandle | None = None

    def announce(self, key: str, file: str, item: frames.Item) -> None:
        ann = item.payload
        assert isinstance(ann, frames.Announce)
        if ann.frozen or ann.diverged or ann.answers:
            self._held.pop((key, file), None)
            self._batch(item)
        else:
            self._held[(key, file)] = item
            if self._held_timer is None:
                self._held_timer = asyncio.get_running_loop().call_later(
                    POSITION_TICK, self._release_held)
        if self._pacer.offer((key, file), ann, time.monotonic()):
            self._retain(key, file, item)
        else:
            self._retain_later()

    def release_held(self) -> None:
        """Send the routine positions held back, now: a restatement of every position must
        not be followed by an older one of the same file."""
        if self._held_timer is not None:
            self._held_timer.cancel()
        self._release_held()

    def retain_everything(self) -> None:
        """A peer has just come online (and read our retained positions): every one held
        back goes now."""
        self._retain_due(everything=True)

    def announce_everything(self) -> None:
        """A peer has just come online: every file's newest position goes in the batch too.
        The broker hands it our retained ones, one MQTT message per file, and drops those
        past its queue (Mosquitto: max_queued_messages, 1000 by default): a new host would
        never hear of the idle files past it. The batch carries hundreds per message. (An
        answer to an adopting peer is not repeated: it was meant for that moment.)"""
        for (key, file), ann in self._pacer.latest():
            if not ann.answers and (key, file) not in self._held:
                self._held[(key, file)] = frames.Item(Kind.POS, ann, key, file)
        if self._held and self._held_timer is None:
            self._held_timer = asyncio.get_running_loop().call_later(
                POSITION_TICK, self._release_held)

    def drop(self, key: str, file: str) -> None:
        """A file no longer replicated here: none of its positions is sent any more."""
        self._held.pop((key, file), None)
        self._pacer.drop((key, file))

    def forget(self) -> None:
        """A new broker connection (it may have lost our retained positions): every file's
        next announcement is retained at once."""
        self._pacer.forget()

    def _release_held(self) -> None:
        self._held_timer = None
        held, self._held = self._held, {}
        for item in held.values():
            self._batch(item)

    def _retain_later(self) -> None:
        due = self._pacer.next_due()
        if due is None or (self._retain_timer is not None
                           and self._retain_timer.when() <= due + 0.01):
            return
        if self._retain_timer is not None:
            self._retain_timer.cancel()
        loop = asyncio.get_running_loop()
        self._retain_timer = loop.call_at(loop.time() + max(0.0, due - time.monotonic()),
                                          self._retain_due)

    def _retain_due(self, everything: bool = False) -> None:
        if self._retain_timer is not None:
            self._retain_timer.cancel()
        self._retain_timer = None
        for (key, file), ann in self._pacer.due(time.monotonic(), everything):
            self._retain(key, file, frames.Item(Kind.POS, ann, key, file))
        self._retain_later()
