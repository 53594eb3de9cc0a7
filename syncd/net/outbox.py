"""Batching: items queued during one turn of the event loop leave as one frame per topic.

A write on the writer's host produces a live item per file it touched; a catch-up produces
many fill items for one peer. Sending each as its own MQTT message pays the message, the
signature and the receiver's wake-up per item; queueing them until the loop has run every
ready callback, then sending one frame per topic, pays them once per batch without holding
anything back (the flush is scheduled with `call_soon`, not a timer).

A batch stops at `limit` bytes (chunk_bytes: brokers cap message sizes, NATS at 1 MiB by
default, and check-config probes that one) or frames.MAX_ITEMS items; a single item larger
than that travels alone. Order is kept per topic,
and `flush()` sends everything queued at once (a retained position must not overtake the
bytes it announces).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from syncd.core import frames
from syncd.core.groupcommit import cut


class Outbox:
    def __init__(self, publish: Callable[[str, str, tuple[frames.Item, ...]], None],
                 limit: int) -> None:
        self._publish = publish  # (topic, addressee or "", items)
        self.limit = limit
        self._queued: dict[str, tuple[str, list[frames.Item]]] = {}
        self._scheduled = False
        # Found at the first item: asyncio's lookup costs a getpid(2) (its fork check).
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, topic: str, to: str, item: frames.Item) -> None:
        queued = self._queued.get(topic)
        if queued is None:
            self._queued[topic] = (to, [item])
        else:
            queued[1].append(item)
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        queued, self._queued = self._queued, {}
        for topic, (to, items) in queued.items():
            for batch in batches(items, self.limit):
                self._publish(topic, to, batch)


def batches(items: list[frames.Item], limit: int) -> list[tuple[frames.Item, ...]]:
    """Consecutive runs of `items` within the batch limits, in order."""
    if len(items) == 1:
        return [(items[0],)]
    return [tuple(items[r.start:r.stop])
            for r in cut([i.size for i in items], limit, frames.MAX_ITEMS)]
