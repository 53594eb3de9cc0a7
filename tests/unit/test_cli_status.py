"""`syncd status` as people read it: sizes, lag, filters and the summary line (golden)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from syncd.cli import status as status_cli
from syncd.cli.main import main
from syncd.cli.status import human, render, select

PEER = {"size": 1833290, "state": "in_sync", "frozen": None, "online": True, "lag_bytes": 0,
        "lag_seconds": 0.0}
STATUS: dict[str, Any] = {
    "node": "host-a", "broker": "broker.internal:8883", "connected": True,
    "peers": {"host-b": {"online": True}, "host-c": {"online": False}},
    "files": [
        {"key": "bot-1", "file": "events.jsonl", "size": 1833290, "state": "in_sync",
         "ready": True, "not_ready": [], "diverged": {}, "freeze": None, "note": None,
         "peers": {"host-b": PEER}},
        {"key": "bot-2", "file": "events.jsonl", "size": 5300, "state": "ahead", "ready": True,
         "not_ready": [], "diverged": {}, "freeze": None, "note": None,
         "peers": {"host-b": {**PEER, "size": 4300, "state": "behind", "lag_bytes": 1000,
                              "lag_seconds": 2.25},
                   "host-c": {**PEER, "size": 0, "state": "behind", "online": False,
                              "lag_bytes": 5300, "lag_seconds": 3600.0}}},
        {"key": "bot-3", "file": "events.jsonl", "size": 700, "state": "behind",
         "ready": False, "not_ready": ["host-b holds 1200 more bytes"], "diverged": {},
         "freeze": None, "note": None,
         "peers": {"host-b": {**PEER, "size": 1900, "state": "ahead"}}},
    ],
}


def test_render_for_people() -> None:
    assert render(STATUS) == "\n".join([
        "node host-a  broker broker.internal:8883 (connected)  peers online: host-b  "
        "offline: host-c",
        "",
        "KEY    FILE          SIZE      STATE    READY  PEERS",
        "bot-1  events.jsonl  1.75 MiB  in_sync  yes    host-b=1.75 MiB in_sync",
        "bot-2  events.jsonl  5.18 KiB  ahead    yes    host-b=4.2 KiB behind lag 1000 B/2.2s, "
        "host-c=0 B behind lag 5.18 KiB/3600.0s (offline)",
        "bot-3  events.jsonl  700 B     behind   no     host-b=1.86 KiB ahead",
        "bot-3/events.jsonl: not ready to take over: host-b holds 1200 more bytes",
        "",
        "3 files: 1 ahead, 1 behind, 1 in_sync; 2 ready to take over",
    ])


def test_render_names_the_broker_in_use_among_several() -> None:
    several = {**STATUS, "broker": "[fd00::2]:1883", "connected": False,
               "brokers": ["mqtt-1.internal:8883", "[fd00::2]:1883", "mqtt-3:1883"]}
    assert render(several).splitlines()[0] == (
        "node host-a  broker [fd00::2]:1883 (DISCONNECTED, 2 of 3 listed)  peers online: "
        "host-b  offline: host-c")


def test_render_says_remote_growth_stopped_and_what_peers_had_refused() -> None:
    """docs/peer-limits.md: a floor reached and refusals at the bounds are printed."""
    limited = {**STATUS, "peer_limits": {
        "remote_growth": {"stopped": True, "low": {"/srv/runtimes": 812331008},
                          "min_free_bytes": 1073741824},
        "refused": {"nested": 3, "budget": 12}}}
    lines = render(limited).splitlines()
    at = lines.index("REMOTE GROWTH STOPPED: /srv/runtimes: 812331008 bytes free, below "
                     "[limits] min_free_bytes (1073741824); no peer's bytes are written here")
    assert lines[at + 1] == "refused at the peer limits ([limits]): 12 budget, 3 nested"
    assert "REMOTE" not in render(STATUS)  # nothing said when nothing happened


def test_select_keys_and_problems() -> None:
    assert [f["key"] for f in select(STATUS, ["bot-2", "bot-3"], False)["files"]] == [
        "bot-2", "bot-3"]
    assert [f["key"] for f in select(STATUS, [], True)["files"]] == ["bot-3"]
    frozen = copy.deepcopy(STATUS)
    frozen["files"][0]["state"] = "diverged"
    assert [f["key"] for f in select(frozen, ["bot-1", "bot-2"], True)["files"]] == ["bot-1"]
    assert render(select(STATUS, ["nope"], False)).endswith("0 files; 0 ready to take over")


def test_human_sizes() -> None:
    assert [human(n) for n in (0, 1023, 1024, 1536, 10 * 2**20, 999 * 2**30, 5 * 2**40)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "10 MiB", "999 GiB", "5 TiB"]


def test_watch_redraws_until_interrupted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                                         ) -> None:
    config = tmp_path / "syncd.toml"
    (tmp_path / "rt").mkdir()
    config.write_text('node = "host-a"\nruntimes_dir = "rt"\nstate_dir = "st"\n'
                      'secret_file = "key"\n')
    answers = iter([STATUS, select(STATUS, [], True)])
    monkeypatch.setattr(status_cli, "query", lambda *a, **k: {"status": next(answers)})
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    result = CliRunner().invoke(main, ["status", "--config", str(config), "--watch",
                                       "--interval", "0.5"])
    assert result.exit_code == 0, result.output
    assert sleeps == [0.5, 0.5]
    assert result.output.count("every 0.5s, Ctrl-C to stop") == 2
    assert result.output.count("3 files: ") == 1 and result.output.count("1 file: ") == 1
