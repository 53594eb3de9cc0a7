"""Local changes, found: the watcher's hints routed to the file task of their path (or to
discovery, or to the resources), and the periodic sweep, the safety net under the watcher."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from syncd.config import Config
from syncd.core.roots import MAX_DEPTH
from syncd.daemon.filetask import FileTask
from syncd.daemon.instances import Instances
from syncd.daemon.resourcehub import ResourceHub
from syncd.disk.watcher import Watcher

FULL_SWEEP = 10  # every how many rounds of the sweep the machines' deadlines are checked too
SWEEP_FILES = 100  # files stat'ed per sweep while the watcher is on (see Sweep.forever)
# With the watcher on, the directory scan of discovery (also a safety net: new instance
# directories are hinted at once) runs every DISCOVER_EVERY-th sweep only.
DISCOVER_EVERY = 5


class SweepHost(Protocol):
    config: Config
    resources: ResourceHub

    def each_sweep(self) -> None:
        """What the host does on every sweep before the files (free space)."""

    def after_sweep(self) -> None:
        """What the host does on every sweep after the files (keep the peers' runs)."""


class Sweep:
    def __init__(self, host: SweepHost, instances: Instances) -> None:
        self.host = host
        self.instances = instances
        self.watcher: Watcher | None = None  # given once made (it calls hint and overflow)

    def hint(self, path: str, gone: bool = False) -> None:
        """The watcher saw `path` change (`gone`: deleted or moved away)."""
        instances = self.instances
        found = instances.by_path.get(path) if not gone else None
        if found is not None:  # the usual case, a file grew: no path arithmetic
            found.changed()
            return
        config = self.host.config
        roots = config.roots
        place = roots.place(Path(path))
        if place is None:
            return
        if place.root is None or not place.parts:
            instances.discover_soon()  # at or above a root: a root may have come or gone
            return
        root, parts = place.root, place.parts
        if len(parts) >= 2:
            found = instances.tasks.get((roots.key_of(root, parts[:-1]), parts[-1]))
            if found is not None:
                if gone:
                    found.hint_local(replaced=True)
                else:
                    found.changed()
                return
        for depth in range(1, min(len(parts), MAX_DEPTH) + 1):
            if root.path.joinpath(*parts[:depth]) in instances.scanner.leaves:
                if depth == len(parts):  # an instance's directory itself (moved, deleted)
                    # Its own files, looked up by key: a standby that creates thousands of
                    # instances hears of each directory, and scanning every file task for
                    # each one stalled the loop for 20 s at 3000 keys.
                    key = roots.key_of(root, parts)
                    for file in config.files_of(key):
                        if (r := instances.tasks.get((key, file))) is not None:
                            r.hint_local(replaced=gone)
                else:
                    self.host.resources.hint(roots.key_of(root, parts[:depth]), path)
                return  # inside an instance: resources/, workspace/, ... are no instances
        if len(parts) > MAX_DEPTH + 1:
            return  # below the depth where instances are looked for
        if gone:
            self._below(root.path.joinpath(*parts), gone)
        instances.discover_soon()

    def overflow(self) -> None:
        """The kernel dropped events: look at everything, as a sweep would, now."""
        self.instances.discover_soon()
        for r in self.instances.tasks.values():
            r.hint_local()
        self.host.resources.look_everywhere()

    def _below(self, folder: Path, gone: bool) -> None:
        """A directory moved or deleted: look again at every file task below it."""
        for r in self.instances.tasks.values():
            if r.path.is_relative_to(folder):
                r.hint_local(replaced=gone)

    async def forever(self) -> None:
        """The safety net under the watcher: inotify can merge or drop events.

        Discovery looks at every directory above the instances on each sweep (one stat each,
        see disk/discovery.py). Files: with `watch = false` the sweep is all there is, and every
        file is stat'ed on each sweep; with the watcher on, each sweep stats the next
        SWEEP_FILES files only, so that thousands of idle files cost a bounded amount of CPU
        (a change the watcher missed is found within ceil(files / SWEEP_FILES) sweeps). Each
        machine's deadline is checked on every FULL_SWEEP-th round only: the file task's own
        timer is what ticks it (see FileTask.sweep)."""
        # The list of a round is made once per round: even listing a thousand idle file tasks
        # every second showed in an idle daemon's profile (cold objects, a cache miss each).
        tasks: list[FileTask] = []
        cursor, rounds, sweeps = 0, 0, 0
        host = self.host
        while True:
            await asyncio.sleep(host.config.sweep_interval)
            host.each_sweep()
            watch = host.config.watch
            sweeps += 1
            if not watch or sweeps % DISCOVER_EVERY == 0:
                if watch:
                    assert self.watcher is not None
                    self.watcher.rewatch()
                self.instances.discover()
            if cursor == 0:
                tasks = list(self.instances.tasks.values())
            if not watch or len(tasks) <= SWEEP_FILES:
                batch, cursor = tasks, len(tasks)
            else:
                batch = tasks[cursor:cursor + SWEEP_FILES]
                cursor += len(batch)
            full = rounds % FULL_SWEEP == 0
            for r in batch:
                if r.running:
                    r.sweep(full)
            if cursor >= len(tasks):
                cursor = 0
                rounds += 1
            host.resources.sweep()
            host.after_sweep()
