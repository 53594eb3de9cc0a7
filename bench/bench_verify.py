"""How fast `syncd verify` checks a log: ~200 MB of Ishiki-shaped lines, one core.

    python3 bench/bench_verify.py [--mb 200] [--profile] [--against REF]

Writes the log to a temporary file (deleted afterwards), then reads it back in the CLI's 1 MiB
chunks through LogChecker and prints MB/s (MB = 10^6 bytes). The target is >= 100 MB/s.

The mix follows a live instance: per turn a platform message (sometimes with an attachment),
turn.start, one to three steps of assistant tool call + tool result (tool outputs range from a
line to tens of KB), ishiki.images / ishiki.codemode.store / ishiki.narrative now and then, a
closing assistant reply, turn.done; every few dozen turns a shake and a compact whose anchor
names an earlier entry. Text is mostly Chinese, so UTF-8 validation gets real work.

`--against REF` (a git commit or branch, e.g. main) also times that revision's
syncd/core/logcheck.py on the same log, runs alternating, and prints both, as wall-clock and
CPU time (the CPU time is what to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

# Run from a checkout without installing: `python3 bench/bench_verify.py`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncd.cli.verify import read_chunks
from syncd.core.logcheck import LogChecker

HAN = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    "同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自"
    "二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日"
    "那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变"
    "条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总"
    "次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指"
    "几九区强放决西被干做必战先回则任取据处理"
)
EMOJI = "😀🐱☀️"


def han(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(HAN) - 40)
    pieces = [HAN[start : start + 40]] * (n // 40 + 1)
    text = "".join(pieces)[:n]
    return text + (EMOJI[rng.randrange(3)] if rng.random() < 0.1 else "")


class Writer:
    """Ishiki entries in the order a live instance appends them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = 1793531049900
        self.ids: list[str] = []

    def new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def entry(self, entry_type: str, data: dict[str, Any], turn_id: str | None = None) -> bytes:
        self.clock += self.rng.randrange(1, 900)
        entry: dict[str, Any] = {
            "id": self.new_id(),
            "type": entry_type,
            "data": data,
            "timestamp": self.clock,
        }
        if turn_id is not None:
            entry["turnId"] = turn_id
        self.ids.append(entry["id"])
        return orjson.dumps(entry) + b"\n"

    def message(self, data: dict[str, Any], turn_id: str | None = None) -> bytes:
        return self.entry(
            "message", {"id": self.new_id(), "timestamp": self.clock, **data}, turn_id
        )

    def usage(self) -> dict[str, Any]:
        tokens = self.rng.randrange(2000, 30000)
        return {
            "inputTokens": tokens,
            "inputTokenDetails": {"cacheReadTokens": tokens // 2},
            "outputTokens": 120,
            "outputTokenDetails": {"reasoningTokens": 40},
            "totalTokens": tokens + 120,
        }

    def turn(self) -> Iterator[bytes]:
        rng = self.rng
        turn_id = self.new_id()
        yield self.message(
            {
                "role": "custom",
                "type": "ishiki.message.created",
                "data": {
                    "platform": "onebot",
                    "selfId": "bot",
                    "channelId": "channel-42",
                    "messageId": str(rng.randrange(10**9)),
                    "timestamp": self.clock,
                    "content": han(rng, rng.randrange(5, 200)),
                    "isDirect": False,
                    "user": {"id": "u1", "name": "阿岚"},
                },
            }
        )
        if rng.random() < 0.15:
            yield self.message(
                {
                    "role": "custom",
                    "type": "ishiki.attachment",
                    "data": {"source": "inbound", "items": [{"kind": "image", "url": "asset://x"}]},
                }
            )
        yield self.entry("event", {"type": "turn.start", "turnId": turn_id}, turn_id)
        for _ in range(rng.randrange(1, 4)):
            call_id = f"call_{rng.getrandbits(48):012x}"
            yield self.message(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "reasoning", "text": han(rng, rng.randrange(0, 300))},
                        {
                            "type": "tool-call",
                            "toolCallId": call_id,
                            "toolName": "read",
                            "input": {"path": f"notes/{rng.randrange(100)}.md"},
                        },
                    ],
                    "usage": self.usage(),
                    "finishReason": "tool-calls",
                },
                turn_id,
            )
            size = int(rng.paretovariate(1.2) * 300) % 40000
            yield self.message(
                {
                    "role": "tool",
                    "content": [
                        {
                            "type": "tool-result",
                            "toolCallId": call_id,
                            "toolName": "read",
                            "output": {"type": "text", "value": han(rng, size)},
                        }
                    ],
                },
                turn_id,
            )
            if rng.random() < 0.1:
                yield self.entry(
                    "ishiki.codemode.store",
                    {"writes": [{"key": "mood", "value": han(rng, 20)}]},
                    turn_id,
                )
        if rng.random() < 0.2:
            yield self.entry("ishiki.images", {"shown": ["a:0"], "released": ["a:0"]}, turn_id)
        yield self.message(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": han(rng, rng.randrange(10, 600))}],
                "usage": self.usage(),
                "finishReason": "stop",
            },
            turn_id,
        )
        if rng.random() < 0.3:
            yield self.entry("ishiki.narrative", {"text": han(rng, 120)}, turn_id)
        yield self.entry("event", {"type": "turn.done", "turnId": turn_id}, turn_id)
        if rng.random() < 0.03:
            yield self.entry("ishiki.chat.shake", {"digest": han(rng, 1500), "regions": []})
            anchor = self.ids[-rng.randrange(2, 20)]
            yield self.entry(
                "ishiki.chat.compact", {"summary": han(rng, 3000), "lastEntryId": anchor}
            )


def write_log(path: Path, megabytes: int) -> int:
    writer = Writer(seed=6)
    target = megabytes * 10**6
    written = 0
    with path.open("wb") as file:
        while written < target:
            batch = b"".join(writer.turn())
            file.write(batch)
            written += len(batch)
    return written


def check(path: Path, checker_class: Any = LogChecker) -> tuple[float, Any]:
    started = time.perf_counter()
    checker = checker_class()
    for chunk in read_chunks(path):
        checker.feed(chunk)
    report = checker.report()
    return time.perf_counter() - started, report


def checker_of(ref: str, folder: Path) -> Any:
    """LogChecker as revision `ref` has it (its logcheck.py, importing today's helpers)."""
    source = subprocess.run(["git", "show", f"{ref}:syncd/core/logcheck.py"], check=True,
                            capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    where = folder / "logcheck_ref.py"
    where.write_bytes(source.stdout)
    spec = importlib.util.spec_from_file_location("logcheck_ref", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["logcheck_ref"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.LogChecker


def compare(path: Path, size: int, ref: str, runs: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        theirs = checker_of(ref, Path(folder))
        best: dict[str, list[float]] = {ref: [1e9, 1e9], "this tree": [1e9, 1e9]}
        for _ in range(runs):
            for label, cls in ((ref, theirs), ("this tree", LogChecker)):
                cpu = time.process_time()
                seconds, _ = check(path, cls)
                cpu = time.process_time() - cpu
                best[label] = [min(best[label][0], seconds), min(best[label][1], cpu)]
        for label, (wall, cpu) in best.items():
            print(f"{label}: best of {runs} {wall:.2f} s = {size / 1e6 / wall:.0f} MB/s wall, "
                  f"{cpu:.2f} s = {size / 1e6 / cpu:.0f} MB/s CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="log size in MB (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    parser.add_argument("--against", metavar="REF",
                        help="also time this git revision's checker, alternating runs")
    args = parser.parse_args()

    handle, name = tempfile.mkstemp(suffix=".jsonl", prefix="bench-verify-")
    os.close(handle)
    path = Path(name)
    try:
        size = write_log(path, args.mb)
        best = float("inf")
        for _ in range(args.runs):
            seconds, report = check(path)
            best = min(best, seconds)
        print(
            f"{size / 1e6:.0f} MB, {report.lines} lines, {report.problem_total} problems: "
            f"best of {args.runs} {best:.2f} s = {size / 1e6 / best:.0f} MB/s"
        )
        if args.against:
            compare(path, size, args.against, args.runs)
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(check, path)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    finally:
        path.unlink()


if __name__ == "__main__":
    main()
