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

The thresholds stay CPython's: the young collections left at 500 writes/s (once paho's
per-message reference cycle is gone, net/pahoio.py: one every 1.5-2 s, 0.1-0.2 ms each) cost
nothing worth trading, and a higher threshold would make each one walk more at once.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """The start-up's objects out of the collector's sight (after a collection, so that no
    garbage of the start-up is frozen with them)."""
    gc.collect()
    gc.freeze()
