"""The batch window (syncd/daemon/window.py) on a fake clock: a lone change goes at once, changes in
a busy stream wait for the end of the window and leave together, and the source is held
while a window is open."""

from __future__ import annotations

from collections.abc import Callable

from syncd.daemon.window import BatchWindow, CommitGate


class FakeTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Just what BatchWindow uses of a loop: time() and call_at()."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeTimer:
        self.timers.append(FakeTimer(when, callback))
        return self.timers[-1]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [t for t in self.timers if t.when <= self.now and not t.cancelled]:
            self.timers.remove(due[0])
            due[0].callback()


class Source:
    """A watcher's part: changes it holds back are reported at drain()."""

    def __init__(self, window: float) -> None:
        self.loop = FakeLoop()
        self.held = False
        self.queued: list[str] = []
        self.released: list[tuple[int, str]] = []  # (release number, name)
        self.window: BatchWindow[str] = BatchWindow(
            window, self._release, self.hold, self.drain, self.resume,
            loop=self.loop)  # type: ignore[arg-type]

    def _release(self, name: str) -> None:
        self.released.append((self.window.releases, name))

    def batches(self) -> list[list[str]]:
        out: dict[int, list[str]] = {}
        for n, name in self.released:
            out.setdefault(n, []).append(name)
        return list(out.values())

    def change(self, name: str) -> None:
        if self.held:
            self.queued.append(name)
        else:
            self.window.offer(name)

    def hold(self) -> None:
        self.held = True

    def drain(self) -> None:
        queued, self.queued = self.queued, []
        for name in queued:
            self.window.offer(name)

    def resume(self) -> None:
        self.held = False


def test_a_lone_change_is_released_at_once_and_holds_nothing() -> None:
    source = Source(0.01)
    source.change("a")
    assert source.batches() == [["a"]]
    assert not source.held
    source.loop.advance(1.0)
    source.change("a")
    assert source.batches() == [["a"], ["a"]]


def test_changes_within_the_window_leave_together_at_its_end() -> None:
    source = Source(0.01)
    source.change("a")
    assert source.batches() == [["a"]]
    source.loop.advance(0.002)
    source.change("a")
    assert source.held  # the watcher stops waking us for each write
    source.loop.advance(0.002)
    source.change("b")
    source.change("a")
    assert source.batches() == [["a"]]  # nothing more yet
    source.loop.advance(0.0061)  # the window (10 ms after the last release) ends
    assert source.batches() == [["a"], ["a", "b"]]  # each once, in order of arrival


def test_a_busy_stream_stays_held_and_a_quiet_window_resumes() -> None:
    source = Source(0.01)
    source.change("a")
    for _ in range(5):  # 500 writes a second for 50 ms
        for _ in range(5):
            source.loop.advance(0.002)
            source.change("a")
        assert source.held
    assert len(source.batches()) == 5  # the first at once, then one per window
    source.loop.advance(0.01)  # the last window's changes
    source.loop.advance(0.01)  # a window with nothing: report as they come again
    assert not source.held
    n = len(source.batches())
    source.change("a")
    assert len(source.batches()) == n + 1  # after a quiet window, at once again


def test_a_window_of_zero_releases_every_change_at_once() -> None:
    source = Source(0.0)
    for name in "abc":
        source.change(name)
    assert source.batches() == [["a"], ["b"], ["c"]]
    assert not source.held


def test_flush_releases_what_waits_and_resumes_the_source() -> None:
    source = Source(0.01)
    source.change("a")
    source.loop.advance(0.001)
    source.change("b")
    source.change("c")  # held in the source
    assert source.batches() == [["a"]]
    source.window.flush()
    assert source.batches() == [["a"], ["b", "c"]]
    assert not source.held


def test_the_commit_gate_ships_at_once_and_joins_what_comes_during_a_commit() -> None:
    loop = FakeLoop()
    released: list[str] = []
    gate: CommitGate[str] = CommitGate(0.0, released.append, loop=loop)  # type: ignore[arg-type]
    gate.offer("a")
    assert released == ["a"]  # no window: at once, no timer
    assert not loop.timers
    for _ in range(10):
        gate.offer("a")  # the writer goes on while a's commit is under way
    gate.offer("b")  # another file is not held up by a's
    assert released == ["a", "b"]
    gate.done("a")
    assert released == ["a", "b", "a"]  # the ten together, right as the first is done
    gate.done("a")
    gate.done("b")
    assert released == ["a", "b", "a"]
    s = gate.status()
    assert (s["changes"], s["reads"], s["joined"], s["largest"]) == (12, 3, 10, 10)
    assert s["extra_wait"] == 0.0 and s["in_flight"] == 0


def test_the_commit_gate_behind_a_batch_window() -> None:
    loop = FakeLoop()
    released: list[str] = []
    gate: CommitGate[str] = CommitGate(0.01, released.append, loop=loop)  # type: ignore[arg-type]
    gate.offer("a")
    gate.done("a")
    gate.offer("a")  # within the window: waits for its end, then for nothing in flight
    assert released == ["a"]
    loop.advance(0.01)
    assert released == ["a", "a"]
