"""Python's cyclic garbage collector, told what the start-up leaves for good.

CPython collects its oldest generation, the whole heap, whenever the objects that survived
into it since the last such collection pass a quarter of those it held then. A daemon's heap
after start-up is mostly for good (modules, the config, every file's machine and ledger:
~40 000 objects at one busy key), and a full collection walks all of it, on the loop, while
frames wait: 27-35 ms on a standby at 500 writes/s on the shared 2-core machine, once in a
10-second run (measured with gc.callbacks, docs/protocol.md "What a frame costs").

settle() is called once the start-up is over (every file loaded): a collection, then
gc.freeze(), which moves every object alive then into a generation the collector never walks
(freezing frees nothing and keeps nothing that reference counting would free; only a cycle
among those objects that becomes garbage later stays). Later full collections walk what was
allocated since.

The young thresholds stay CPython's: the young collections left at 500 writes/s (once paho's
per-message reference cycle is gone, net/pahoio.py: one every 1.5-2 s, 0.1-0.2 ms each) cost
nothing worth trading, and a higher threshold would make each one walk more at once.

The full collection waits for FULL_EVERY middle ones, not CPython's 10. At 3000 busy keys
(docs/busy-keys.md, "Round 3") what a write leaves alive for a second or more (each file's
Stat and position; under a backlog, the events and frames queued behind it) outlives the
young collections, and the oldest generation fills again: two full collections in one 14-s
run on each host, 40-60 ms each on the loop, that found 6 (writer) and 38 (standby) objects
of garbage. Ten times fewer: one such pause where there were ten; what a full collection
would free and a young one did not (a cycle that lived long first) waits ten times longer,
and CPython's own rule still holds (not before a quarter of the oldest generation is new).
"""

from __future__ import annotations

import gc

FULL_EVERY = 100  # middle-generation collections before a full one (CPython: 10)


def settle() -> None:
    """The start-up's objects out of the collector's sight (after a collection, so that no
    garbage of the start-up is frozen with them); full collections FULL_EVERY middle ones."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
