"""The log check of one line too long to hold in the daemon (logcheck.py, `hold`).

Run as `python -m syncd.daemon.longline START LENGTH TOP [PART ...]` with the checker's saved
state on standard input: reads bytes [START, START + LENGTH) of the file (the line, without its
newline), reached from TOP one component at a time as the daemon reaches it (disk/tree.py; a
plain path when no PART follows), checks it with exactly the rules every line gets, and writes
the checker's new state to standard output. In a process of its own, because parsing a
200 MiB line costs a few hundred MB and about a second of CPU under the GIL: the daemon's
memory stays bounded and its event loop goes on meanwhile (logfollow.py waits for this
process without blocking).
"""

from __future__ import annotations

import sys
from pathlib import Path

from syncd.core.logcheck import LogChecker
from syncd.core.spot import Spot
from syncd.disk import logfile


def where_args(where: logfile.Where) -> list[str]:
    """The command line's TOP [PART ...] for `where`."""
    if isinstance(where, Spot):
        return [str(where.top), *where.parts]
    return [str(where)]


def check(path: logfile.Where, start: int, length: int, state: bytes) -> bytes:
    checker = LogChecker.from_state(state)
    if checker.unread_line != (start, length):
        raise ValueError(f"the state waits for {checker.unread_line}, not ({start}, {length})")
    line = logfile.read_range(path, start, start + length + 1)
    if len(line) != length + 1 or not line.endswith(b"\n"):
        raise ValueError(f"{path} no longer holds that line at {start} (history replaced?)")
    checker.resume_with(line[:-1])
    return checker.to_state()


def main() -> int:
    try:
        start, length, top, parts = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
        where: logfile.Where = Spot(Path(top), tuple(parts)) if parts else Path(top)
        out = check(where, start, length, sys.stdin.buffer.read())
    except (IndexError, ValueError, OSError, MemoryError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
