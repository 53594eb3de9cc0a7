"""`syncd demo`: the first thing a newcomer runs must work with nothing else installed, and
tell the story: failover with nothing lost, failback, a fork refused and resolved."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


def test_demo_tells_the_story(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    # No broker on this machine is needed: the demo brings its own (a clean PATH proves it).
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    run = subprocess.run([sys.executable, "-m", "syncd", "demo", "--seconds", "2", "--dir",
                          str(root)], capture_output=True, text=True, timeout=60, env=env)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    # The steps, in order, each as it happened.
    story = [
        r"host-a and host-b run syncd; the bot writes bot-1's memory on host-a",
        r"host-a wrote \d+ turns \(\d+ lines\); host-b holds them all",
        r"host-a dies \(syncd killed with kill -9, its bot stops\)",
        r"host-b: bot-1 READY to take over \(in_sync, \d+ bytes, log checks clean, host-a "
        r"offline\)",
        r"the bot moves to host-b and writes there",
        r"host-a returns and fast-forwards: \+\d+ bytes from host-b in [\d.]+s, identical "
        r"again \(host-a in_sync\)",
        r"split brain: the bot now runs on host-a AND host-b, both write at once",
        r"fork REFUSED on both hosts: nothing of bot-1 moves between them, nothing is "
        r"overwritten; the copies part at byte \d+, line \d+:\n +host-a: \{.*\n +host-b: \{",
        r"on host-a: syncd adopt bot-1 --from host-b --yes\n +bot-1/events.jsonl: local copy "
        r"archived at \S+; now identical to host-b's copy",
        r"resolved: host-a's losing copy is archived, both hosts in_sync again",
        r"  bot-1/events.jsonl: identical on host-a and host-b \(\d+ lines",
    ]
    at = 0
    for step in story:
        found = re.compile(step).search(out, at)
        assert found, f"missing, or out of order: {step}\n{out}"
        at = found.end()
    copies = [(root / n / "runtimes" / "bot-1" / "events.jsonl").read_bytes()
              for n in ("host-a", "host-b")]
    assert copies[0] and copies[0] == copies[1]
    # The loser's copy is archived, not lost: it holds the line the winner refused.
    [manifest] = (root / "host-a" / "state" / "archive" / "bot-1").glob("*.manifest.json")
    loser = Path(str(manifest).removesuffix(".manifest.json")).read_bytes()
    shared = next(i for i, (x, y) in enumerate(zip(loser, copies[0], strict=False)) if x != y)
    assert 0 < shared < len(loser)
    assert json.loads(manifest.read_text())["adopted_from"] == "host-b"
    assert re.search(r"bot-1\s+events.jsonl\s+[\d.]+ KiB\s+in_sync\s+yes", out), out
    assert f"the files stay in {root}" in out


def test_demo_refuses_a_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("")
    run = subprocess.run([sys.executable, "-m", "syncd", "demo", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "is not empty" in run.stderr
