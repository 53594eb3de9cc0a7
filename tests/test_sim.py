"""The simulator's quick mode: 2 000 seeded histories of 2-5 hosts around the real machine,
every invariant of ../shared/docs/integrity.md checked after every step (see tests/sim).

The long mode runs on demand: `python -m tests.sim --seeds 100000`. A failure names its seed
and the command that replays it.
"""

from __future__ import annotations

import pytest

from tests.sim.world import Violation, World, run_seed

QUICK_SEEDS = 2000


def test_quick_mode_finds_no_violation() -> None:
    failures = []
    for seed in range(QUICK_SEEDS):
        try:
            run_seed(seed)
        except Violation as v:
            failures.append(str(v))
            if len(failures) >= 3:
                break
    assert not failures, "\n\n".join(failures)


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(12345), run_seed(12345)
    assert first.history == second.history
    assert {n: bytes(h.file.data) if h.file else None for n, h in first.hosts.items()} == \
        {n: bytes(h.file.data) if h.file else None for n, h in second.hosts.items()}


def test_a_quiet_world_converges_to_the_writers_bytes() -> None:
    world = World(7, hosts=3, steps=40, faults=False)
    world.run()
    copies = {bytes(h.file.data) for h in world.hosts.values() if h.file is not None}
    assert len(copies) == 1 and next(iter(copies)).count(b"\n") >= 40


def test_violations_name_the_seed_and_the_replay_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: World) -> None:
        raise Violation("an invariant broke")

    monkeypatch.setattr(World, "run", broken)
    with pytest.raises(Violation, match=r"seed 3: an invariant broke\n  replay: python -m "
                                        r"tests.sim --seed 3 -v"):
        run_seed(3)


RESOURCE_SEEDS = 200  # ~6 s: resources/ histories (tests/sim/resworld.py)


def test_resources_quick_mode_finds_no_violation() -> None:
    from tests.sim import resworld
    failures = []
    for seed in range(RESOURCE_SEEDS):
        try:
            resworld.run_seed(seed)
        except Violation as v:
            failures.append(str(v))
            if len(failures) >= 3:
                break
    assert not failures, "\n\n".join(failures)


def test_the_resource_simulator_sees_a_machine_that_overwrites(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants can fail: a machine that fetches over a differing write-once file is
    caught (and seen as a conflict only after quiescence would be too late)."""
    from syncd.resources import FileKind, ResourceMachine
    from tests.sim import resworld

    def overwrite(self: ResourceMachine, name: str) -> None:
        if self.rules.kind(name) is FileKind.ONCE:
            self.local.pop(name, None)  # forget ours: the peer's bytes are fetched over it

    original = ResourceMachine._consider

    def broken(self: ResourceMachine, name: str, now: float, out: list[object]) -> None:
        overwrite(self, name)
        original(self, name, now, out)  # type: ignore[arg-type]

    monkeypatch.setattr(ResourceMachine, "_consider", broken)
    caught = 0
    for seed in range(40):
        try:
            resworld.run_seed(seed)
        except Violation:
            caught += 1
    assert caught
