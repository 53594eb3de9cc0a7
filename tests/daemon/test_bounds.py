"""Issue #23, cases 2-4: a listed host gone bad, end to end (docs/peer-limits.md).

x is listed in every test config and its key is real: the victims verify its frames and judge
them by their contents alone. Each test is the attack as the issue reproduced it, with real
daemons and a real Mosquitto; x is a raw MQTT client (tests/support/hostile.py) that also
counts, on the broker side, what the victims send it.

- case 2, bounded peer state: a whole manifest in 2**62 parts and manifests of ever new
  names; the victim's memory (VmHWM, /proc/<pid>/status) stays bounded;
- case 3, every request metered: probes and manifest requests cost the victim no more than
  its budgets; a probe from a host that may not write the key, or to a frozen copy, gets
  nothing;
- case 4, keys: none inside another instance or above one, none past `[limits] max_keys`,
  and no remote growth while the filesystem is below `[limits] min_free_bytes`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from syncd.core import frames
from syncd.core.frames import Announce, Data, Item, Kind, Presence, Probe, ProbeWhat, Request
from syncd.core.ledger import BLOCK, Ledger
from syncd.core.resources import PRESENCE_PASS
from tests.support.cluster import Broker, Daemon, free_port, wait_until
from tests.support.files import KEY, append, content, wait_equal
from tests.support.hostile import HostilePeer, rss_kib
from tests.support.ishiki import ishiki_lines
from tests.support.ishiki_writer import put_artifact

FILE = "events.jsonl"
EMPTY = Ledger().digest()
MiB = 1 << 20


@pytest.fixture
def x(broker: Broker) -> Iterator[HostilePeer]:
    peer = HostilePeer(broker)
    yield peer
    peer.close()


def refused(d: Daemon) -> dict[str, int]:
    """What `d` refused on a peer's word, by reason (status `peer_limits`)."""
    got: dict[str, int] = d.status().get("peer_limits", {}).get("refused", {})
    return got


def entries_body(prefix: str, n: int) -> bytes:
    digest = bytes(32).hex()
    return orjson.dumps([[f"artifacts/{prefix}/{'n' * 200}-{i}", 10, digest, 0, ""]
                         for i in range(n)])


def manifest_item(key: str, n: int, prefix: str, full: bool, part: int = 0,
                  parts: int = 1) -> Item:
    body = entries_body(prefix, n)
    return Item(Kind.RHAVE, frames.ResHave(full, (), body, part, parts), key, frames.RESOURCES)


# --- case 2: bounded peer state ----------------------------------------------------------------

def test_a_listed_host_cannot_grow_a_hosts_memory_with_manifests(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """x announces a whole manifest in 2**62 parts and never sends part 0 (once unasked, once
    in answer to b's request), then manifests of ever new names: 80 MiB of frames, each of
    ~4 000 entries. The issue saw a victim go from 46 MB to 1079 MB this way; here its peak
    RSS grows by less than 48 MiB."""
    limits = "[limits]\nmax_peer_bytes = 16777216\n"
    a = make_daemon("a", broker)
    b = make_daemon("b", broker, extra=limits)
    append(a.path(KEY), ishiki_lines(20))
    put_artifact(a.runtimes / KEY, "tool", "one.log", b"one\n")
    wait_equal(content(a.path(KEY)), b)
    assert b.proc is not None
    idle, _ = rss_kib(b.proc.pid)
    x.to("b", manifest_item(KEY, 10, "unasked", True, part=1, parts=2))  # nobody asked
    x.batch(Item(Kind.RSUM, frames.ResSum(bytes(range(32)), 5), KEY, frames.RESOURCES))
    wait_until(lambda: x.kinds_seen()["rlist"] >= 1, 10, "b to ask x for its manifest")
    for i in range(40):  # parts 1.. of 2**62: part 0 never comes
        x.to("b", manifest_item(KEY, 4000, f"p{i}", True, part=i + 1, parts=2**62))
    for i in range(40):  # changes: every name new
        x.batch(manifest_item(KEY, 4000, f"c{i}", False))
    # The last item on the same topics: b has handled everything once it answers this.
    x.to("b", Item(Kind.REQ, Request(0, EMPTY, 0, 100), KEY, FILE))
    x.flush()
    wait_until(lambda: x.kinds_seen()["fill"] >= 1, 60, "b to answer the last request")
    rss, peak = rss_kib(b.proc.pid)
    assert peak - idle < 48 * 1024, (idle, rss, peak)
    why = refused(b)
    assert why.get("unasked", 0) >= 1 and why.get("parts", 0) >= 40, why  # none is kept
    assert why.get("peer_bytes", 0) + why.get("entries", 0) > 0, why
    # And replication goes on.
    append(a.path(KEY), ishiki_lines(3))
    wait_equal(content(a.path(KEY)), b)


def test_a_presence_storm_costs_one_pass_per_peer_and_interval(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """x flips its presence 400 times (well signed, a new connection counter each time).
    Every online flip made each of b's instances send its summary and reconsider every name
    at once, on the loop (the hostile long mode: 20 s stalls with ~470 instances). Counted
    on the broker: b's summaries during the storm stay within one per instance and
    PRESENCE_PASS (plus the 30 s safety net), not one per instance and flip."""
    keys = [f"{KEY}-{i}" for i in range(20)]
    b = make_daemon("b", broker, start=False)
    for key in keys:
        append(b.path(key), ishiki_lines(1))
        put_artifact(b.runtimes / key, "tool", "one.log", key.encode())
    b.start()
    wait_until(lambda: sum(r["files"] for r in b.status()["resources"]) >= 2 * len(keys), 60,
               "b to hash every instance's files")
    x.client.subscribe(frames.all_topic(x.prefix, "b"), qos=1)  # b's summaries go to all
    topic = frames.presence_topic(x.prefix, x.node)
    start, before = time.monotonic(), x.kinds_seen()["rsum"]
    for conn in range(2, 402):  # ends online
        f = frames.Frame(x.node, x.epoch, 0, 1, (Item(Kind.NODE, Presence(conn % 2 == 1)),),
                         conn=conn)
        x.publish(topic, frames.encode(f, x.identity, topic))
    x.flush()
    # b has heard the whole storm once it answers a request sent after it.
    x.to("b", Item(Kind.REQ, Request(0, EMPTY, 0, 100), keys[0], FILE))
    x.flush()
    wait_until(lambda: x.kinds_seen()["fill"] >= 1, 60, "b to answer the last request")
    wait_until(lambda: x.kinds_seen()["rsum"] - before >= len(keys), 2 * PRESENCE_PASS + 30,
               "b's summaries for x's coming online")
    sums = x.kinds_seen()["rsum"] - before
    passes = (time.monotonic() - start) / PRESENCE_PASS + 1 + 2  # + the 30 s safety net
    assert sums <= len(keys) * passes, (sums, passes)
    assert b.proc is not None and b.proc.poll() is None


# --- case 3: every request metered -------------------------------------------------------------

def _served_within(sent: int, elapsed: float, rate: int, burst: int, largest: int) -> bool:
    return sent <= burst + rate * elapsed + largest


def test_probes_and_manifest_requests_cost_no_more_than_the_budget(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """Limits of 2 requests/s and 64 KiB/s: a frame of 100 probes for blocks of a 7 MB log,
    and 10 frames of 5 requests for a manifest of 2000 files (the issue: 6.6 MB and 18.2 MB
    sent, none of it booked). Counted on the broker: within burst + rate x time + one item."""
    limits = ("[limits]\nrequests_per_second = 2\nrequest_burst = 2\n"
              "bytes_per_second = 65536\nbyte_burst = 65536\n")
    a = make_daemon("a", broker, extra=limits, start=False)
    data = b""
    while len(data) < 100 * BLOCK + BLOCK:
        data += ishiki_lines(500)
    append(a.path(KEY), data)
    for i in range(2000):
        put_artifact(a.runtimes / KEY, f"t{i % 20}", f"{'f' * 60}-{i}.log", b"%d\n" % i)
    a.start()
    wait_until(lambda: any(r["key"] == KEY and r["files"] >= 4000
                           for r in a.status()["resources"]), 60, "a to hash its resources")
    start = time.monotonic()
    x.to("a", *(Item(Kind.PROBE, Probe(ProbeWhat.BYTES, i * BLOCK, BLOCK), KEY, FILE)
                for i in range(100)))
    rlist = Item(Kind.RLIST, frames.ResList(bytes(32)), KEY, frames.RESOURCES)
    for _ in range(10):
        x.to("a", *(rlist,) * 5)
    x.flush()
    sent = x.wait_quiet("a", quiet=2.0)
    elapsed = time.monotonic() - start
    largest = 2 * MiB  # one whole manifest answer can exceed the bucket once (a debt)
    assert sent > 0, "a answered nothing at all"
    assert _served_within(sent, elapsed, 65536, 65536, largest), (sent, elapsed)
    budget = a.status()["peer_budgets"]["x"]
    assert budget["dropped_requests"] > 0 and budget["served_bytes"] >= sent * 0.5, budget


def test_a_probe_from_a_host_that_may_not_write_the_key_gets_nothing(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """`writers = ["a", "b"]`: x's probes are refused (counted as `writers`); a's peers'
    are answered."""
    writers = f'[keys."{KEY}"]\nwriters = ["a", "b"]\n'
    a = make_daemon("a", broker, extra=writers)
    append(a.path(KEY), ishiki_lines(200))
    wait_until(lambda: a.file_status(KEY).get("size") == len(content(a.path(KEY))), 10,
               "a to load its copy")
    x.to("a", Item(Kind.PROBE, Probe(ProbeWhat.BYTES, 0, BLOCK), KEY, FILE),
         Item(Kind.PROBE, Probe(ProbeWhat.SUMS, 0, 100), KEY, FILE))
    x.to("a", Item(Kind.REQ, Request(0, EMPTY, 0, 100), KEY, FILE))  # a reader may read
    x.flush()
    wait_until(lambda: x.kinds_seen()["fill"] >= 1, 10, "a to serve the request")
    assert x.kinds_seen()["probed"] == 0
    wait_until(lambda: "x is not among the writers" in a.read_log(), 10, "the refusal logged")


# --- case 4: keys ------------------------------------------------------------------------------

def _live(key: str, line: bytes = b'{"id":"x","content":"from x"}\n') -> list[Item]:
    return [Item(Kind.POS, Announce(len(line), _digest(line)), key, FILE),
            Item(Kind.LIVE, Data(0, EMPTY, line), key, FILE)]


def _digest(data: bytes) -> bytes:
    ledger = Ledger()
    ledger.extend(data)
    return ledger.digest()


def test_no_key_inside_another_instance_or_above_one(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """`writers = ["a"]` for bot-1: x makes neither bot-1/workspace nor
    bot-1/resources/artifacts/shake an instance (the issue saw both on every host, the second
    counted in bot-1's manifest), nor onebot_1 above the instance onebot_1/group_2."""
    writers = f'[keys."{KEY}"]\nwriters = ["a"]\n'
    a = make_daemon("a", broker, extra=writers)
    b = make_daemon("b", broker, extra=writers)
    append(a.path(KEY), ishiki_lines(5))
    put_artifact(a.runtimes / KEY, "shake", "s.log", b"s\n")
    append(b.path("onebot_1/group_2"), ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b)
    wait_until(lambda: b.file_status("onebot_1/group_2").get("size"), 10, "b's own instance")
    wait_until(lambda: {r["key"]: r for r in b.status()["resources"]}.get(KEY, {}).get("files")
               == 2, 10, "b to hold bot-1's artifact and its sidecar")
    inside = [f"{KEY}/workspace", f"{KEY}/resources/artifacts/shake", f"{KEY}/resources"]
    for key in [*inside, "onebot_1"]:
        x.batch(*_live(key))
    x.flush()
    for d in (a, b):
        wait_until(lambda d=d: refused(d).get("nested", 0) >= 4, 10,
                   f"{d.node} to refuse the nested keys")
        keys = {f["key"] for f in d.status()["files"]}
        assert keys.isdisjoint([*inside, "onebot_1"]), keys
        assert not (d.runtimes / KEY / "workspace").exists()
        assert not (d.runtimes / KEY / "resources" / "artifacts" / "shake" / FILE).exists()
        assert not (d.runtimes / "onebot_1" / FILE).exists()
        shown = {s["key"]: s["reason"] for s in d.status()["skipped"]}
        assert "inside the instance bot-1" in shown.get(f"{KEY}/workspace", ""), shown
    names = {r["key"]: r for r in b.status()["resources"]}[KEY]
    assert names["files"] == 2  # s.log and its sidecar: nothing of x's counted in bot-1's
    append(a.path(KEY), ishiki_lines(2))
    wait_equal(content(a.path(KEY)), b)


def test_a_peer_creates_no_more_keys_than_max_keys(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    b = make_daemon("b", broker, extra="[limits]\nmax_keys = 4\n")
    append(b.path(KEY), ishiki_lines(2))  # local: always replicated, counts toward the 4
    wait_until(lambda: b.file_status(KEY).get("size"), 10, "b's own key")
    for i in range(20):
        x.batch(*_live(f"new-{i}"))
    x.flush()
    wait_until(lambda: refused(b).get("keys", 0) >= 17, 10, "b to refuse 17 keys")
    keys = {f["key"] for f in b.status()["files"]}
    assert len(keys) == 4 and KEY in keys, keys
    made = sorted(p.name for p in b.runtimes.iterdir())
    assert len(made) <= 4, made
    assert "over [limits] max_keys (4)" in b.read_log()
    shown = [s for s in b.status()["skipped"] if "max_keys" in s["reason"]]
    assert shown


@contextlib.contextmanager
def small_filesystem(where: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of `size_mib` MiB mounted at `where` (root only), unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_remote_growth_stops_above_min_free_bytes_and_resumes(
    broker: Broker, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """b's runtimes on a 64 MiB filesystem with `min_free_bytes` of 40 MiB: once a local
    file leaves less than that free, a's bytes stop landing on b (log, status, metric), b's
    own writer still has its 34 MiB, and b catches up when space comes back."""
    port = free_port()
    a = make_daemon("a", broker)
    b = make_daemon("b", broker, start=False,
                    extra=f"[limits]\nmin_free_bytes = {40 * MiB}\n"
                          f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    with small_filesystem(b.runtimes, 64):
        b.start()
        append(a.path(KEY), ishiki_lines(50))
        wait_equal(content(a.path(KEY)), b)
        ballast = b.runtimes / "ballast"
        ballast.write_bytes(b"\0" * (30 * MiB))  # 34 MiB left: below the floor
        wait_until(lambda: b.status()["peer_limits"]["remote_growth"]["stopped"], 10,
                   "b to stop remote growth")
        held = len(content(b.path(KEY)))
        append(a.path(KEY), ishiki_lines(50))
        wait_until(lambda: b.file_status(KEY).get("state") == "paused"
                   or b.file_status(KEY).get("paused"), 10, "b's copy to show the pause")
        assert len(content(b.path(KEY))) == held
        assert "remote growth stopped" in b.read_log()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "syncd_remote_growth_stopped 1.0" in text
        append(b.path("local-bot"), b"x" * MiB)  # the local writer is not paused
        ballast.unlink()
        wait_until(lambda: not b.status()["peer_limits"]["remote_growth"]["stopped"], 10,
                   "b to resume remote growth")
        wait_equal(content(a.path(KEY)), b, timeout=30)
        b.stop()


def test_keys_a_peer_fills_with_unfinished_lines_hold_one_pool(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """x makes 120 keys and gives each 600 KiB without a newline (the hostile long mode's
    keys of random bytes, larger). Each key's log check held its unfinished line, up to
    1 MiB per file: 70 MiB here, and a gigabyte with a thousand keys. Now all files'
    unfinished lines share one pool (logfollow.POOL_BYTES, 16 MiB): b checks every byte of
    every file (the lines that did not fit are only measured) and its RSS grows by less than
    64 MiB (measured: about 50; 103 MiB without the pool). The rest is the pool, the events
    queued within max_peer_bytes (16 MiB) and each key's partial block (64 KiB)."""
    b = make_daemon("b", broker, extra="[limits]\nmax_peer_bytes = 16777216\n")
    append(b.path(KEY), ishiki_lines(2))
    wait_until(lambda: b.file_status(KEY).get("size"), 10, "b's own key")
    assert b.proc is not None
    idle, _ = rss_kib(b.proc.pid)
    line = b'{"id":"x","content":"' + b"y" * (600 << 10)  # never ended
    keys = [f"unfinished-{i}" for i in range(120)]
    piece = 200 << 10  # within chunk_bytes
    for group in range(0, len(keys), 10):  # paced: within max_peer_bytes of queued events
        for key in keys[group:group + 10]:
            x.batch(Item(Kind.POS, Announce(len(line), _digest(line)), key, FILE),
                    *(Item(Kind.LIVE, Data(at, _digest(line[:at]), line[at:at + piece]), key,
                           FILE) for at in range(0, len(line), piece)))
        x.flush()
        wait_until(lambda group=group: all(
            b.path(k).exists() and b.path(k).stat().st_size == len(line)
            for k in keys[group:group + 10]), 30, "b to write x's bytes")

    def all_checked() -> bool:
        files = {f["key"]: f for f in b.status()["files"]}
        return all(files.get(k, {}).get("log_check", {}).get("bytes", 0) == len(line)
                   for k in keys)

    wait_until(all_checked, 80, "b to check every file's bytes")
    rss, peak = rss_kib(b.proc.pid)
    assert peak - idle < 64 * 1024, (idle, rss, peak)
    pool = b.status()["peer_limits"]["unfinished_lines"]
    assert pool["held"] <= pool["limit"] and pool["not_held"] > 0, pool


def test_a_position_keeps_only_the_names_of_hosts_this_host_knows(
    broker: Broker, make_daemon: Callable[..., Daemon], x: HostilePeer
) -> None:
    """A position names the peers whose copies differ from the sender's: up to 1024 names of
    200 characters, which each peer's view of each key kept (about 100 KiB per key from a
    hostile peer, growing with the keys it makes). Only the names of hosts this host knows
    (itself and [peers]) are kept, each once."""
    b = make_daemon("b", broker)
    line = b'{"id":"x","content":"from x"}\n'
    names = ("y" * 200, "b", "not-listed", "b", "a") * 204
    x.batch(Item(Kind.POS, Announce(len(line), _digest(line), None, 0, names), "x-key", FILE),
            Item(Kind.LIVE, Data(0, EMPTY, line), "x-key", FILE))
    x.flush()
    wait_until(lambda: "x" in b.file_status("x-key").get("peers", {}), 10, "b to hear x")
    assert b.file_status("x-key")["peers"]["x"]["diverged"] == ["b", "a"]
