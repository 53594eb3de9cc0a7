"""The Zstandard frame boundary parser (core/zstdframes.py) and the record kinds built on it:
real frames from libzstd, cut at every byte, and hostile headers."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.core import recordkinds, zstdframes
from syncd.core.ledger import Ledger, digest_of
from syncd.core.zstdframes import FrameScanner
from tests.support import zstd


def _frames(*payloads: bytes, checksum: bool = True) -> list[bytes]:
    return [zstd.frame(p, checksum=checksum) for p in payloads]


def test_every_prefix_of_a_frame_sequence_ends_at_the_last_whole_frame() -> None:
    parts = [*_frames(b'{"a":1}\n', os.urandom(3000) + b"\n", b"\n" * 700),
             zstd.skippable(b"meta\n"), *_frames(b"x" * 200_000 + b"\n", checksum=False)]
    buf = b"".join(parts)
    ends = [sum(len(p) for p in parts[: i + 1]) for i in range(len(parts))]
    for cut in range(len(buf) + 1):
        expected = max([0, *(e for e in ends if e <= cut)])
        assert zstdframes.last_end(buf[:cut])[0] == expected, cut
    frames, end, damage = zstdframes.split(buf)
    assert frames == parts and end == len(buf) and damage is None


def test_a_newline_inside_compressed_data_ends_nothing() -> None:
    frame = zstd.frame(os.urandom(5000))
    assert b"\n" in frame
    assert recordkinds.last_end(recordkinds.ZSTD_FRAMES, frame[:-1]) == 0
    assert recordkinds.last_end(recordkinds.ZSTD_FRAMES, frame) == len(frame)
    assert recordkinds.last_end(recordkinds.LINES, frame) != len(frame)  # what main did


def test_the_scanner_fed_byte_by_byte_knows_every_boundary() -> None:
    parts = _frames(b"one\n", b"two\n" * 100, b"")
    buf = b"".join(parts)
    s = FrameScanner(0)
    ends = set()
    for i in range(len(buf)):
        s.feed(buf[i: i + 1])
        if s.at_boundary:
            ends.add(s.pos)
    assert ends == {len(parts[0]), len(parts[0]) + len(parts[1]), len(buf)}
    assert s.record_start == len(parts[0]) + len(parts[1])


def test_walking_headers_only_reads_a_few_bytes_per_block() -> None:
    big = zstd.frame(os.urandom(1 << 20))  # incompressible: raw blocks of 128 KiB
    buf = big + zstd.frame(b"tail\n")
    reads: list[tuple[int, int]] = []

    def read(at: int, n: int) -> bytes:
        reads.append((at, n))
        return buf[at: at + n]

    s = FrameScanner(0)
    zstdframes.walk(s, read, len(buf))
    assert s.at_boundary and s.pos == len(buf)
    assert sum(n for _, n in reads) < 200 and len(reads) < 30
    s = FrameScanner(0)
    zstdframes.walk(s, read, len(buf) - 1)  # the last frame torn
    assert not s.at_boundary and s.record_start == len(big)
    assert zstdframes.record_number(read, len(big) + 2) == 2
    assert zstdframes.record_number(read, 5) == 1


def test_hostile_headers_are_damage_or_incomplete_never_a_large_allocation() -> None:
    magic = struct.pack("<I", zstdframes.MAGIC)
    # A skippable frame that declares 4 GiB: incomplete (never shipped), nothing allocated.
    huge_skip = struct.pack("<II", 0x184D2A50, 0xFFFFFFFF) + b"x" * 10
    s = FrameScanner(0)
    s.feed(huge_skip)
    assert s.at_boundary is False and s.damage is None and s.record_start == 0
    assert s.wanted() == (8 + 0xFFFFFFFF, 4)
    # A frame header declaring an 8-byte content size of 2**64 - 1 and a huge window.
    header = magic + bytes([0xC0 | 0x04, 0xF8]) + b"\xff" * 8
    s = FrameScanner(0)
    s.feed(header + b"\x01\x00\x00")  # a last raw block of 0 bytes, then the checksum
    assert s.damage is None and not s.at_boundary
    s.feed(b"\x00" * 4)
    assert s.at_boundary and s.pos == len(header) + 7
    # A block larger than Block_Maximum_Size (128 KiB): damage, with where the frame began.
    too_big = ((128 * 1024 + 1) << 3) | (2 << 1) | 1
    s = FrameScanner(100)
    s.feed(magic + bytes([0x00, 0x50]) + too_big.to_bytes(3, "little"))
    assert s.damage is not None and "more than the frame allows" in s.damage
    assert s.record_start == 100 and s.at_boundary is False and s.wanted() is None
    # A block larger than a small window allows (window descriptor 0: 1 KiB).
    small = ((2000 << 3) | (2 << 1) | 1).to_bytes(3, "little")
    assert zstdframes.split(magic + b"\x00\x00" + small + b"z" * 2000)[2] is not None
    # The reserved block type, a reserved descriptor bit, a wrong magic.
    assert "reserved" in (zstdframes.split(magic + b"\x20\x00" + b"\x07\x00\x00")[2] or "")
    assert "reserved" in (zstdframes.split(magic + b"\x08\x00")[2] or "")
    frames, end, damage = zstdframes.split(zstd.frame(b"ok\n") + b"garbage!")
    assert len(frames) == 1 and end == len(frames[0]) and "magic" in (damage or "")
    # Truncated headers: every cut inside the header is incomplete, not damage.
    whole = zstd.frame(b"hello\n")
    for cut in range(1, 18):
        s = FrameScanner(0)
        s.feed(whole[:cut])
        assert s.damage is None and s.at_boundary is False and s.record_start == 0


def test_a_bad_checksum_is_still_a_whole_record_and_the_decoder_names_it() -> None:
    frame = bytearray(zstd.frame(b'{"a":1}\n' * 10))
    frame[-1] ^= 0xFF  # the content checksum
    assert zstdframes.last_end(bytes(frame)) == (len(frame), None)  # it travels (as a bad line)
    with pytest.raises(zstd.ZstdError):
        zstd.decompress_frame(bytes(frame))


def test_a_restored_scanner_resyncs_at_the_next_frame_magic() -> None:
    first, second = _frames(b"a\n", b"b\n")
    ledger = Ledger(recordkinds.ZSTD_FRAMES)
    ledger.extend(first)
    restored = Ledger.restore(ledger.chain, ledger.size, ledger.tail, recordkinds.ZSTD_FRAMES)
    assert restored.ends_record_with(second[:-1]) is False
    assert restored.ends_record_with(second) is True
    restored.extend(second)
    assert restored.open_line_start is None and restored.digest() == digest_of(first + second)


def test_a_piece_of_a_long_frame_does_not_end_a_record() -> None:
    frame = zstd.frame(os.urandom(600_000))
    ledger = Ledger(recordkinds.ZSTD_FRAMES)
    for at in range(0, len(frame), 256 * 1024):
        piece = frame[at: at + 256 * 1024]
        assert ledger.ends_record_with(piece) is (at + len(piece) == len(frame))
        ledger.extend(piece)
        assert ledger.open_line_start == (0 if ledger.size < len(frame) else None)


def test_pieces_end_at_record_ends_unless_a_record_is_too_long() -> None:
    buf = b"aaaa\nbbbb\ncccccccccccccccc\nd\n"
    lines = recordkinds.LINES
    assert recordkinds.piece_end(lines, buf, 0, len(buf), 12) == 10  # "aaaa\nbbbb\n"
    assert recordkinds.piece_end(lines, buf, 10, len(buf), 12) == 22  # a 17-byte line
    assert recordkinds.piece_end(lines, buf, 22, len(buf), 12) == len(buf)  # the rest fits
    a, b, c = _frames(b"a" * 10, os.urandom(500), b"c")
    buf = a + b + c
    frames = recordkinds.ZSTD_FRAMES
    assert recordkinds.piece_end(frames, buf, 0, len(buf), len(a) + 10) == len(a)
    assert recordkinds.piece_end(frames, buf, len(a), len(buf), 100) == len(a) + 100
    assert recordkinds.piece_end(frames, buf, 0, len(buf), len(buf)) == len(buf)


def test_kind_by_file_name_and_pattern() -> None:
    assert recordkinds.kind_for("session.jsonl.zstd") == recordkinds.ZSTD_FRAMES
    assert recordkinds.kind_for("session.jsonl") == recordkinds.LINES
    assert recordkinds.kind_for("x.zstd", (("x.*", "lines"),)) == recordkinds.LINES


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), start=st.integers(0, 50))
def test_random_bytes_never_raise_and_never_claim_more_than_they_hold(data: bytes,
                                                                      start: int) -> None:
    buf = zstd.frame(b"x\n") + data
    end, _ = zstdframes.last_end(buf)
    assert len(zstd.frame(b"x\n")) <= end <= len(buf)
    s = FrameScanner(start)
    s.feed(data)
    assert s.pos == start + len(data)
    assert s.record_start is None or start <= s.record_start <= s.pos


def test_a_walk_stops_past_the_read_and_inside_a_frame_of_too_many_blocks() -> None:
    frames = _frames(*(b"x%d\n" % i for i in range(50)))
    buf = b"".join(frames)
    read_count = 0

    def read(at: int, n: int) -> bytes:
        nonlocal read_count
        read_count += 1
        return buf[at: at + n]

    s = FrameScanner(0)
    zstdframes.walk(s, read, len(buf), stop_at=len(frames[0]) + 1)
    assert s.at_boundary and s.pos == len(frames[0]) + len(frames[1])  # the frame crossing it
    assert read_count <= 10  # 5 headers a frame: magic, descriptor, window, block, checksum
    s = FrameScanner(0)
    zstdframes.walk(s, read, len(buf))  # no per-walk cap: every frame of a long file
    assert s.pos == len(buf)
    # A frame of 20 empty non-last raw blocks, then its last one: past frame_steps, never whole.
    many = struct.pack("<I", zstdframes.MAGIC) + bytes([0x00, 0x50]) + b"\x00\x00\x00" * 20 \
        + b"\x01\x00\x00"
    s = FrameScanner(0)
    zstdframes.walk(s, lambda at, n: many[at: at + n], len(many), frame_steps=10)
    assert not s.at_boundary and s.record_start == 0
    s = FrameScanner(0)
    zstdframes.walk(s, lambda at, n: many[at: at + n], len(many), frame_steps=30)
    assert s.at_boundary and s.pos == len(many)
