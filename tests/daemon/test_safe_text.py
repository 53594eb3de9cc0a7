"""Text from the network never reaches the operator's terminal raw: escapes, C1, bidi.

The pure functions, `syncd status`'s rendering of a status that holds a hostile peer's freeze
reason, and, end to end, a divergence whose other side's line is full of escape sequences.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import orjson

from syncd.cli.status import ready_report, render
from syncd.cli.verify import render_report
from syncd.core.logcheck import LogChecker
from syncd.core.safe_text import safe, safe_json, safe_tree
from tests.daemon.test_divergence import located
from tests.support.cluster import Broker, Daemon
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines
from tests.unit.test_cli_status import PEER, STATUS

# Set the window title, clear the screen, red text, a C1 CSI, a bidi override, a fake line.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\u202eevil\nsyncd: all good\r"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def is_clean(text: str) -> bool:
    return not any(c in text for c in RAW)


def test_safe_escapes_every_control_and_keeps_the_rest() -> None:
    assert safe(HOSTILE) == ("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b1m\\u202eevil\\x0a"
                             "syncd: all good\\x0d")
    assert safe('{"content":"你好 \\"quoted\\" \\\\n"}') == '{"content":"你好 \\"quoted\\" \\\\n"}'
    assert safe("\t\x7f\u2066") == "\\x09\\x7f\\u2066"
    assert safe(12) == "12"


def test_safe_tree_escapes_keys_and_values_at_any_depth() -> None:
    tree = {"peers": {HOSTILE: {"reason": [HOSTILE, 3, None]}}, "n": 1.5}
    cleaned = safe_tree(tree)
    (name, inner), = cleaned["peers"].items()
    assert is_clean(name) and is_clean(inner["reason"][0]) and inner["reason"][1:] == [3, None]
    assert cleaned["n"] == 1.5


def test_safe_json_keeps_the_values() -> None:
    value = {"k\u202e": HOSTILE, "n": [1, "\x9b"]}
    text = safe_json(orjson.dumps(value).decode())
    assert is_clean(text)
    assert orjson.loads(text) == value


def hostile_status() -> dict[str, Any]:
    status = copy.deepcopy(STATUS)
    f = status["files"][0]
    f["state"], f["ready"] = "diverged", False
    f["not_ready"] = [f"frozen: {HOSTILE}"]
    f["freeze"] = {"reason": "reset", "since": 0, "detail": HOSTILE}
    f["diverged"] = {"host-b": {"since": 0, "detail": HOSTILE, "line": 3, "offset": 10,
                                "ours": "fine", "theirs": HOSTILE}}
    f["peers"]["host-b"] = {**PEER, "frozen": HOSTILE}  # a peer announces its freeze reason
    f["note"] = HOSTILE
    return status


def test_status_output_escapes_peers_text() -> None:
    text = render(hostile_status())
    assert is_clean(text)
    assert "host-b=1.75 MiB \\x1b]0;pwned\\x07" in text
    assert "    host-b: \\x1b]0;pwned" in text
    assert "\nsyncd: all good" not in text  # no forged line
    ok, reasons = ready_report(hostile_status(), ("bot-1",))
    assert not ok and is_clean(reasons) and "frozen: \\x1b]0;pwned" in reasons


def test_verify_output_escapes_the_logs_text() -> None:
    checker = LogChecker()
    checker.feed(orjson.dumps({"type": HOSTILE}) + b"\n")  # valid JSON: counted by type
    text = render_report("events.jsonl", checker.report())
    assert is_clean(text) and "\\x1b" in text


def test_status_shows_a_peers_hostile_line_escaped(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, b = (make_daemon(n, broker) for n in "ab")
    data = ishiki_lines(10)
    append(a.path(KEY), data)
    wait_equal(data, b)
    lines = data.splitlines(keepends=True)
    # On a, line 6 is rewritten in place into raw escape sequences (not JSON: syncd does not
    # care); b shows a's line as "their line" when it locates the divergence.
    hostile = HOSTILE.replace("\n", " ").encode() + b"\n"
    a.path(KEY).write_bytes(b"".join(lines[:5]) + hostile + b"".join(lines[6:]))
    wait_state(b, "diverged")
    found = located(b, "a")
    assert "\x1b" in found["theirs"]  # the daemon hands the raw text to the CLI ...
    shown = subprocess.run([sys.executable, "-m", "syncd", "status", "--config",
                            str(b.config)], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 1
    assert "DIVERGED from a" in shown.stdout
    assert is_clean(shown.stdout)  # ... which prints it escaped
    assert "    a: \\x1b]0;pwned\\x07\\x1b[2J" in shown.stdout
    assert content(b.path(KEY)) == data
