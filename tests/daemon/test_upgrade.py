"""Issue #26: a rolling upgrade. Three hosts run the previous release (wire version 5 only),
then are upgraded one at a time to this one while a writer writes throughout: every frame
goes out in a version its readers speak, so replication never stops (lag < 1 s while mixed)
and the copies end byte-identical, the last ones sealed (version 6)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, wait_equal
from tests.support.ishiki import ishiki_lines

# The last commit of main that spoke version 5 only (the release before wire version 6).
PREVIOUS_RELEASE = "ae1e8f3a3b0ba2310a52a9b17860f71f2875ddfb"
REPO = Path(__file__).resolve().parents[2]
MAX_LAG = 1.0


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """That release's tree, run with this venv (its code first on the path)."""
    tree = tmp_path / "previous-release"
    tree.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE, "syncd"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the previous release is not in this checkout's history: {e}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True, timeout=60)
    return tree


def run_previous(d: Daemon, tree: Path) -> None:
    # `python -m syncd` puts the working directory first on sys.path: run it from the tree.
    d.prefix = ["env", f"--chdir={tree}"]
    d.env = {"PYTHONPATH": str(tree)}


def run_new(d: Daemon) -> None:
    d.prefix, d.env = [], {}


class Writer:
    """Appends a line every few milliseconds to a's copy, noting when each size was reached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written: list[tuple[float, int]] = []  # (monotonic time, size after the append)
        self._lines = ishiki_lines(4000).splitlines(keepends=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        for line in self._lines:
            if self._stop.wait(0.02):
                return
            append(self.path, line)
            size += len(line)
            with self._lock:
                self.written.append((time.monotonic(), size))

    def lag(self, size: int) -> float:
        """How long ago the first byte a copy of `size` bytes lacks was written (0: none)."""
        now = time.monotonic()
        with self._lock:
            for at, end in self.written:
                if end > size:
                    return now - at
        return 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Callable[[Path], Writer]]:
    made: list[Writer] = []

    def make(path: Path) -> Writer:
        w = Writer(path)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


def worst_lag(w: Writer, hosts: list[Daemon], seconds: float) -> float:
    """The largest lag of any of `hosts` seen over `seconds` of writing."""
    worst = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for d in hosts:
            try:
                size = os.stat(d.path(KEY)).st_size
            except FileNotFoundError:
                size = 0
            worst = max(worst, w.lag(size))
        time.sleep(0.01)
    return worst


def caught_up(w: Writer, hosts: list[Daemon], timeout: float = 20) -> None:
    wait_until(lambda: all(w.lag(os.stat(d.path(KEY)).st_size) < MAX_LAG / 2 for d in hosts
                           if d.path(KEY).exists()) and all(d.path(KEY).exists() for d in hosts),
               timeout, "every host to catch up with the writer")


def test_a_rolling_upgrade_never_stops_replication(
    broker: Broker, make_daemon: Callable[..., Daemon], previous_release: Path,
    writer: Callable[[Path], Writer],
) -> None:
    hosts = [make_daemon(n, broker, start=False) for n in "abc"]
    a, b, c = hosts
    for d in hosts:
        run_previous(d, previous_release)
        d.start()
    assert "speaks" not in a.status()["peers"].get("b", {"speaks": None}), \
        "the hosts run the previous release"
    append(a.path(KEY), ishiki_lines(5))
    w = writer(a.path(KEY))
    w.start()
    caught_up(w, hosts)
    lags = {"all previous": worst_lag(w, [b, c], 2)}
    for d in hosts:  # the writer's host first: a new host writing to old ones, then the rest
        d.stop()
        run_new(d)
        d.start()
        caught_up(w, hosts)
        new = [x.node for x in hosts if not x.env]
        lags[f"new: {','.join(new)}"] = worst_lag(w, [b, c], 2)
        for x in hosts:  # what each sends each: the highest version both speak
            for peer in hosts:
                if peer is not x and not x.env:
                    want = 6 if not peer.env else 5
                    wait_until(lambda p=peer, x=x, want=want:
                               x.status()["peers"].get(p.node, {}).get("wire_version") == want,
                               10, f"{x.node} to speak {want} with {peer.node}")
    # Once every host is upgraded, each frame between them is sealed: the standbys hear
    # version 6 from the writer, and the writer from them.
    for x, peer in ((b, a), (c, a), (a, b), (a, c)):
        wait_until(lambda x=x, p=peer: x.status()["peers"][p.node]["heard_version"] == 6, 10,
                   f"{x.node} to hear version 6 from {peer.node}")
    w.stop()
    final = a.path(KEY).read_bytes()
    wait_equal(final, b, c, timeout=20)
    print("worst lag while mixed:", {k: round(v, 3) for k, v in lags.items()})
    over = {k: round(v, 3) for k, v in lags.items() if v >= MAX_LAG}
    assert not over, f"lag over {MAX_LAG} s while mixed: {over} (all: {lags})"
    for d in hosts:
        assert d.status()["rejected_frames"] == 0, d.read_log()[-3000:]
