"""This host's run counter (`epoch`): persisted in state_dir, increased at every start.

Peers order this host's sessions by it (core/freshness.py), so it must never go backwards: it is
written durably before anything is sent. It is also at least the current Unix time in
seconds, so that a host whose state_dir was lost (rebuilt from scratch) still starts a run
newer than the ones its peers remember, as long as its clock is not behind; a clock that was
fast once cannot make it go backwards later, since the stored value is always counted up.
"""

from __future__ import annotations

import time
from pathlib import Path

from syncd.disk import durable

FILE_NAME = "epoch"


def next_epoch(state_dir: Path, now: float | None = None) -> int:
    path = state_dir / FILE_NAME
    try:
        last = int(path.read_text().strip() or "0")
    except FileNotFoundError:
        last = 0
    except ValueError:
        raise ValueError(f"{path} does not hold a number; remove it to start a new count") \
            from None
    epoch = max(last + 1, int(time.time() if now is None else now))
    durable.replace_file(path, f"{epoch}\n".encode())  # file, rename, then its directory
    return epoch
