"""`syncd demo`: two real nodes replicating through an embedded broker, on this machine only.

Nothing to install or configure: an amqtt broker runs inside this process on a free loopback
port, two `syncd run` processes replicate between temporary runtime directories, and one bot
per host appends Ishiki-shaped memory lines the way the real writer does (one write per
entry). The daemons, files and wire protocol are the real ones; only the broker stands in
for Mosquitto.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import secrets
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from syncd.control import ControlError, query

NODES = ("host-a", "host-b")
BOTS = {"bot-1": "host-a", "bot-2": "host-b"}  # where each bot runs (writes)
FILE = "events.jsonl"
START_TIMEOUT = 20.0
CONVERGE_TIMEOUT = 20.0


def write_config(root: Path, node: str, port: int) -> Path:
    """The one place the demo writes a node's config (and the cluster secret they share)."""
    secret = root / "cluster.key"
    if not secret.exists():
        secret.write_text(secrets.token_urlsafe(32) + "\n")
        secret.chmod(0o600)
    home = root / node
    (home / "runtimes").mkdir(parents=True, exist_ok=True)
    config = home / "syncd.toml"
    config.write_text(
        f'node = "{node}"\n'
        'runtimes_dir = "runtimes"\n'
        'state_dir = "state"\n'
        f'secret_file = "{secret}"\n'
        "\n[mqtt]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        "reconnect_min = 0.1\n"
        "reconnect_max = 2.0\n"
    )
    return config


def runtimes(root: Path, node: str) -> Path:
    return root / node / "runtimes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DemoError(Exception):
    """The demo could not run; the message says why."""


class EmbeddedBroker:
    """amqtt on 127.0.0.1 only, anonymous (nothing but this machine can reach it)."""

    def __init__(self, log_file: Path) -> None:
        self.port = 0
        self._broker: Any = None
        # amqtt is chatty; its log goes to a file beside the nodes' logs.
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        for name in ("amqtt", "transitions"):
            logger = logging.getLogger(name)
            logger.handlers[:] = [handler]
            logger.propagate = False
            logger.setLevel(logging.INFO)

    async def start(self) -> None:
        try:
            from amqtt.broker import Broker
        except ImportError:
            raise DemoError("the demo needs its embedded broker: pip install '.[demo]' in "
                            "the syncd checkout (or pip install amqtt)") from None
        for _ in range(3):  # a free port can be taken between probing and binding
            self.port = free_port()
            self._broker = Broker({
                "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                            {"allow_anonymous": True}},
            })
            try:
                await self._broker.start()
                return
            except Exception as e:  # amqtt wraps bind errors in its own BrokerError
                last = e
        raise DemoError(f"cannot start the embedded broker: {last}")

    async def stop(self) -> None:
        if self._broker is not None:
            with contextlib.suppress(Exception):
                await self._broker.shutdown()


class NodeProcess:
    """One `syncd run` subprocess."""

    def __init__(self, root: Path, node: str, port: int) -> None:
        self.node = node
        self.config = write_config(root, node, port)
        self.socket = root / node / "state" / "syncd.sock"
        self.log = root / node / "syncd.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "syncd", "run", "--config", str(self.config),
                stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL)

    async def status(self) -> dict[str, Any] | None:
        try:
            reply = await asyncio.to_thread(query, self.socket, "status", 2.0)
        except ControlError:
            return None
        status: dict[str, Any] = reply["status"]
        return status

    async def wait_connected(self) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                raise DemoError(f"{self.node} exited; its log ({self.log}) ends with:\n"
                                + self.log.read_text(errors="replace")[-2000:])
            status = await self.status()
            if status and status["connected"]:
                return status
            await asyncio.sleep(0.05)
        raise DemoError(f"{self.node} did not connect within {START_TIMEOUT:.0f}s; see {self.log}")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


_SAID = [
    "今天的会议改到下午三点了吗？", "帮我查一下明天上海的天气", "把这张图里的文字识别出来",
    "Can you summarise the thread above?", "What did we decide about the release date?",
    "提醒我周五交报告", "这个报错是什么意思：ECONNRESET", "Translate this into Japanese, please.",
]
_ANSWERS = [
    "好的，已经帮你记下了。", "明天上海多云，最高 21°C，最低 14°C。",
    "The thread agrees on shipping on the 12th, pending the security review.",
    "ECONNRESET 表示对端在连接中途把它关掉了，通常是服务器重启或超时。", "已设置提醒：周五 09:00。",
]
_TOOLS = [("search", {"query": "上海 天气 明天"}), ("read", {"url": "asset://image-1"}),
          ("calendar.add", {"title": "交报告", "at": "Fri 09:00"})]


class Bot:
    """Appends whole turns to one events.jsonl, one write per entry, like the real writer."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path = path
        self.rng = rng
        self.turns = 0
        path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, entry: dict[str, Any]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, orjson.dumps(entry) + b"\n")
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        """One turn: the user's message, tool call and result, the answer, turn.done."""
        now = time.time_ns() // 1_000_000
        turn, call = str(uuid.uuid4()), f"call_{uuid.uuid4().hex[:10]}"
        tool, args = self.rng.choice(_TOOLS)
        tokens_in, tokens_out = self.rng.randint(500, 4000), self.rng.randint(10, 200)
        usage = {"inputTokens": tokens_in, "inputTokenDetails": {}, "outputTokens": tokens_out,
                 "outputTokenDetails": {}, "totalTokens": tokens_in + tokens_out}

        def entry(kind: str, data: dict[str, Any], in_turn: bool = True) -> dict[str, Any]:
            e = {"id": str(uuid.uuid4()), "type": kind, "data": data, "timestamp": now}
            return {**e, "turnId": turn} if in_turn else e

        def message(role: str, **fields: Any) -> dict[str, Any]:
            return {"id": str(uuid.uuid4()), "timestamp": now, "role": role, **fields}

        return [
            entry("message", message("custom", type="ishiki.message.created", data={
                "platform": "demo", "selfId": "bot", "channelId": "channel",
                "messageId": f"m{self.turns}", "timestamp": now,
                "content": self.rng.choice(_SAID), "isDirect": True,
                "user": {"id": "u1", "name": "阿岚"}}), in_turn=False),
            entry("event", {"type": "turn.start", "turnId": turn}),
            entry("message", message("assistant", content=[
                {"type": "tool-call", "toolCallId": call, "toolName": tool, "input": args}],
                usage=usage, finishReason="tool-calls")),
            entry("message", message("tool", content=[
                {"type": "tool-result", "toolCallId": call, "toolName": tool,
                 "output": {"type": "text", "value": "ok"}}])),
            entry("message", message("assistant", content=[
                {"type": "text", "text": self.rng.choice(_ANSWERS)}], usage=usage,
                finishReason="stop")),
            entry("event", {"type": "turn.done", "turnId": turn, "usage": usage}),
        ]

    async def write_turn(self, pause: float) -> None:
        for e in self.entries():
            self._append(e)
            await asyncio.sleep(pause)
        self.turns += 1


@dataclass(frozen=True)
class Copy:
    key: str
    node: str
    size: int
    writer: bool


@dataclass(frozen=True)
class Outcome:
    identical: bool
    files: dict[str, list[Path]]  # key -> its copies
    statuses: dict[str, dict[str, Any]]  # node -> final `syncd status` document


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def copies(root: Path) -> list[Copy]:
    return [Copy(key, node, size(runtimes(root, node) / key / FILE), BOTS[key] == node)
            for key in BOTS for node in NODES]


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


async def run(root: Path, seconds: float, show: Callable[[float, list[Copy]], None],
              say: Callable[[str], None], every: float = 0.25) -> Outcome:
    """Run the whole scenario in `root`; `show` is called every `every` seconds."""
    broker = EmbeddedBroker(root / "broker.log")
    await broker.start()
    nodes = {n: NodeProcess(root, n, broker.port) for n in NODES}
    try:
        for node in nodes.values():
            await node.start()
        for node in nodes.values():
            await node.wait_connected()
        say(f"broker 127.0.0.1:{broker.port} (embedded), nodes {' and '.join(NODES)} "
            "connected")
        rng = random.Random()
        bots = [Bot(runtimes(root, host) / key / FILE, rng) for key, host in BOTS.items()]
        started = time.monotonic()

        async def write(bot: Bot) -> None:
            while time.monotonic() - started < seconds:
                await bot.write_turn(rng.uniform(0.005, 0.03))

        writers = [asyncio.create_task(write(b)) for b in bots]
        while not all(w.done() for w in writers):
            show(time.monotonic() - started, copies(root))
            await asyncio.wait(writers, timeout=every)
        for w in writers:
            w.result()
        identical = await _converge(root, started, show, every)
        statuses = await _settled(nodes) if identical else {}
    finally:
        for node in nodes.values():
            await node.stop()
        await broker.stop()
    files = {key: [runtimes(root, n) / key / FILE for n in NODES] for key in BOTS}
    return Outcome(identical, files, statuses)


async def _converge(root: Path, started: float, show: Callable[[float, list[Copy]], None],
                    every: float) -> bool:
    """Wait for every copy to hold the writer's bytes, then compare them byte for byte."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while time.monotonic() < deadline:
        now = copies(root)
        show(time.monotonic() - started, now)
        if all(c.size == next(w.size for w in now if w.key == c.key and w.writer) for c in now):
            break
        await asyncio.sleep(every / 5)
    return all(len({sha256(runtimes(root, n) / key / FILE) for n in NODES}) == 1
               for key in BOTS)


async def _settled(nodes: dict[str, NodeProcess]) -> dict[str, dict[str, Any]]:
    """Each node's status once every file is in_sync (positions announced) and ready (its log
    checks caught up: they run at most once a second per file), or after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        statuses = {n: s for n, node in nodes.items() if (s := await node.status())}
        settled = len(statuses) == len(nodes) and all(
            f["state"] == "in_sync" and f["ready"] for s in statuses.values() for f in s["files"])
        if settled or time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.05)


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
