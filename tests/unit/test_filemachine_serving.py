"""Answering peers (syncd/core/filemachine/serving.py), driven directly: a ledger, a request
or a probe, and the bytes read for it in; the frames (or the check that replaces them) out."""

from __future__ import annotations

from syncd.core.events import LookAgain, Rehash, Send
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
