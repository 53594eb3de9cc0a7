"""Python's cyclic garbage collector, set for a daemon whose start-up leaves a large heap.

CPython collects its youngest generation every GEN0_DEFAULT (700) container allocations net
of frees, and the whole heap whenever enough objects have survived into the oldest one. A
replicated frame allocates a few hundred containers (events, effects, items, a header's
dicts), nearly all freed by reference counting at once, so at 500 frames a second the
collector ran hundreds of times a second over what had just been allocated, and now and
then over everything: the config, the modules, every file's machine and ledger, tens of
thousands of objects walked on the loop while a frame waited.

settle() is called once the start-up is over (every file loaded): a collection, then
gc.freeze(), which moves every object alive then out of the collector's sight for good (they
are the daemon's long-lived state; freezing never frees nor keeps anything that reference
counting would free). Later collections walk only what was allocated since. And the youngest
generation is collected every GEN0 allocations instead of 700: one collection for dozens of
frames, each over objects nearly all gone already.
"""

from __future__ import annotations

import gc

GEN0 = 20_000  # container allocations (net of frees) between two young collections


def tune() -> None:
    """A higher threshold for the youngest generation (the older two as CPython's)."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0, gen1, gen2)


def settle() -> None:
    """The start-up's objects out of the collector's sight (after a collection, so that no
    garbage of the start-up is frozen with them)."""
    gc.collect()
    gc.freeze()
