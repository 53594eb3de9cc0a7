"""Free space under the roots and state_dir: below `[limits] min_free_bytes`, no peer's bytes
are written there (filetask.py, resourcehub.py) and no key is made on a peer's word; the
local writer keeps the rest (docs/peer-limits.md)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("syncd.node")

FREE_SPACE_EVERY = 1.0  # seconds between two looks at the free space of each filesystem


class FreeSpace:
    def __init__(self, state_dir: Path,
                 statvfs: Callable[[Path], os.statvfs_result] = os.statvfs) -> None:
        self.state_dir = state_dir
        self._statvfs = statvfs
        self.low: dict[str, int] = {}  # filesystems below min_free_bytes: path -> free
        self.low_since: float | None = None  # wall time remote growth stopped
        self._looked_at = -1e18  # monotonic time of the last look

    def look_soon(self) -> None:
        """Look at the next check whenever it comes (a reload may have moved the floor)."""
        self._looked_at = -1e18

    def check(self, places: Iterable[Path], floor: int) -> None:
        """statvfs of each of `places` and of state_dir, at most once a FREE_SPACE_EVERY; logs
        when remote growth stops and resumes."""
        now = time.monotonic()
        if now - self._looked_at < FREE_SPACE_EVERY:
            return
        self._looked_at = now
        low: dict[str, int] = {}
        if floor > 0:
            for path in {*places, self.state_dir}:
                try:
                    st = self._statvfs(path)
                except OSError:
                    continue  # a root that is not there yet: discovery says so
                free = st.f_bavail * st.f_frsize
                if free < floor:
                    low[str(path)] = free
        if bool(low) != bool(self.low):
            if low:
                self.low_since = time.time()
                log.error("remote growth stopped: free space %s below [limits] "
                          "min_free_bytes (%d bytes); no peer's bytes are written here until "
                          "there is more (the local writer keeps the rest)",
                          ", ".join(f"on {p} is {n} bytes" for p, n in sorted(low.items())),
                          floor)
            else:
                log.warning("remote growth resumed: free space is above [limits] "
                            "min_free_bytes (%d bytes) again", floor)
                self.low_since = None
        self.low = low

    def problem(self, root: Callable[[], Path | None], floor: int) -> str | None:
        """Why no peer's bytes may be written under `root()` now (None: they may); `root` is
        asked only while some filesystem is low (None: the key has no root)."""
        if not self.low:
            return None
        state = self.low.get(str(self.state_dir))
        if state is not None:
            return (f"free space in state_dir is {state} bytes, below [limits] "
                    f"min_free_bytes ({floor})")
        where = root()
        if where is None:
            return None
        for path, free in self.low.items():
            if where.is_relative_to(path):
                return (f"free space on {path} is {free} bytes, below [limits] "
                        f"min_free_bytes ({floor})")
        return None

    def status(self, floor: int) -> dict[str, Any]:
        """Status `peer_limits.remote_growth`."""
        return {"stopped": bool(self.low), "since": self.low_since,
                "low": dict(sorted(self.low.items())), "min_free_bytes": floor}
