"""Cost of the status page and its JSON for fleets of many files (statuspage.page, pure).

    python -m bench.bench_statuspage [--files 100,1000,5000] [--peers 2] [--rounds 5]

Prints, per number of files, the milliseconds to render the page and the JSON from one status
document and their sizes. The HTTP listener makes each at most once per snapshot, and takes a
snapshot at most once a second (metrics.SnapshotCache), so this is the most a page left open
costs the daemon's HTTP thread per second, whatever the number of browsers.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from syncd.ops import statuspage
from syncd.ops.metrics import status_json

NOW = 1_800_000_000.0


def document(files: int, peers: int) -> dict[str, Any]:
    names = [f"host-{i}" for i in range(peers)]
    out = []
    for i in range(files):
        diverged = i % 100 == 0
        out.append({
            "key": f"profile{i % 7}/channel_{i}", "file": "events.jsonl", "size": 1 << 20,
            "state": "diverged" if diverged else "in_sync", "ready": not diverged,
            "not_ready": ["diverged from host-0 since ...: the copies differ"] if diverged
            else [], "notes": [], "freeze": None,
            "diverged": {"host-0": {"reason": "diverged", "since": NOW - 60, "peer": "host-0",
                                    "detail": "host-0 announced a copy whose prefix differs",
                                    "offset": 4096, "line": 12, "ours": '{"a": 1}' * 20,
                                    "theirs": '{"b": 2}' * 20}} if diverged else {},
            "peers": {n: {"size": (1 << 20) - (i % 3), "state": "in_sync", "frozen": None,
                          "diverged": [], "online": True, "lag_bytes": i % 3,
                          "lag_seconds": 0.1 * (i % 3)} for n in names},
        })
    return {"node": "host-a", "broker": "mqtt:8883", "brokers": ["mqtt:8883"],
            "connected": True, "connected_since": NOW - 3600, "uptime_s": 3600.0,
            "peers": {n: {"online": True, "since": NOW - 3600} for n in names},
            "files": out, "resources": [], "skipped": [], "peer_budgets": {},
            "broker_switches": 0, "queued_bytes": 0, "rejected_frames": 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", default="100,1000,5000")
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'files':>6} {'page ms':>9} {'page KiB':>9} {'json ms':>9} {'json KiB':>9}")
    for n in (int(x) for x in args.files.split(",")):
        doc = document(n, args.peers)
        start = time.perf_counter()
        for _ in range(args.rounds):
            page = statuspage.page(doc, NOW).encode()
        page_ms = (time.perf_counter() - start) / args.rounds * 1e3
        start = time.perf_counter()
        for _ in range(args.rounds):
            blob = status_json(doc, NOW)
        json_ms = (time.perf_counter() - start) / args.rounds * 1e3
        print(f"{n:>6} {page_ms:>9.1f} {len(page) / 1024:>9.0f} {json_ms:>9.1f} "
              f"{len(blob) / 1024:>9.0f}")


if __name__ == "__main__":
    main()
