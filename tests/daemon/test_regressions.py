"""Regressions of issue #10: five interleavings in which the copies went wrong in silence.

Each test reproduces one case of the issue with real `syncd run` processes, a real Mosquitto
and real files, and asserts what the design promises instead (docs/design.md, "How it works"
and "States"; the simulator's invariants in docs/development.md). On the code before the
rewrite of `filetask.py` every one of them fails; the failure each one gives then is written in
its docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from tests.daemon.test_divergence import adopt, replicated_pair
from tests.support.cluster import Broker, Daemon, wait_until
from tests.support.files import KEY, append, content, wait_equal, wait_state
from tests.support.ishiki import ishiki_lines


def tail(data: bytes, since: int) -> str:
    return repr(data[since:][-200:])


def file_size_seen(d: Daemon, size: int) -> bool:
    """The daemon's last look at the file found `size` bytes (True when status has no
    `file_size`: then there is nothing to wait for)."""
    return bool(d.file_status(KEY).get("file_size", size) == size)


# --- 1 -----------------------------------------------------------------------------------------


def test_unfinished_local_line_is_never_spliced_onto_a_peers_line(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """#10, case 1: a standby's torn local line spliced onto a peer's line.

    Steps: A and B in sync (3 lines). B's writer appends `{"id": "` (no newline yet); A's writer
    appends `{"id": "3", "from": "a"}\\n`; once B has A's position, B's writer completes its line
    with `9", "from": "b"}\\n`.

    Correct: bytes past B's end that B did not write for a peer are B's own: B never appends A's
    bytes onto them, A never receives B's half line, each file keeps exactly its own writer's
    bytes, and the fork is reported on both hosts (`diverged`: "divergence is symmetric and
    reported", integrity.md invariant 5).

    Before the fix: B took its own `{"id": "` for the first piece of A's line ("applied before a
    crash"), appended the rest of A's line after it, then shipped `9", "from": "b"}\\n` to A:
    both files end `{"id": "3", "from": "a"}\\n9", "from": "b"}\\n` and both say in_sync. Fails
    with "B appended A's bytes onto its unfinished local line".
    """
    a, b, original = replicated_pair(broker, make_daemon, 3)
    for d in (a, b):
        wait_state(d, "in_sync")
    torn, completion = b'{"id": "', b'9", "from": "b"}\n'
    a_line = b'{"id": "3", "from": "a"}\n'

    append(b.path(KEY), torn)
    wait_until(lambda: file_size_seen(b, len(original + torn)), 5,
               "b to look at its unfinished line")
    append(a.path(KEY), a_line)
    # B has heard of A's line (its frame, or its position) before B's writer goes on.
    wait_until(lambda: b.file_status(KEY)["peers"].get("a", {}).get("size")
               == len(original + a_line), 10, "b to learn of a's new line")
    append(b.path(KEY), completion)

    a_expected, b_expected = original + a_line, original + torn + completion
    with contextlib.suppress(AssertionError):  # judged below, by what each host holds and says
        wait_until(lambda: content(a.path(KEY)) != a_expected
                   or content(b.path(KEY)) != b_expected
                   or all(d.file_status(KEY)["state"] == "diverged" for d in (a, b)),
                   10, "both hosts to report the fork")
    b_now, a_now = content(b.path(KEY)), content(a.path(KEY))
    assert b_now == b_expected, (
        "B appended A's bytes onto its unfinished local line: B's file after the common "
        f"prefix is {tail(b_now, len(original))}, expected {tail(b_expected, len(original))}")
    assert a_now == a_expected, (
        f"A's file got bytes from B: after the common prefix {tail(a_now, len(original))}")
    states = {d.node: d.file_status(KEY)["state"] for d in (a, b)}
    assert set(states.values()) == {"diverged"}, f"the fork is not reported on both sides: {states}"


# --- 2 -----------------------------------------------------------------------------------------


def lines_of_64(n: int, tag: str = "x") -> bytes:
    out = []
    for i in range(n):
        head = f'{{"n": "{i:05d}", "tag": "{tag}", "pad": "'
        out.append((head + "p" * (64 - len(head) - 3) + '"}\n').encode())
    assert all(len(x) == 64 for x in out)
    return b"".join(out)


@pytest.mark.parametrize("size", [65_536, 65_600], ids=["end-on-block-boundary", "control"])
def test_edit_just_below_the_end_is_noticed_before_new_bytes_ship(
    broker: Broker, make_daemon: Callable[..., Daemon], size: int
) -> None:
    """#10, case 2: an edit below the end, at a 64 KiB block boundary.

    Steps: A and B in sync on a copy of `size` bytes (64-byte lines). With A's syncd stopped for
    a moment (SIGSTOP, so that its one look sees both writes, as when inotify merges them), one
    `pwrite` on A rewrites the last line (same length, other bytes) and an O_APPEND write adds a
    new line.

    Correct: A re-reads what it vouches for before shipping, notices the edit, and never ships
    the new line under the old digest: B's file stays exactly the original bytes, and the fork
    is reported (B, and A, `diverged`). 65 600 bytes is the control: there the block below the
    end is partial and was always re-read; it passes before and after the fix.

    Before the fix (65 536 bytes only): the re-check of "the partial block below our end"
    compared two empty strings, B appended the new line onto its old line 1024, and both hosts
    said in_sync. Fails with "B received A's new line on top of the old last line".
    """
    a, b = (make_daemon(n, broker) for n in "ab")
    original = lines_of_64(size // 64)
    assert len(original) == size
    append(a.path(KEY), original)
    wait_equal(original, b)
    for d in (a, b):
        wait_state(d, "in_sync")

    edited_last = lines_of_64(size // 64, tag="E")[-64:]
    new_line = lines_of_64(1, tag="new")
    a.pause()
    try:
        fd = os.open(a.path(KEY), os.O_WRONLY)
        try:
            os.pwrite(fd, edited_last, size - 64)
        finally:
            os.close(fd)
        append(a.path(KEY), new_line)
    finally:
        a.resume()

    wait_until(lambda: content(b.path(KEY)) != original
               or b.file_status(KEY)["state"] == "diverged", 10,
               "b to report the edit, or to change")
    got = content(b.path(KEY))
    assert got == original, (
        f"B received A's new line on top of the old last line: B holds {len(got)} bytes, "
        f"ending {tail(got, size - 64)}; B says {b.file_status(KEY)['state']}, A says "
        f"{a.file_status(KEY)['state']}")
    for d in (a, b):
        wait_state(d, "diverged", timeout=10)
    assert content(b.path(KEY)) == original


# --- 3 -----------------------------------------------------------------------------------------


def test_file_renamed_over_a_standbys_copy_never_receives_the_writers_bytes(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """#10, case 3: a file renamed over a standby's copy.

    Steps: A and B in sync; B runs with `watch = false` and a 5 s sweep, so that A's next
    frame reaches B before anything on B looks at the file. On B a foreign file of the same
    size with other bytes is renamed over events.jsonl; then A's writer appends a line.

    Correct: B applies peer bytes only to the file its ledger describes (same device and inode):
    the foreign file keeps exactly its bytes, and B reports `reset` (a replaced file is a local
    reset, docs/design.md, "States").

    Before the fix: B appended A's line onto the foreign file (the append never checked the
    inode, and took the new one as its own), and both hosts said in_sync. Fails with "B
    appended A's line onto the file renamed over its copy".
    """
    original = ishiki_lines(5)
    a = make_daemon("a", broker, start=False)
    b = make_daemon("b", broker, start=False, extra="watch = false",
                    tuning="sweep_interval = 5\nrequest_timeout = 1.0\n")
    for d in (a, b):
        d.path(KEY).parent.mkdir(parents=True)
        d.path(KEY).write_bytes(original)
        d.start()
    for d in (a, b):
        wait_state(d, "in_sync")

    foreign = original.replace(b'"type": "message"', b'"type": "MESSAGE"')
    assert len(foreign) == len(original) and foreign != original
    incoming = b.path(KEY).with_name("events.jsonl.incoming")
    incoming.write_bytes(foreign)
    os.rename(incoming, b.path(KEY))
    line = ishiki_lines(1)
    append(a.path(KEY), line)

    wait_until(lambda: content(b.path(KEY)) != foreign
               or b.file_status(KEY)["state"] == "reset", 12,
               "b to report the replaced file, or to change it")
    got = content(b.path(KEY))
    assert got == foreign, (
        f"B appended A's line onto the file renamed over its copy: {len(got)} bytes, ending "
        f"{tail(got, len(foreign))}; B says {b.file_status(KEY)['state']}")
    wait_state(b, "reset", timeout=12)
    assert content(b.path(KEY)) == foreign


# --- 4 -----------------------------------------------------------------------------------------


def open_fds(pid: int) -> set[int]:
    return {int(n) for n in os.listdir(f"/proc/{pid}/fd")}


def connect(d: Daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(d.state / "syncd.sock"))
    return s


def ask_status(s: socket.socket) -> dict[str, Any]:
    """One status request on a connection the daemon accepted earlier."""
    s.sendall(b'{"cmd": "status"}\n')
    buf = b""
    while chunk := s.recv(1 << 16):
        buf += chunk
    reply: dict[str, Any] = json.loads(buf.splitlines()[-1])
    status: dict[str, Any] = reply["status"]
    return status


@contextmanager
def descriptors_exhausted(d: Daemon, spare: int) -> Iterator[list[socket.socket]]:
    """Make every open(2) in the daemon fail with EMFILE; yield `spare` connections that the
    daemon accepted earlier, each good for one `ask_status`.

    Idle control connections fill every free descriptor, and 10 more (the daemon accepts them
    and waits up to 5 s for a request); the spare ones take the descriptors just above; then
    the soft RLIMIT_NOFILE is lowered to the first spare one. Every descriptor below the limit
    is in use, so the next open() fails, and a spare connection, once used and closed, frees
    only a descriptor at or above the limit, which does not help. Leaving the block closes
    every connection: 10 or more descriptors below the limit are free again, the error is gone
    (the limit stays as it is).
    """
    assert d.proc is not None
    pid = d.proc.pid
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    with ExitStack() as held:
        def hold(n: int) -> list[socket.socket]:
            before = len(open_fds(pid))
            conns = [held.enter_context(connect(d)) for _ in range(n)]
            wait_until(lambda: len(open_fds(pid)) >= before + n, 5, "the daemon to accept")
            return conns

        def fill_holes(below: int | None) -> None:
            for _ in range(20):  # descriptors the daemon closed meanwhile
                fds = open_fds(pid)
                holes = set(range(max(fds) if below is None else below)) - fds
                if not holes:
                    return
                hold(len(holes))
            raise AssertionError("could not use up the daemon's descriptors")

        hold(10)
        fill_holes(None)
        before = open_fds(pid)
        spares = hold(spare)
        limit = min(open_fds(pid) - before)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, hard))
        fill_holes(limit)
        yield spares


def test_a_look_that_fails_transiently_is_retried_and_shown(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """#10, case 4: a transient error (EMFILE) drops a look.

    Steps: A and B in sync. A's daemon runs out of descriptors: idle connections to its control
    socket hold every descriptor below its (lowered) open-file limit, so its open() of the file
    fails with EMFILE. A's writer appends one line. Then the connections are closed, and nothing
    else is written.

    Correct: while the look fails, A's status does not say `in_sync` for the file (the lead
    makes it `error`, with "Too many open files" in the reason); the look is retried with
    backoff, and once descriptors are free again the line reaches B within a few seconds, and
    both hosts say in_sync.

    Before the fix: the failed look was logged "will retry" and never retried: A said in_sync
    all along, and the line stayed unshipped until the writer wrote again. Fails with "A says
    in_sync while every look at its grown file fails"; and past that check (verified by hand)
    the line never reaches B: "timed out ... waiting for copies on ['b'] to equal".
    """
    a, b, original = replicated_pair(broker, make_daemon, 3)
    for d in (a, b):
        wait_state(d, "in_sync")
    line = ishiki_lines(1)
    seen: list[dict[str, Any]] = []
    with descriptors_exhausted(a, spare=24) as spares:
        append(a.path(KEY), line)

        def honest() -> bool:
            """A does not sit on an unshipped line while saying in_sync: it says something
            else, or (a look that did not need a new descriptor) the line has shipped."""
            if content(b.path(KEY)) == original + line:
                return True
            if not spares:
                return False
            f = next(x for x in ask_status(spares.pop())["files"] if x["key"] == KEY)
            seen.append(f)
            return bool(f["state"] != "in_sync")

        try:
            wait_until(honest, 3, "a to stop saying in_sync", interval=0.1)
            for _ in range(min(3, len(spares))):  # and keeps saying so while the look fails
                assert honest(), f"A went back to in_sync: {seen[-1]}"
        except AssertionError as e:
            raise AssertionError(
                "A says in_sync while every look at its grown file fails with EMFILE (states "
                f"seen: {[f['state'] for f in seen]}; B holds {len(content(b.path(KEY)))} of "
                f"{len(original + line)} bytes)\n{e}") from None
        if seen and seen[-1]["state"] != "in_sync":
            failing = seen[-1]
            reason = " ".join(str(failing.get(k) or "") for k in ("error", "paused", "reason"))
            assert not reason.strip() or "Too many open files" in reason or "EMFILE" in reason, (
                f"the reason shown does not name the error: {failing}")
    # Descriptors are free again; nothing else is written: the retry alone ships the line.
    wait_equal(original + line, b, timeout=8)
    for d in (a, b):
        wait_state(d, "in_sync", timeout=5)


# --- 5 -----------------------------------------------------------------------------------------


def test_adopt_is_done_only_when_we_hold_the_winners_copy_as_it_is_now(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    """#10, case 5: adopt reported done from a position announcement that was already stale.

    Steps: A and B in sync (10 lines), then split brain: both writers append while B's syncd is
    stopped, and both hosts show the fork (diverged). B's writer goes on appending, so any
    position of B's that A holds when it asks is already old. (When this was found, a diverged
    copy froze and announced nothing new at all; since #13 it is not frozen and announces its
    growth, but an announcement older than the request still must not end an adoption.)
    The operator keeps B's history: `syncd adopt bot-1 --from b` on A.

    Correct: adopt is done only when A's durable copy equals a position B announced after A's
    request, so when the command returns A's file equals B's file as it is (whole lines), and
    the size it prints is that file's size.

    Before the fix: A's adoption compared its copy with the position B announced when it froze,
    fetched that much and said "now identical to b's copy (N bytes)" with B's writer's later
    lines missing (and B, frozen, never ships them on its own). Fails with "adopt returned
    before A held B's copy".

    (Why this construction: check_done() compares our position with the peer's last announced
    position, whenever that was announced; a frozen copy did not announce its file's growth,
    so its announcement was stale for as long as the writer wrote. The "0 bytes" of the issue is
    the same check meeting an announcement of an empty copy.)
    """
    a, b, common = replicated_pair(broker, make_daemon, 10)
    b.pause()
    ours, theirs = ishiki_lines(3), ishiki_lines(2)
    append(a.path(KEY), ours)
    append(b.path(KEY), theirs)
    b.resume()
    for d in (a, b):
        wait_state(d, "diverged")
    later = ishiki_lines(2)
    append(b.path(KEY), later)
    winner = common + theirs + later
    wait_until(lambda: file_size_seen(b, len(winner)), 5, "b to look at its writer's lines")

    done = adopt(a, "b")
    at_return = content(a.path(KEY))
    assert done.returncode == 0, done.stderr
    assert content(b.path(KEY)) == winner
    assert at_return == winner, (
        f"adopt returned before A held B's copy: it said {done.stdout.strip()!r}; A holds "
        f"{len(at_return)} bytes, B {len(winner)}")
    assert f"({len(winner)} bytes)" in done.stdout, done.stdout
