"""Log formats: text for terminals, text for journald, JSON lines for shippers."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path

from syncd.daemon import logoutput
from tests.support.cluster import Broker, Daemon, wait_until


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("syncd.link", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_json_line_has_the_fields_and_extras() -> None:
    line = logoutput.JsonFormatter().format(_record("broker %s lost", "b:1883", peer="host-b",
                                               size=12))
    doc = json.loads(line)
    assert doc.pop("ts").endswith("Z")
    assert doc == {"level": "warning", "logger": "syncd.link", "msg": "broker b:1883 lost",
                   "peer": "host-b", "size": 12}


def test_json_line_carries_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("syncd", logging.ERROR, __file__, 1, "failed", None,
                                   sys.exc_info())
    doc = json.loads(logoutput.JsonFormatter().format(record))
    assert "ValueError: boom" in doc["exc"]


def test_journald_is_recognised_by_the_stream_itself(tmp_path: Path) -> None:
    with (tmp_path / "stream").open("w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logoutput.under_journald(stream, env)
        journal = logoutput.formatter("text", stream, env)
        assert journal.format(_record("lost")) == "<4>WARNING syncd.link: lost"
        # A child of a service that writes to a terminal or file of its own is not journald.
        assert not logoutput.under_journald(stream, {"JOURNAL_STREAM": f"{st.st_dev}:1"})
        plain = logoutput.formatter("text", stream, {})
        assert plain.format(_record("lost")).endswith(" WARNING syncd.link: lost")
        assert plain.format(_record("lost"))[:4].isdigit()  # starts with a timestamp
    assert not logoutput.under_journald(io.StringIO(), env)  # no file descriptor at all


def test_run_logs_json_lines(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    broker.start()
    daemon = Daemon(tmp_path, "a", broker, log_level="info", args=["--log-format", "json"])
    try:
        daemon.start()
        wait_until(lambda: "connected to broker" in daemon.read_log(), 5, "the connect line")
        daemon.stop()
        docs = [json.loads(line) for line in daemon.read_log().splitlines()]
        assert {"ts", "level", "logger", "msg"} <= set(docs[0])
        assert any(d["logger"] == "syncd.link" and d["msg"].startswith("connected to broker")
                   for d in docs)
        assert docs[-1]["msg"] == "node a stopped"
    finally:
        daemon.kill()
        broker.stop()


def test_json_line_carries_key_file_and_peer_of_the_task() -> None:
    fields = logoutput.FIELDS.set({"key": "bot-1", "file": "events.jsonl"})
    peer = logoutput.PEER.set("host-b")
    try:
        doc = json.loads(logoutput.JsonFormatter().format(_record("frozen")))
    finally:
        logoutput.PEER.reset(peer)
        logoutput.FIELDS.reset(fields)
    assert (doc["key"], doc["file"], doc["peer"]) == ("bot-1", "events.jsonl", "host-b")
    assert "key" not in json.loads(logoutput.JsonFormatter().format(_record("outside a task")))


def test_run_json_lines_name_key_file_and_peer(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    broker.start()
    a = Daemon(tmp_path, "a", broker, log_level="info", args=["--log-format", "json"])
    b = Daemon(tmp_path, "b", broker)
    for d, text in ((a, b'{"n": 1}\n{"n": 2}\n'), (b, b'{"n": 1}\n{"n": 3}\n')):
        d.path("bot-1").parent.mkdir(parents=True)
        d.path("bot-1").write_bytes(text)  # two histories: a divergence to log
    try:
        a.start()
        b.start()

        def diverged() -> dict[str, str] | None:
            docs = [json.loads(line) for line in a.read_log().splitlines()]
            return next((d for d in docs if "DIVERGED" in d["msg"]), None)

        doc = wait_until(diverged, 15, "a to log the divergence")
        assert (doc["key"], doc["file"], doc["peer"]) == ("bot-1", "events.jsonl", "b"), doc
    finally:
        a.kill()
        b.kill()
        broker.stop()
