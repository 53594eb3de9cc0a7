"""Answering peers (syncd/core/filemachine/serving.py), driven directly: a ledger, a request
or a probe, and the bytes read for it in; the frames (or the check that replaces them) out."""

from __future__ import annotations

import pytest

from syncd.core.events import LookAgain, PeerRequest, Redeliver, Rehash, Send
from syncd.core.filemachine import serving
from syncd.core.frames import Data, Kind, Probe, ProbeWhat, Request
from syncd.core.ledger import BLOCK, DIGEST_SIZE, Ledger, digest_of
from tests.support.memfile import MemFile

LINE = b'{"id": "%05d"}\n'


def lines(n: int) -> bytes:
    return b"".join(LINE % i for i in range(n))


def ledger_of(data: bytes) -> Ledger:
    ledger = Ledger()
    ledger.extend(data)
    return ledger


def served(data: bytes, r: Request, f: MemFile | None = None, chunk: int = 256 * 1024,
           window: int = 4 * 1024 * 1024) -> list[object]:
    """Serve `r` from `f` (by default `data` as recorded), judged last at `data`'s size."""
    f = f or MemFile(data)
    ledger = ledger_of(data)
    snap = f.read(serving.request_plan(ledger, r, window))
    seen = (len(data), 1)  # a MemFile starts at mtime 1
    return list(serving.serve(ledger, r, snap, "b", seen=seen, inode=(1, f.inode),
                              window=window, chunk=chunk, records="lines"))


def test_a_request_gets_whole_lines_each_with_the_digest_of_the_prefix_before_it() -> None:
    data = lines(10)
    out = served(data, Request(0, digest_of(b""), 0, len(data)), chunk=40)
    frames = [e.payload for e in out if isinstance(e, Send)]
    assert all(isinstance(e, Send) and e.kind is Kind.FILL and e.to == "b" for e in out)
    assert b"".join(d.data for d in frames) == data
    for d in frames:
        assert isinstance(d, Data) and d.base == digest_of(data[: d.offset])
        assert d.data.endswith(b"\n") and len(d.data) <= 40


def test_a_request_gets_at_most_its_length_and_the_fetch_window() -> None:
    assert serving.serve_range(Request(10, b"", 10, 100), held=50, window=1000) == (10, 50)
    assert serving.serve_range(Request(0, b"", 20, 100), held=500, window=30) == (20, 50)
    # Whole blocks are read, so that each byte is checked against the ledger.
    assert serving.serve_read(BLOCK + 5, BLOCK + 10, held=3 * BLOCK) == (BLOCK, 2 * BLOCK)
    assert serving.serve_read(5, 10, held=7) == (0, 7)


def test_nothing_past_our_end_is_served() -> None:
    data = lines(3)
    assert served(data, Request(len(data), digest_of(data), len(data), 100)) == []


def test_bytes_changed_since_recorded_are_never_served() -> None:
    """The former test_machine case: a byte changed under the ledger is checked, not sent."""
    data = lines(10)
    f = MemFile(data)
    f.data[3] = ord("X")
    f.mtime += 1  # changed since we last judged it: every block is checked
    assert len(served(data, Request(0, digest_of(b""), 0, len(data)), MemFile(data))) == 1
    out = served(data, Request(0, digest_of(b""), 0, len(data)), f)
    assert len(out) == 1 and isinstance(out[0], Rehash) and out[0].purpose == "check"


def test_a_shorter_file_or_another_inode_asks_for_a_look() -> None:
    data = lines(10)
    short = MemFile(data[:20])
    assert [type(e) for e in served(data, Request(0, digest_of(b""), 0, len(data)), short)] \
        == [LookAgain]
    other = MemFile(data, inode=7)
    ledger = ledger_of(data)
    r = Request(0, digest_of(b""), 0, len(data))
    snap = other.read(serving.request_plan(ledger, r, 1 << 20))
    out = serving.serve(ledger, r, snap, "b", seen=None, inode=(1, 1), window=1 << 20,
                        chunk=1 << 20, records="lines")
    assert [type(e) for e in out] == [LookAgain]


def test_our_digest_at_an_offset_comes_from_the_ledger_or_the_bytes_read() -> None:
    data = lines(3 * BLOCK // 16)  # three whole blocks: the one at `at` is not kept
    ledger = ledger_of(data)
    f = MemFile(data)
    assert serving.partial_plan(ledger, BLOCK).ranges == ()  # a block boundary: known
    at = BLOCK + 37  # inside a line of the second block
    plan = serving.partial_plan(ledger, at)
    assert plan.ranges == ((BLOCK, at),)
    assert serving.digest_at(ledger, at, f.read(plan)) == digest_of(data[:at])
    assert serving.partial_plan(ledger, len(data) + 1).ranges == ()  # past our end
    assert serving.digest_at(ledger, len(data) + 1, f.read(plan)) is None
    f.truncate(BLOCK + 4)  # shrank under us: not known
    assert serving.digest_at(ledger, at, f.read(plan)) is None


def test_a_sums_probe_gets_our_block_digests_a_bytes_probe_our_bytes() -> None:
    data = lines(3 * BLOCK // 16)
    ledger = ledger_of(data)
    f = MemFile(data)
    sums = serving.answer_probe(ledger, Probe(ProbeWhat.SUMS, 1, 10), f.read(serving.NO_READS),
                                sums=10)
    assert sums.size == len(data) and sums.start == 1
    assert sums.data == b"".join(ledger.chain[2:len(ledger.chain)])
    assert len(sums.data) % DIGEST_SIZE == 0
    p = Probe(ProbeWhat.BYTES, BLOCK, BLOCK)
    got = serving.answer_probe(ledger, p, f.read(serving.probe_plan(ledger, p)), sums=10)
    assert got.data == data[BLOCK: 2 * BLOCK]
    assert serving.sums_per_frame(DIGEST_SIZE * 7 + 3) == 7 and serving.sums_per_frame(1) == 1


def serve_in_steps(data: bytes, r: Request, chunk: int, step: int,
                   window: int = 1 << 20) -> tuple[list[Data], int]:
    """Serve `r` a step at a time, following each Redeliver; the frames, and the turns."""
    f, ledger = MemFile(data), ledger_of(data)
    sent: list[Data] = []
    turns = 0
    while True:
        turns += 1
        plan = serving.request_plan(ledger, r, window, step)
        assert sum(b - a for a, b in plan.ranges) <= step + 2 * BLOCK  # whole blocks of a step
        out = serving.serve(ledger, r, f.read(plan), "b", seen=(len(data), 1),
                            inode=(1, f.inode), window=window, chunk=chunk,
                            records="lines", step=step)
        sent += [e.payload for e in out if isinstance(e, Send)]  # type: ignore[misc]
        if not out or not isinstance(out[-1], Redeliver):
            return sent, turns
        nxt = out[-1].event
        assert isinstance(nxt, PeerRequest) and nxt.peer == "b"
        assert (nxt.request.have, nxt.request.digest) == (r.have, r.digest)
        r = nxt.request


def test_a_window_served_a_step_at_a_time_is_cut_as_a_whole_window_is() -> None:
    data = lines(40_000)  # 640 000 bytes, several blocks
    r = Request(0, digest_of(b""), 0, len(data))
    chunk = 50_000
    whole = [e.payload for e in served(data, r, chunk=chunk, window=1 << 20)
             if isinstance(e, Send)]
    for step in (chunk, 2 * BLOCK, 3 * BLOCK + 7):
        stepped, turns = serve_in_steps(data, r, chunk=chunk, step=step)
        assert stepped == whole
        assert turns >= len(data) // (step + BLOCK)
    # A request for less than the window ends where it asked.
    part, turns = serve_in_steps(data, Request(0, digest_of(b""), 15, 300_000), chunk, chunk)
    assert part[0].offset == 15 and part[-1].end == 300_015 and turns > 1


def test_a_step_smaller_than_a_chunk_is_refused() -> None:
    data = lines(40_000)
    r = Request(0, digest_of(b""), 0, len(data))
    f, ledger = MemFile(data), ledger_of(data)
    snap = f.read(serving.request_plan(ledger, r, 1 << 20, 10))
    with pytest.raises(ValueError):
        serving.serve(ledger, r, snap, "b", seen=(len(data), 1), inode=(1, f.inode),
                      window=1 << 20, chunk=3 * BLOCK, records="lines", step=10)
