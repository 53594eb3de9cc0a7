"""The floor under issue #12's CPU and catch-up targets: the least any Python replicator built
on our stack (paho-mqtt, Ed25519, Mosquitto) can cost on this machine.

Two bare pipelines, none of syncd's logic (no state machine, records, log checks, ledger,
batching rules or watcher): only the work every copy must do.

- per write: 500 writes/s appended to a file (one write(2) each, as bench_replication does).
  The writer wakes every `--window` s (a batch window; a timer instead of inotify), reads
  what was appended, fdatasyncs it, protects it (`--crypto`, below) and publishes it (QoS 1);
  the standby reads the message, checks it, appends the bytes and fdatasyncs them. With
  `--window 0` (syncd's default batching: batch_window = 0) there is no timer: inotify wakes
  the writer at each append, it ships everything new at once and fdatasyncs it, and what is
  appended meanwhile goes in the next message (group commit). `--standbys N`: N standbys
  read every message (aes-gcm wraps the frame key for each, as sealed.py does).
  CPU per write of each process (user + system, /proc) over the run.
- catch-up: a 1 GB file sent in `--chunk` pieces (syncd's chunk_bytes), QoS 1, up to 100 in
  flight, no flow control but the broker's queue; the standby verifies each, appends it and
  fdatasyncs every 4 MiB. MB/s from the first publish to the last fdatasync.

`--crypto` says how each message is protected: `ed25519` (the default; an Ed25519 signature
over its SHA-256, as wire 5's presence frames are signed), `aes-gcm` (no public-key operation
per message: the body AES-256-GCM under a fresh key, that key wrapped with AES-256-GCM under a
pair key, the wrap binding the ciphertext's SHA-256, as issue #26's design does for one
recipient), `none` (the bare pipeline), or several, comma-separated, measured one after the
other in one run.

Both drive paho from one thread with select(), as syncd drives it from its event loop, with
glibc's heap set as `syncd run` sets it (syncd/ops/allocator.py). Each runs twice: the standby
reading through paho, then reading the socket itself (RawReader: PUBLISH parsed in place,
PUBACK sent), which shows what paho's read path costs (`--readers`).

    python -m bench.bench_floor [--rate 500] [--seconds 10] [--window 0.01] [--standbys 1]
                                [--catchup-mb 1024] [--chunk 262144]
                                [--crypto ed25519,aes-gcm,none] [--readers paho,raw]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paho.mqtt.client as paho
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from paho.mqtt.enums import CallbackAPIVersion

from bench.harness import cpu_split, paced_appends
from syncd.disk import inotify
from syncd.ops import allocator
from tests.support.cluster import Broker, wait_until
from tests.support.ishiki import ishiki_lines

TOPIC = "floor/a"
SEED = bytes(range(32))  # both roles derive the same test key pair
SYNC_EVERY = 4 << 20
CRYPTO = ("ed25519", "aes-gcm", "none")
PAIR_KEY = bytes(range(32, 64))  # both roles share it, as a pair of hosts would


def sealer(crypto: str, recipients: int = 1) -> Callable[[bytes], bytes]:
    """How the sender protects one message's bytes (see --crypto), for `recipients`."""
    if crypto == "ed25519":
        key = Ed25519PrivateKey.from_private_bytes(SEED)
        return lambda data: key.sign(hashlib.sha256(data).digest()) + data
    if crypto == "aes-gcm":
        pairs = [AESGCM(pair_key(i)) for i in range(recipients)]

        def seal(data: bytes) -> bytes:
            frame_key, nonce = AESGCM.generate_key(256), os.urandom(12)
            body = AESGCM(frame_key).encrypt(nonce, data, None)
            digest = hashlib.sha256(body).digest()
            wraps = []
            for pair in pairs:  # the frame key wrapped for each standby with its pair key
                wrap_nonce = os.urandom(12)
                wraps.append(wrap_nonce + pair.encrypt(wrap_nonce, frame_key, digest))
            return nonce + b"".join(wraps) + body  # 12 + 60 bytes per recipient, the body

        return seal
    return lambda data: data


def pair_key(i: int) -> bytes:
    """The pair key the writer shares with standby `i` (a pair of hosts has one each)."""
    return bytes((b + i) % 256 for b in PAIR_KEY)


def opener(crypto: str, index: int = 0, recipients: int = 1) -> Callable[[bytes], bytes]:
    """How the standby checks one message and gets its bytes back (raises if forged)."""
    if crypto == "ed25519":
        public = Ed25519PrivateKey.from_private_bytes(SEED).public_key()

        def verify(payload: bytes) -> bytes:
            data = payload[64:]
            public.verify(payload[:64], hashlib.sha256(data).digest())
            return data

        return verify
    if crypto == "aes-gcm":
        pair = AESGCM(pair_key(index))
        at, body_at = 12 + 60 * index, 12 + 60 * recipients

        def open_(payload: bytes) -> bytes:
            nonce, wrap_nonce, wrap, body = (payload[:12], payload[at:at + 12],
                                             payload[at + 12:at + 60], payload[body_at:])
            frame_key = pair.decrypt(wrap_nonce, wrap, hashlib.sha256(body).digest())
            return AESGCM(frame_key).decrypt(nonce, body, None)

        return open_
    return lambda payload: payload


def _client(port: int, on_message: Callable[[bytes], None] | None = None) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    if on_message is not None:
        c.on_message = lambda _c, _u, msg: on_message(msg.payload)
    c.connect("127.0.0.1", port)
    return c


def _turn(c: paho.Client, timeout: float) -> None:
    """One turn of a select() loop driving paho, as syncd's event loop does."""
    sock = c.socket()
    r, w, _ = select.select([sock], [sock] if c.want_write() else [], [], max(timeout, 0))
    if r:
        c.loop_read()
    if w or c.want_write():
        c.loop_write()
    c.loop_misc()


def writer(port: int, path: Path, window: float, stop_file: Path, ready_file: Path,
           crypto: str, recipients: int = 1) -> None:
    seal = sealer(crypto, recipients)
    c = _client(port)
    fd = os.open(path, os.O_RDONLY)
    # From the start of the file: under load this process may start after the first writes
    # (it began at the size it found, and the bytes before were never sent: the run then
    # waited for a standby that could not catch up).
    sent = 0
    if window <= 0:
        group_commit_writer(c, fd, path, stop_file, ready_file, seal)
        return
    ready_file.touch()
    nxt = time.monotonic()
    while not stop_file.exists():
        _turn(c, nxt - time.monotonic())
        if time.monotonic() < nxt:
            continue
        nxt += window
        size = os.fstat(fd).st_size
        if size > sent:
            data = os.pread(fd, size - sent, sent)
            os.fdatasync(fd)
            c.publish(TOPIC, seal(data), qos=1)
            sent += len(data)


def group_commit_writer(c: paho.Client, fd: int, path: Path, stop_file: Path,
                        ready_file: Path, seal: Callable[[bytes], bytes]) -> None:
    """--window 0, syncd's default batching: no timer. inotify wakes the writer at each
    append; it reads everything new at once, publishes it and fdatasyncs it; what the writer
    appended meanwhile goes together in the next one (group commit)."""
    ino = inotify.init()
    inotify.add_watch(ino, os.fsencode(path), inotify.IN_MODIFY)
    sent = 0
    ready_file.touch()
    while not stop_file.exists():
        sock = c.socket()
        r, w, _ = select.select([sock, ino], [sock] if c.want_write() else [], [], 0.05)
        if sock in r:
            c.loop_read()
        if ino in r:
            with contextlib.suppress(BlockingIOError):
                while os.read(ino, 65536):  # every event so far: one look covers them
                    pass
            size = os.fstat(fd).st_size
            if size > sent:
                data = os.pread(fd, size - sent, sent)
                c.publish(TOPIC, seal(data), qos=1)  # shipped at once, as syncd does
                os.fdatasync(fd)
                sent += len(data)
        if w or c.want_write():
            c.loop_write()
        c.loop_misc()


def catchup_sender(port: int, path: Path, chunk: int, stop_file: Path, crypto: str) -> None:
    seal = sealer(crypto)
    acked = 0
    c = _client(port)

    def on_publish(*_: Any) -> None:
        nonlocal acked
        acked += 1

    c.on_publish = on_publish
    fd = os.open(path, os.O_RDONLY)
    size, offset, published = os.fstat(fd).st_size, 0, 0
    while not stop_file.exists():
        while offset < size and published - acked < 100:
            data = os.pread(fd, chunk, offset)
            c.publish(TOPIC, seal(data), qos=1)
            offset += len(data)
            published += 1
        _turn(c, 0.05)


def standby(port: int, path: Path, ready_file: Path, stop_file: Path, every: int,
            crypto: str, index: int = 0, recipients: int = 1) -> None:
    open_ = opener(crypto, index, recipients)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    unsynced = 0

    def on_message(payload: bytes) -> None:
        nonlocal unsynced
        data = open_(payload)
        os.write(fd, data)
        unsynced += len(data)
        if unsynced >= every:
            os.fdatasync(fd)
            unsynced = 0

    c = _client(port, on_message)
    c.subscribe(TOPIC, qos=1)
    subscribed = time.monotonic() + 0.5
    raw: RawReader | None = None
    while not stop_file.exists():
        if raw is not None:
            raw.turn(0.05)
        else:
            _turn(c, 0.05)
            if RAW and not subscribed:
                raw = RawReader(c.socket(), on_message)
        if unsynced:
            os.fdatasync(fd)
            unsynced = 0
        if subscribed and time.monotonic() > subscribed:
            ready_file.touch()
            subscribed = 0


RAW = os.environ.get("FLOOR_READER") == "raw"  # set by _spawn


class RawReader:
    """FLOOR_READER=raw: once subscribed, the standby reads the socket itself (one recv of
    up to 1 MiB per wake-up, PUBLISH packets parsed in place, PUBACK sent), to show what
    paho's read path costs."""

    def __init__(self, sock: Any, on_message: Callable[[bytes], None]) -> None:
        self.sock, self.on_message = sock, on_message
        self.sock.setblocking(False)
        self.buf = bytearray()

    def turn(self, timeout: float) -> None:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return
        try:
            self.buf += self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        view, pos, acks = memoryview(self.buf), 0, []
        while True:
            if len(view) - pos < 2:
                break
            length, mult, i = 0, 1, pos + 1
            while i < len(view) and view[i] & 0x80:
                length += (view[i] & 0x7F) * mult
                mult <<= 7
                i += 1
            if i >= len(view):
                break
            length += view[i] * mult
            body = i + 1
            if body + length > len(view):
                break
            kind = view[pos] >> 4
            if kind == 3:  # PUBLISH
                qos = (view[pos] >> 1) & 3
                tlen = int.from_bytes(view[body:body + 2], "big")
                at = body + 2 + tlen
                if qos:
                    acks.append(b"\x40\x02" + bytes(view[at:at + 2]))
                    at += 2
                self.on_message(bytes(view[at:body + length]))
            pos = body + length
        view.release()
        del self.buf[:pos]
        if acks:
            self.sock.sendall(b"".join(acks))


def _spawn(*args: str, raw: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.bench_floor", "--role", *args],
                            cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, "FLOOR_READER": "raw" if raw else "paho"})


def _cpu(pid: int) -> float:
    user, system = cpu_split(pid)
    return user + system


def per_write(root: Path, rate: float, seconds: float, window: float, raw: bool = False,
              crypto: str = "ed25519", standbys: int = 1) -> dict[str, Any]:
    """`raw`: the standby reads the socket itself (RawReader) instead of through paho.
    `standbys`: how many read the writer's messages (each its own pair key and copy)."""
    root.mkdir(parents=True, exist_ok=True)
    broker = Broker(root / "broker")
    broker.start()
    src = root / "src.jsonl"
    dsts = [root / f"dst-{i}.jsonl" for i in range(standbys)]
    src.write_bytes(b"")
    stop, writing = root / "stop", root / "writing"
    procs = []
    try:
        for i, dst in enumerate(dsts):
            ready = root / f"ready-{i}"
            procs.append(_spawn("standby", str(broker.port), str(dst), str(ready), str(stop),
                                "0", crypto, str(i), str(standbys), raw=raw))
            wait_until(ready.exists, 30, "the standby to subscribe")
        procs.append(_spawn("writer", str(broker.port), str(src), str(window), str(stop),
                            str(writing), crypto, str(standbys)))
        wait_until(writing.exists, 30, "the writer to start")
        lines = ishiki_lines(2000).splitlines(keepends=True)
        n = int(rate * seconds)
        before = {p.pid: _cpu(p.pid) for p in procs}
        _, achieved = paced_appends([("k", src, lines[i % len(lines)]) for i in range(n)], rate)
        wait_until(lambda: all(d.exists() and d.stat().st_size == src.stat().st_size
                               for d in dsts), 60, "the standbys to catch up")
        used = {p.pid: _cpu(p.pid) - before[p.pid] for p in procs}
        assert all(d.read_bytes() == src.read_bytes() for d in dsts)
        standby_us = [1e6 * used[p.pid] / n for p in procs[:-1]]
        return {"achieved": achieved, "standby_us": max(standby_us),
                "standbys_us": standby_us, "writer_us": 1e6 * used[procs[-1].pid] / n}
    finally:
        stop.touch()
        for p in procs:
            p.wait(10)
        broker.stop()


def catchup(root: Path, megabytes: int, chunk: int, raw: bool = False,
            crypto: str = "ed25519") -> dict[str, float]:
    root.mkdir(parents=True, exist_ok=True)
    # No end-to-end flow control here (syncd has its fetch window): the broker queues instead.
    broker = Broker(root / "broker-cu", max_queued_messages=0)
    broker.start()
    src, dst = root / "big.jsonl", root / "big-copy.jsonl"
    block = ishiki_lines(2000)
    with src.open("wb") as f:
        while f.tell() < megabytes * 1_000_000:
            f.write(block)
    os.sync()
    size = src.stat().st_size
    stop, ready = root / "stop-cu", root / "ready-cu"
    procs = []
    try:
        procs.append(_spawn("standby", str(broker.port), str(dst), str(ready), str(stop),
                            str(SYNC_EVERY), crypto, raw=raw))
        wait_until(ready.exists, 30, "the standby to subscribe")
        t0 = time.monotonic()
        procs.append(_spawn("sender", str(broker.port), str(src), str(chunk), str(stop),
                            crypto))
        wait_until(lambda: dst.exists() and dst.stat().st_size == size, 600, "catch-up",
                   interval=0.02)
        took = time.monotonic() - t0
        cpu = {"standby": _cpu(procs[0].pid), "sender": _cpu(procs[1].pid)}
        return {"mb_s": size / 1e6 / took, "seconds": took, **{f"{k}_cpu_s": v
                                                                for k, v in cpu.items()}}
    finally:
        stop.touch()
        for p in procs:
            p.wait(10)
        broker.stop()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, port, path, *rest = sys.argv[2:]
        # The heap as `syncd run` sets it (ops/allocator.py): without it paho's reassembly of a
        # 1000 KiB frame maps and unmaps fresh pages, and the floor's standby spent 6.3 s of CPU
        # on 1 GB where syncd's spends 5 (docs/catch-up.md).
        allocator.tune()
        if role == "writer":
            writer(int(port), Path(path), float(rest[0]), Path(rest[1]), Path(rest[2]), rest[3],
                   int(rest[4]))
        elif role == "sender":
            catchup_sender(int(port), Path(path), int(rest[0]), Path(rest[1]), rest[2])
        else:
            standby(int(port), Path(path), Path(rest[0]), Path(rest[1]), int(rest[2]), rest[3],
                    *(int(x) for x in rest[4:6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--window", type=float, default=0.01,
                        help="seconds between the writer's looks; 0: no timer, woken by "
                             "inotify with group commit (syncd's default batching)")
    parser.add_argument("--standbys", type=int, default=1,
                        help="standbys reading the writer's messages (aes-gcm wraps the "
                             "frame key for each)")
    parser.add_argument("--catchup-mb", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=256 * 1024)
    parser.add_argument("--crypto", default="ed25519",
                        help="per-message protection, comma-separated: " + ", ".join(CRYPTO))
    parser.add_argument("--readers", default="paho,raw",
                        help="the standby's socket readers to measure: paho, raw or both")
    args = parser.parse_args()
    cryptos = [c.strip() for c in args.crypto.split(",") if c.strip()]
    if bad := [c for c in cryptos if c not in CRYPTO]:
        parser.error(f"--crypto: unknown {', '.join(bad)} (known: {', '.join(CRYPTO)})")
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    if bad := [r for r in readers if r not in ("paho", "raw")]:
        parser.error(f"--readers: unknown {', '.join(bad)} (known: paho, raw)")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="syncd-floor-") as tmp:
        for crypto in cryptos:
            for raw in (r == "raw" for r in readers):
                reader = "own socket reader" if raw else "paho"
                r = per_write(Path(tmp) / f"w-{crypto}-{raw}", args.rate, args.seconds,
                              args.window, raw, crypto, args.standbys)
                batching = (f"window {args.window * 1000:g} ms" if args.window > 0 else
                            "no window (inotify, group commit)")
                each = " / ".join(f"{us:.0f}" for us in r["standbys_us"])
                print(f"per write, {crypto}, {r['achieved']:.0f} writes/s, {batching}, "
                      f"{args.standbys} standby(s) reading with {reader}: writer "
                      f"{r['writer_us']:.0f} µs, standby {each} µs of CPU "
                      f"(load {os.getloadavg()[0]:.2f})")
                if args.catchup_mb:
                    c = catchup(Path(tmp) / f"c-{crypto}-{raw}", args.catchup_mb, args.chunk,
                                raw, crypto)
                    print(f"catch-up of {args.catchup_mb} MB in {args.chunk // 1024} KiB "
                          f"pieces, {crypto}, standby reading with {reader}: "
                          f"{c['mb_s']:.0f} MB/s ({c['seconds']:.1f} s; CPU: sender "
                          f"{c['sender_cpu_s']:.1f} s, standby {c['standby_cpu_s']:.1f} s; "
                          f"load {os.getloadavg()[0]:.2f})")
                    shutil.rmtree(Path(tmp) / f"c-{crypto}-{raw}")


if __name__ == "__main__":
    main()
