"""Catch-up of an instance's resources/: host a holds the files, host b starts empty.

    python3 bench/bench_resources.py [--big 6] [--small 1000]

Real daemons and a real Mosquitto on loopback (tests/support/cluster.py). Two runs: `--big` blobs of
16 MiB (chunked transfers, one at a time), and `--small` blobs of 2 KiB (many at once); each
blob has a sidecar, written the Ishiki way (temp file, rename). The time runs from b's start
(its connection included) until b holds every file and fetches nothing more.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.ishiki_writer import sidecar, write_atomic


def run(label: str, files: list[tuple[str, bytes]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-resources-"))
    broker = Broker(root / "broker")
    broker.start()
    a = Daemon(root, "a", broker, log_level="info")
    b = Daemon(root, "b", broker, log_level="info")
    instance = a.runtimes / "bot-1"
    instance.mkdir(parents=True)
    (instance / "events.jsonl").write_bytes(b'{"id":"1","type":"state","data":{}}\n')
    total = 0
    for name, data in files:
        write_atomic(instance / "resources" / name, data)
        sidecar(instance / "resources" / name, size=len(data))
        total += len(data)
    want = 2 * len(files)
    try:
        a.start()
        wait_until(lambda: any(r["files"] >= want for r in a.status()["resources"]), 120,
                   "a to hash its files")
        t0 = time.monotonic()
        b.start(wait=False)
        wait_until(lambda: any(r["files"] >= want and not r["fetching"]
                               for r in b.status()["resources"]), 600, "b to hold every file",
                   interval=0.05)
        took = time.monotonic() - t0
    finally:
        a.kill()
        b.kill()
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{label}: {len(files)} blobs + sidecars, {total / 2**20:.1f} MiB in {took:.2f} s: "
          f"{total / 2**20 / took:.1f} MiB/s, {want / took:.0f} files/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=int, default=6)
    parser.add_argument("--small", type=int, default=1000)
    args = parser.parse_args()
    run("big", [(f"artifacts/compact/c-{i}.log", os.urandom(16 << 20)) for i in range(args.big)])
    run("small", [(f"artifacts/tool/out-{i}", os.urandom(2048)) for i in range(args.small)])


if __name__ == "__main__":
    main()
