"""The control socket's client (syncd/ops/control.py) against a plain Unix socket."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import orjson
import pytest

from syncd.ops.control import Unreachable, query


def _fill_backlog(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    waiting = []
    while True:  # connect until the kernel says the backlog is full
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        if c.connect_ex(str(path)) != 0:
            c.close()
            return server, waiting
        waiting.append(c)


def test_a_full_backlog_is_waited_out_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "syncd.sock"
    server, waiting = _fill_backlog(path)
    answered = threading.Event()

    def serve() -> None:  # the daemon gets round to accepting: the queued, then ours
        while not answered.is_set():
            conn, _ = server.accept()
            with conn:
                conn.settimeout(1)
                try:
                    if conn.recv(1 << 16):
                        conn.sendall(orjson.dumps({"ok": True}) + b"\n")
                        answered.set()
                except TimeoutError:
                    pass

    # The daemon gets round to accepting 0.3 s after our connect met the full backlog.
    late = threading.Timer(0.3, serve)
    late.daemon = True
    late.start()
    try:
        for c in waiting:  # the queued clients say nothing and leave
            c.close()
        assert query(path, "status", timeout=10) == {"ok": True}
    finally:
        answered.set()
        server.close()


def test_a_backlog_that_stays_full_is_unreachable_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "syncd.sock"
    server, waiting = _fill_backlog(path)
    try:
        with pytest.raises(Unreachable, match=r"did not answer within 0\.2s"):
            query(path, "status", timeout=0.2)
    finally:
        for c in waiting:
            c.close()
        server.close()
