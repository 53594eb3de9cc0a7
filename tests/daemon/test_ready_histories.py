"""READY end to end over states a live writer passes through: two real daemons, a real broker.

The issue's case first (a writer stopped while a tool runs: its call written, its result not),
then generated healthy histories (tests/support/ishiki_histories.py) stopped at drawn line
boundaries: at every cut the standby holds every byte and `syncd status --ready KEY` exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings

from syncd.core.refs import line_refs
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import append, content, wait_equal
from tests.support.ishiki_histories import History, Huge, histories
from tests.support.ishiki_writer import put_artifact

KEY = "bot-1"
TURN = "e061c676-0701-4e5c-b2c8-565cf9462c91"


def syncd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, ensure_ascii=False).encode() + b"\n"


def waiting_on_a_tool() -> bytes:
    """A message, turn.start, an assistant line with a tool call; no tool result yet."""
    asked = line({"id": "m-1", "type": "message", "data": {
        "id": "d-1", "timestamp": 1793531049892, "role": "custom",
        "type": "ishiki.message.created", "data": {
            "platform": "test", "selfId": "bot", "channelId": "channel", "messageId": "m1",
            "timestamp": 1793531049892, "content": "帮我看看 notes/cat.md", "isDirect": True,
            "user": {"id": "u1", "name": "阿岚"}}}, "timestamp": 1793531049900})
    start = line({"id": "e-1", "type": "event", "data": {"type": "turn.start", "turnId": TURN},
                  "timestamp": 1793531049903, "turnId": TURN})
    call = line({"id": "m-2", "type": "message", "data": {
        "id": "d-2", "timestamp": 1793531049957, "role": "assistant", "content": [
            {"type": "tool-call", "toolCallId": "call_8Jq2dM1xV4", "toolName": "read",
             "input": {"path": "notes/cat.md"}}],
        "finishReason": "tool-calls"}, "timestamp": 1793531049957, "turnId": TURN})
    return asked + start + call


def result_and_end() -> bytes:
    result = line({"id": "m-3", "type": "message", "data": {
        "id": "d-3", "timestamp": 1793531052001, "role": "tool", "content": [
            {"type": "tool-result", "toolCallId": "call_8Jq2dM1xV4", "toolName": "read",
             "output": {"type": "text", "value": "年糕喜欢在窗台上晒太阳。"}}]},
        "timestamp": 1793531052001, "turnId": TURN})
    done = line({"id": "e-2", "type": "event", "data": {"type": "turn.done", "turnId": TURN},
                 "timestamp": 1793531052010, "turnId": TURN})
    return result + done


def ready(d: Daemon, key: str = KEY) -> dict[str, Any] | None:
    f = d.file_status(key)
    return f if f.get("ready") is True else None


def test_a_standby_of_a_writer_waiting_on_a_tool_is_ready(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = make_daemon("a", broker), make_daemon("b", broker)
    log = waiting_on_a_tool()
    append(a.path(KEY), log)
    wait_equal(log, b)
    note = "tool call call_8Jq2dM1xV4 (read) at line 3 waits for its result"
    f = wait_until(lambda: (f := ready(b)) and any(n.startswith(note) for n in f["notes"])
                   and f, 15, "b ready, noting the pending tool call")
    assert f["state"] == "in_sync"
    done = syncd("status", "--config", str(b.config), "--ready", KEY)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = syncd("verify", str(b.path(KEY)))
    assert checked.returncode == 0, checked.stdout
    assert f"note: {note}" in checked.stdout
    # The result arrives and the turn ends: still ready, the note gone.
    append(a.path(KEY), result_and_end())
    wait_equal(log + result_and_end(), b)
    wait_until(lambda: (f := ready(b)) and not any("waits for its result" in n
                                                   for n in f["notes"]), 15, "b ready, no note")
    assert syncd("status", "--config", str(b.config), "--ready", KEY).returncode == 0


def test_a_result_still_missing_when_the_next_turn_starts_is_not_ready(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = make_daemon("a", broker), make_daemon("b", broker)
    later = line({"id": "e-9", "type": "event", "data": {"type": "turn.start", "turnId": "t2"},
                  "timestamp": 1793531060000, "turnId": "t2"})
    log = waiting_on_a_tool() + later
    append(a.path(KEY), log)
    wait_equal(log, b)
    wait_until(lambda: "unpaired_tool_call 1 (at line 3)" in " ".join(
        b.file_status(KEY).get("not_ready") or []), 15, "b not ready, naming the call's line")
    assert syncd("status", "--config", str(b.config), "--ready", KEY).returncode == 1


def drawn_histories(count: int, huge: Huge, at: int) -> list[History]:
    """`count` generated histories of some length (the first ones hypothesis draws are the
    smallest), the same on every run."""
    found: list[History] = []

    @seed(at)
    @settings(max_examples=40, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(histories(huge=huge))
    def collect(h: History) -> None:
        found.append(h)

    collect()
    found.sort(key=lambda h: -len(h.lines))
    return [h for h in found if len(h.lines) <= 80][:count]


def write_until(writer: Daemon, key: str, h: History, start: int, stop: int) -> None:
    """Append lines [start, stop) as the writer would: the artifacts a line references are
    written (blob, then sidecar) before the line."""
    instance = writer.path(key).parent
    for raw in h.lines[start:stop]:
        if b"artifact://" in raw:
            for ref in line_refs(raw, orjson.loads(raw)):
                if ref in h.artifacts:
                    tool, name = ref[len("artifact://"):].split("/", 1)
                    put_artifact(instance, tool, name, h.artifacts[ref])
        append(writer.path(key), raw)


def test_generated_histories_are_ready_at_every_cut(
    broker: Broker, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    a, b = make_daemon("a", broker), make_daemon("b", broker)
    drawn = [*drawn_histories(1, "always", 24), *drawn_histories(2, "never", 25)]
    assert len(drawn) == 3
    for n, h in enumerate(drawn):
        key = f"bot-h{n}"
        # Four cuts drawn from the history's own bytes, and its end.
        size = len(h.lines)
        cuts = sorted({1 + (int.from_bytes(h.lines[0][-9:-1], "big") * k) % size
                       for k in (3, 5, 7, 11)} | {size})
        written = 0
        for cut in cuts:
            write_until(a, key, h, written, cut)
            written = cut
            expected = b"".join(h.lines[:cut])
            wait_equal(expected, b, key=key, timeout=30)
            wait_until(lambda key=key: ready(b, key), 20,
                       f"b ready for {key} at a cut of {cut} lines")
            done = syncd("status", "--config", str(b.config), "--ready", key)
            assert done.returncode == 0, (cut, done.stdout)
        assert content(b.path(key)) == h.data
