"""The daemon: finds instance keys, owns their replicas, and wires watcher, sweep and link.

It routes, it does not decide: frames go to the replica of their (key, file), filesystem hints
to the replica of their path. It also answers the control socket (`syncd status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from syncd import frames, logs, retire
from syncd.config import Config, ConfigError, load_config
from syncd.errors import SyncdError
from syncd.events import (
    Event,
    PeerData,
    PeerOnline,
    PeerPos,
    PeerProbe,
    PeerProbed,
    PeerRefuse,
    PeerRequest,
)
from syncd.frames import FrameError, Kind
from syncd.freshness import ReplayGuard
from syncd.groupsync import GroupSync
from syncd.link import Link
from syncd.machine import (
    Tuning,
)
from syncd.persist import RecordStore
from syncd.replica import Replica
from syncd.retire import Retired, Seen
from syncd.scrub import scrub_forever
from syncd.secret import SecretError, load_secret
from syncd.telemetry import Telemetry
from syncd.watcher import Watcher

log = logging.getLogger("syncd.node")

SOCKET_NAME = "syncd.sock"
ADOPT_STALL_SECONDS = 60


def _event(kind: Kind, sender: str, body: frames.Payload) -> Event | None:
    """The machine event a peer's frame is (None for a body that does not fit its kind)."""
    match kind, body:
        case Kind.POS, frames.Announce():
            return PeerPos(sender, body)
        case (Kind.LIVE | Kind.FILL), frames.Data():
            return PeerData(sender, body)
        case Kind.REQ, frames.Request():
            return PeerRequest(sender, body)
        case Kind.REFUSE, frames.Refuse():
            return PeerRefuse(sender, body)
        case Kind.PROBE, frames.Probe():
            return PeerProbe(sender, body)
        case Kind.PROBED, frames.Probed():
            return PeerProbed(sender, body)
    return None


class StartupError(SyncdError):
    """The daemon cannot start (directories, permissions); the message says what to fix."""


class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.node = config.node
        self.chunk_bytes = config.chunk_bytes
        self.fetch_window = config.fetch_window_bytes
        self.request_timeout = config.request_timeout
        self.persist_interval = config.persist_interval
        self.state_dir = config.state_dir
        self.busy = 0
        self.syncer = GroupSync()
        self.records = RecordStore(config.state_dir)
        self.replicas: dict[tuple[str, str], Replica] = {}
        self.presence: dict[str, bool] = {}
        # node -> wall time its presence last changed as heard here (first heard, at start):
        # readiness says how long a peer has been offline.
        self.presence_since: dict[str, float] = {}
        self._connected_at: float | None = None  # wall time of the last broker connection
        self.rejected = 0
        self._refused_keys: set[str] = set()
        self._listed_mtime: int | None = None
        self._last_reject_log = 0.0
        self._prefix = config.mqtt.topic_prefix
        self.secret = b""  # read in check_dirs(), before anything is sent or accepted
        self._sid = secrets.token_hex(8)
        self._seq = itertools.count()
        self._guard = ReplayGuard()
        self.link = Link(config, self._on_message, self._on_connected, self.seal)
        self._watcher = Watcher(config.runtimes_dir, self._on_hint)
        self._stop = asyncio.Event()
        self._durable_hooks: list[Callable[[str, str, int], None]] = []
        self.started = time.time()
        self.telemetry = Telemetry(time.monotonic())
        self.retired = Retired()  # read in run(), once state_dir is known to be usable
        self._chores: set[asyncio.Task[None]] = set()  # referenced until done (asyncio docs)

    # --- Host protocol for replicas ---------------------------------------------------------

    def send(self, kind: Kind, key: str, file: str, payload: frames.Payload, to: str = "",
             retain: bool = False) -> None:
        topic = frames.topic_for(self._prefix, frames.Topic(kind, self.node, key, file, to))
        sealed = self.seal(topic, payload, None)
        self.telemetry.count("sent", kind.value, len(sealed))
        self.link.publish(topic, sealed, retain=retain)

    def seal(self, topic: str, payload: frames.Payload, ts: int | None) -> bytes:
        """Encode and authenticate a frame for `topic`, stamped with our session and order."""
        stamp = frames.Stamp(self._sid, next(self._seq),
                             time.time_ns() // 1_000_000 if ts is None else ts)
        return frames.encode(payload, stamp, self.secret, topic)

    def role_of(self, key: str) -> str:
        return self.config.role_of(key)

    def tuning(self) -> Tuning:
        return Tuning(chunk_bytes=self.chunk_bytes, fetch_window=self.fetch_window,
                      request_timeout=self.request_timeout,
                      persist_interval=self.persist_interval)

    def is_online(self, node: str) -> bool:
        return self.presence.get(node, False)

    def offline_since(self, node: str) -> float | None:
        if self.presence.get(node, True):
            return None
        return self.presence_since.get(node)

    def connected_since(self) -> float | None:
        return self._connected_at if self.link.connected.is_set() else None

    def durable(self, key: str, file: str, size: int) -> None:
        self.telemetry.durable(key, file, size, time.time(), time.monotonic())
        for hook in self._durable_hooks:
            hook(key, file, size)

    def on_durable(self, hook: Callable[[str, str, int], None]) -> None:
        """Call `hook(key, file, size)` each time bytes become durable here (tests, bench)."""
        self._durable_hooks.append(hook)

    # --- lifetime ---------------------------------------------------------------------------

    def check_dirs(self) -> None:
        """Refuse to start, saying what to fix, unless directories and secret are usable."""
        try:
            self.secret = load_secret(self.config.secret_file)
        except SecretError as e:
            raise StartupError(str(e)) from None
        rt, sd = self.config.runtimes_dir, self.config.state_dir
        if not rt.is_dir():
            raise StartupError(f"runtimes_dir {rt} does not exist or is not a directory "
                               "(create it, or fix runtimes_dir in the config)")
        if not os.access(rt, os.R_OK | os.W_OK | os.X_OK):
            raise StartupError(f"runtimes_dir {rt} is not readable and writable by this user")
        try:
            sd.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StartupError(f"state_dir {sd} cannot be created: {e.strerror}") from None
        if not os.access(sd, os.R_OK | os.W_OK | os.X_OK):
            raise StartupError(f"state_dir {sd} is not readable and writable by this user")

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Run until `stop()`; `ready` is called once replicas are loaded and the link is up."""
        self.check_dirs()
        try:
            self.retired = retire.load(self.state_dir)
        except ValueError as e:
            log.error("%s; retired nodes are forgotten until `syncd forget` runs again", e)
        self._discover()
        if self.config.watch:
            self._watcher.start()
        else:
            log.info("watch = false: changes are found by the stat sweep every %.2gs",
                     self.config.sweep_interval)
        tasks = [
            asyncio.create_task(self.link.run(), name="link"),
            asyncio.create_task(self._sweep_forever(), name="sweep"),
            asyncio.create_task(scrub_forever(self), name="scrub"),
        ]
        server = await asyncio.start_unix_server(self._serve_control, self.socket_path)
        os.chmod(self.socket_path, 0o660)
        log.info("node %s watching %s (%d files), state in %s", self.node,
                 self.config.runtimes_dir, len(self.replicas), self.config.state_dir)
        try:
            stop = asyncio.create_task(self._stop.wait())
            if ready is not None:
                # Not past a stop or a failure: SIGTERM must work while the broker is away.
                waiting = asyncio.create_task(self._wait_ready())
                await asyncio.wait([waiting, stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    ready()
                waiting.cancel()
            # A background task that ends on its own is a bug: stop loudly, not half-working.
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if stop not in done:
                stop.cancel()
                broken = done.pop()
                raise RuntimeError(f"internal task {broken.get_name()} ended: "
                                   f"{broken.exception()!r}")
        finally:
            server.close()
            self._watcher.stop()
            await self.link.close()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            for r in self.replicas.values():
                await r.stop()
            await self.syncer.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            log.info("node %s stopped", self.node)

    def stop(self) -> None:
        self._stop.set()

    async def reload_from_source(self, expected: str | None = None) -> dict[str, Any]:
        """Re-read the config file we started from and apply it (SIGHUP, `syncd reload`).

        A file that does not load changes nothing; the reply says why, for `syncd reload` to
        show (systemctl reload then fails) and the log too (a bare SIGHUP has nobody to tell).
        `expected`: the file the caller checked; another one is refused, not reloaded.
        """
        source = self.config.source
        assert source is not None
        if expected is not None and not _same_file(expected, source):
            return {"ok": False, "config": str(source),
                    "error": f"this daemon runs {source}, not {expected}"}
        try:
            config = load_config(source)
        except ConfigError as e:
            log.error("reload refused, keeping the running configuration: %s", e)
            return {"ok": False, "error": f"config error: {e}", "config": str(source)}
        needs_restart = await self.reload(config)
        return {"ok": True, "config": str(source), "files": len(self.replicas),
                "needs_restart": needs_restart}

    async def reload(self, config: Config) -> list[str]:
        """Apply a re-read config (SIGHUP): new and removed keys, file lists, roles, tuning.

        Identity and wiring (node, directories, broker) need a restart; they are kept as they
        were, the log says so, and their names are returned.
        """
        fixed = ("node", "runtimes_dir", "state_dir", "mqtt")
        changed = [name for name in fixed if getattr(config, name) != getattr(self.config, name)]
        if changed:
            log.warning("reload: %s changed; that takes a restart (keeping the running values)",
                        ", ".join(changed))
            config = dataclasses.replace(config, **{n: getattr(self.config, n) for n in fixed})
        self.config = config
        self.chunk_bytes = config.chunk_bytes
        self.fetch_window = config.fetch_window_bytes
        self.request_timeout = config.request_timeout
        self.persist_interval = config.persist_interval
        for (key, file), r in list(self.replicas.items()):
            if not config.wants_key(key) or file not in config.files_of(key):
                await r.stop()
                del self.replicas[(key, file)]
                log.info("reload: %s is no longer replicated", r.name)
            else:
                r.machine.tuning = self.tuning()
                if r.machine.role != config.role_of(key):
                    log.info("reload: %s role %s -> %s", r.name, r.machine.role,
                             config.role_of(key))
                    r.set_role(config.role_of(key))
        before = len(self.replicas)
        self._discover(force=True)
        log.info("reload: configuration applied (%d files, %d new)", len(self.replicas),
                 len(self.replicas) - before)
        return changed

    @property
    def socket_path(self) -> Path:
        return self.config.state_dir / SOCKET_NAME

    async def _wait_ready(self) -> None:
        await self.link.connected.wait()
        for r in list(self.replicas.values()):
            await r.loaded.wait()

    # --- discovery and hints ----------------------------------------------------------------

    def _replica(self, key: str, file: str) -> Replica | None:
        r = self.replicas.get((key, file))
        if r is None:
            if not self.config.wants_key(key) or file not in self.config.files_of(key):
                return None
            folder = self.config.runtimes_dir / key
            if folder.is_symlink():
                # A key must be a directory of its own under runtimes_dir, not a way out of it.
                if key not in self._refused_keys:
                    self._refused_keys.add(key)
                    log.error("%s is a symbolic link; key %s is not replicated", folder, key)
                return None
            r = Replica(self, key, file, folder / file)
            self.replicas[(key, file)] = r
            # The replica's task inherits this context: its log lines carry key and file as
            # fields (JSON logs) without every call passing them.
            token = logs.FIELDS.set({"key": key, "file": file})
            try:
                r.start()
            finally:
                logs.FIELDS.reset(token)
            chore = asyncio.get_running_loop().create_task(self._after_load(r))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)
        return r

    async def _after_load(self, r: Replica) -> None:
        await r.loaded.wait()
        self.telemetry.baseline(r.key, r.file, r.machine.position.size)
        # Divergences recorded before a restart may name a node retired since.
        for node in list(self.retired.nodes):
            r.forget_peer(node)

    def _discover(self, force: bool = False) -> None:
        # A new key directory changes the runtimes directory's mtime: skip the listing when
        # it has not (the sweep calls this every second).
        try:
            mtime = self.config.runtimes_dir.stat().st_mtime_ns
        except OSError:
            mtime = None
        if not force and mtime is not None and mtime == self._listed_mtime:
            return
        self._listed_mtime = mtime
        try:
            entries = list(os.scandir(self.config.runtimes_dir))
        except OSError as e:
            log.error("cannot list runtimes_dir %s: %s", self.config.runtimes_dir, e.strerror)
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and self.config.wants_key(entry.name):
                for file in self.config.files_of(entry.name):
                    self._replica(entry.name, file)

    def _on_hint(self, path: str, gone: bool = False) -> None:
        root = str(self.config.runtimes_dir)
        parts: tuple[str, ...] = ()
        if path.startswith(root) and path[len(root) : len(root) + 1] == "/":
            # The watcher joins names to the root's own text: split it without pathlib.
            parts = tuple(path[len(root) + 1 :].split("/"))
        if not parts or "" in parts or "." in parts or ".." in parts:
            try:
                parts = Path(path).relative_to(self.config.runtimes_dir).parts
            except ValueError:
                return
        if len(parts) == 1:
            if self.config.wants_key(parts[0]):
                for file in self.config.files_of(parts[0]):
                    r = self._replica(parts[0], file)
                    if r is not None:
                        r.hint_local()
        elif len(parts) == 2:
            found = self.replicas.get((parts[0], parts[1]))
            if found is None and Path(path).is_file():
                found = self._replica(parts[0], parts[1])
            if found is not None:
                found.hint_local(replaced=gone)

    async def _sweep_forever(self) -> None:
        # The safety net under the watcher: inotify can merge or drop events.
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            self._discover()
            for r in list(self.replicas.values()):
                r.sweep()

    # --- the link ---------------------------------------------------------------------------

    async def _on_connected(self) -> None:
        self._connected_at = time.time()
        for r in self.replicas.values():
            r.reconnected()

    def _on_message(self, topic: str, payload: bytes) -> None:
        if not payload:
            return  # a retained message being cleared (`syncd forget`): says nothing
        try:
            t = frames.parse_topic(self._prefix, topic)
            if t.sender == self.node:
                return  # our own live bytes and retained positions echo back: not news
            if t.kind is not Kind.NODE and t.sender in self.retired:
                return  # a retired node's frames no longer count (see retire.py)
            stamp, body = frames.decode(t.kind, payload, max(self.chunk_bytes, 16 << 20),
                                        self.secret, topic)
        except FrameError as e:
            self._reject(topic, str(e))
            return
        stale = self._guard.check(t.kind, t.sender, t.key, t.file, stamp)
        if stale is not None:
            self._reject(topic, stale, t.sender)
            return
        self.telemetry.count("received", t.kind.value, len(payload))
        if t.kind is Kind.NODE:
            assert isinstance(body, frames.Presence)
            seen = self.retired.on_presence(t.sender, body.online, body.retired, stamp.ts)
            if seen is Seen.RETIRE:
                self._forget(t.sender, stamp.ts)
                return
            if seen is Seen.IGNORE:
                return
            if seen is Seen.RETURN:
                self.retired.back(t.sender)
                self._save_retired()
                log.warning("retired node %s is back (a fresh presence): replicating with it "
                            "again", t.sender, extra={"peer": t.sender})
            was = self.presence.get(t.sender)
            self.presence[t.sender] = body.online
            if was != body.online:
                self.presence_since[t.sender] = time.time()
                log.info("peer %s is %s", t.sender, "online" if body.online else "offline",
                         extra={"peer": t.sender})
                for each in self.replicas.values():
                    each.deliver(PeerOnline(t.sender, body.online))
            return
        event = _event(t.kind, t.sender, body)
        replica = self._replica(t.key, t.file) if event is not None else None
        if replica is not None and event is not None:
            if t.kind is Kind.LIVE and replica.machine.frozen is None:
                assert isinstance(body, frames.Data)
                self.telemetry.expect(t.key, t.file, t.sender, body.end, stamp.ts,
                                      replica.machine.position.size)
            replica.deliver(event)

    def _forget(self, node: str, ts: int) -> None:
        """A retirement notice: drop `node` from presence, every file and the metrics."""
        self.retired.retire(node, ts)
        self._save_retired()
        self.presence.pop(node, None)
        self.telemetry.forget(node)
        for r in self.replicas.values():
            if r.loaded.is_set():  # else _after_load does it
                r.forget_peer(node)
        log.warning("node %s was retired (syncd forget): dropped from status and metrics",
                    node, extra={"peer": node})

    def _save_retired(self) -> None:
        try:
            retire.save(self.state_dir, self.retired)
        except OSError as e:
            log.error("cannot record retired nodes in %s: %s", self.state_dir, e)

    def _reject(self, topic: str, reason: str, sender: str | None = None) -> None:
        self.rejected += 1
        self.telemetry.reject(reason)
        now = time.monotonic()
        # One line per 10 s at most: a hostile client must not flood the log.
        if now - self._last_reject_log >= 10:
            self._last_reject_log = now
            log.warning("rejected frame on %r: %s (%d rejected so far)", topic[:200], reason,
                        self.rejected, extra={"peer": sender} if sender else None)

    # --- control socket ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        files = [r.status() for _, r in sorted(self.replicas.items())]
        ready = sum(1 for f in files if f["ready"])
        now = time.monotonic()
        for f in files:
            peers: dict[str, dict[str, Any]] = f["peers"]  # type: ignore[assignment]
            for p in peers.values():
                p["lag_seconds"] = round(self.telemetry.lag_seconds(
                    f["key"], f["file"], p["size"], f["size"], now), 3)  # type: ignore[arg-type]
            self.telemetry.prune(f["key"], f["file"],  # type: ignore[arg-type]
                                 min((p["size"] for p in peers.values()), default=0))
        return {
            "node": self.node,
            "broker": self.link.broker,
            "connected": self.link.connected.is_set(),
            "connected_since": self.connected_since(),
            "peers": {n: {"online": o, "since": self.presence_since.get(n)}
                      for n, o in sorted(self.presence.items())},
            "ready_count": {"yes": ready, "no": len(files) - ready},
            "rejected_frames": self.rejected,
            "uptime_s": round(time.time() - self.started, 1),
            "files": files,
        }

    async def _serve_control(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            request = orjson.loads(line) if line.strip() else {}
            cmd = request.get("cmd") if isinstance(request, dict) else None
            if cmd == "status":
                reply: dict[str, Any] = {"ok": True, "status": self.status()}
            elif cmd == "adopt":
                reply = await self._adopt(request, writer)
            elif cmd == "reload":
                expected = request.get("config")
                reply = await self.reload_from_source(expected if isinstance(expected, str)
                                                      else None)
            else:
                reply = {"ok": False, "error": f"unknown command {cmd!r}"}
            writer.write(orjson.dumps(reply) + b"\n")
            await writer.drain()
        except (TimeoutError, orjson.JSONDecodeError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _adopt(self, request: dict[str, Any], writer: asyncio.StreamWriter
                     ) -> dict[str, Any]:
        """Operator's resolution: archive our copies of KEY and take SOURCE's (streams progress).

        SOURCE may be this node: then our copy as it is now becomes the truth again (after a
        deliberate reset, say) and the peers that hold another history show as diverged until
        they adopt ours.
        """
        key, source = request.get("key"), request.get("source")
        if not isinstance(key, str) or not self.config.wants_key(key):
            return {"ok": False, "error": f"{key!r} is not an instance key this node replicates"}
        if not isinstance(source, str):
            return {"ok": False, "error": "no source node given"}
        if source != self.node:
            if source not in self.presence:
                known = ", ".join(sorted(self.presence)) or "none"
                return {"ok": False, "error": f"unknown node {source!r} (known peers: {known})"}
            if not self.presence[source]:
                return {"ok": False, "error": f"{source} is offline; its copy cannot be fetched "
                                              "now"}
        replicas = [r for f in self.config.files_of(key)
                    if (r := self._replica(key, f)) is not None]
        for r in replicas:
            await r.loaded.wait()
            if source != self.node and source not in r.machine.peers:
                return {"ok": False, "error": f"{source} has announced no copy of {r.name}"}
        results = []
        for r in replicas:
            done: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
            r.adopt(source, done)
            last, moved_at = -1, time.monotonic()
            while not done.done():
                have, total = r.machine.adoption_progress()
                if have != last:
                    last, moved_at = have, time.monotonic()
                elif time.monotonic() - moved_at > ADOPT_STALL_SECONDS:
                    return {"ok": False, "error": (
                        f"{r.name}: no progress from {source} for {ADOPT_STALL_SECONDS}s "
                        f"(at {have} of {total} bytes); the local copy is already archived and "
                        "the fetch goes on in the background: watch syncd status")}
                writer.write(orjson.dumps({"progress": {"file": r.name, "done": have,
                                                        "total": total}}) + b"\n")
                await writer.drain()
                await asyncio.wait([done], timeout=0.2)
            result = done.result()
            if "error" in result:
                return {"ok": False, "error": f"{r.name}: {result['error']}"}
            results.append(result)
        return {"ok": True, "adopted": results}


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
