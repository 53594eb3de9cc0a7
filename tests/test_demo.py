"""`syncd demo`: the first thing a newcomer runs must work with nothing else installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_the_copies_are_identical(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    # No broker on this machine is needed: the demo brings its own (a clean PATH proves it).
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    run = subprocess.run([sys.executable, "-m", "syncd", "demo", "--seconds", "2", "--dir",
                          str(root)], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    for key in ("bot-1", "bot-2"):
        assert re.search(rf"^  {key}/events.jsonl: identical on host-a and host-b \(\d+ lines",
                         run.stdout, re.M), run.stdout
        a = (root / "host-a" / "runtimes" / key / "events.jsonl").read_bytes()
        assert a and a == (root / "host-b" / "runtimes" / key / "events.jsonl").read_bytes()
    assert re.search(r"bot-1\s+events.jsonl\s+\d+\s+in_sync\s+yes", run.stdout), run.stdout
    assert f"the files stay in {root}" in run.stdout


def test_demo_refuses_a_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("")
    run = subprocess.run([sys.executable, "-m", "syncd", "demo", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "is not empty" in run.stderr
