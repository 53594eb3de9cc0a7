"""Two sites: each daemon on its own site's broker, the brokers joined by the example bridge."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines

EXAMPLE = Path(__file__).parents[2] / "config" / "mosquitto-bridge.conf"
# The test brokers are plain and anonymous: drop TLS and login, keep the rest as shipped.
_SITE_ONLY = ("bridge_cafile", "bridge_certfile", "bridge_keyfile", "remote_username",
              "remote_password")


def bridge_to(hub: Broker) -> str:
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith(_SITE_ONLY):
            continue
        if line.startswith("address "):
            line = f"address 127.0.0.1:{hub.port}"
        if line.startswith("topic "):
            assert line == "topic # both 1 syncd/ syncd/"
            line = "topic # both 1 test/syncd/ test/syncd/"  # tests.cluster's topic_prefix
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_two_sites_converge_through_a_bridge(tmp_path: Path) -> None:
    hub = Broker(tmp_path / "site-a-broker")
    hub.start()
    site_b = Broker(tmp_path / "site-b-broker", extra=bridge_to(hub))
    site_b.start()
    a = Daemon(tmp_path, "a", hub)
    b = Daemon(tmp_path, "b", site_b)
    try:
        append(a.path("bot-1"), ishiki_lines(30))  # there before b starts: retained position
        a.start()
        b.start()
        wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
        append(a.path("bot-1"), ishiki_lines(10))  # live, across the bridge
        append(b.path("bot-2"), ishiki_lines(10))  # and the other way
        wait_equal(a.path("bot-1").read_bytes(), b, key="bot-1")
        wait_equal(b.path("bot-2").read_bytes(), a, key="bot-2")
        for d, peer in ((a, "b"), (b, "a")):
            wait_until(lambda d=d, peer=peer: d.status()["peers"].get(peer, {}).get("online"),
                       10, f"{d.node} to see {peer} online")
            for key in ("bot-1", "bot-2"):
                wait_until(lambda d=d, key=key: d.file_status(key)["state"] == "in_sync", 10,
                           f"{d.node} {key} in_sync")
    finally:
        a.kill()
        b.kill()
        site_b.stop()
        hub.stop()
