"""bench/RESULTS.md's writer (bench/run_all.py): one run's figures, under its date and commit.

The benches themselves are not run here (minutes, real brokers): only the quickest, the cost
of a frame, for real; every other bench is replaced by a stub that checks its arguments
against the real function's signature, so a renamed or changed bench fails here, not after
ten minutes of a full run.
"""

from __future__ import annotations

import datetime
import inspect
import re
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import (
    bench_busy,
    bench_floor,
    bench_lsyncd,
    bench_replication,
    bench_scale,
    run_all,
)

REPO = Path(__file__).resolve().parents[2]
ARGV = ["python", "-m", "bench.run_all", "--results", "bench/RESULTS.md"]


class NotRun(Exception):
    pass


def stub(real: Callable[..., Any]) -> Callable[..., Any]:
    def called(*args: Any, **kwargs: Any) -> Any:
        inspect.signature(real).bind(*args, **kwargs)  # TypeError: run_all calls it wrongly
        raise NotRun(real.__name__)
    return called


def test_the_results_hold_one_run_under_its_date_and_commit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run_all, "wait_quiet", lambda threshold, wait: 0.0)
    for module, name in ((bench_replication, "lag"), (bench_replication, "catchup"),
                         (bench_lsyncd, "lag"), (bench_scale, "run"), (bench_busy, "busy"),
                         (bench_floor, "per_write"), (bench_floor, "catchup")):
        monkeypatch.setattr(module, name, stub(getattr(module, name)))
    monkeypatch.setattr(run_all, "run_verify", stub(run_all.run_verify))
    plan = replace(run_all.QUICK, frame_rounds=50)
    suite = run_all.Suite(plan, tmp_path, None, retries=0, quiet_wait=0)
    suite.run()

    # Every stubbed bench was called as its signature allows; only the frames ran.
    assert set(suite.results) == {"frames", "crypto"}
    assert all(e.startswith("NotRun: ") for e in suite.errors.values()), suite.errors
    info = {"machine": run_all.machine(), "versions": run_all.versions()}
    text = run_all.Report(suite, info, ARGV, ("listener 0\n", "[node]\n"), 61.0).render()
    lines = text.splitlines()

    assert lines[0] == "# syncd benchmarks: the current figures"
    written = re.match(r"Written by `(.+?)` on (\d{4}-\d\d-\d\d) \d\d:\d\d \S+, "
                       r"at commit ([0-9a-f]+)", lines[2])
    assert written is not None, lines[2]
    assert written.group(1) == "python -m bench.run_all --results bench/RESULTS.md"
    today = datetime.datetime.now().astimezone().date()
    assert datetime.date.fromisoformat(written.group(2)) in (
        today, today - datetime.timedelta(days=1))  # a run across midnight
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert written.group(3) == head
    assert "one run's figures only" in lines[2]

    # The frames table: both wire versions at each batch size, measured now.
    frames = [line for line in lines if re.match(r"\| (5 signed|6 sealed, 2 rcpt) \|", line)]
    assert len(frames) == 6, frames
    crypto = [line for line in lines if line.startswith("| crypto per 700-byte frame")]
    assert len(crypto) == 1 and re.search(r"\| [\d.]+ / [\d.]+ µs \|", crypto[0]), crypto
    for row in frames:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] in ("1", "10", "100") and all(c.endswith(" µs") for c in cells[3:])
    # What did not run says so, with why, instead of showing older figures.
    assert "## Failures" in text
    assert "- catch-up: NotRun: catchup" in lines
