"""The log checks of a `.zstd` log (core/framecheck.py): whole frames decompressed and their
JSONL checked; frames that are torn, damaged or not frames at all are named by number."""

from __future__ import annotations

import orjson

from syncd.core.framecheck import FrameChecker, checker_for, checker_from_state
from syncd.core.logcheck import LogChecker
from tests.support import zstd


def _line(i: int) -> bytes:
    return orjson.dumps({"id": f"e{i}", "type": "message", "timestamp": 1793531049900 + i,
                         "data": {"id": f"m{i}", "role": "user", "content": "hi\n" * i}}) + b"\n"


def _session(batches: int = 5, per: int = 3) -> tuple[list[bytes], bytes]:
    frames = [zstd.frame(b"".join(_line(b * per + j) for j in range(per)))
              for b in range(batches)]
    return frames, b"".join(frames)


def test_a_healthy_session_is_clean_at_every_frame_boundary_and_torn_between() -> None:
    frames, buf = _session()
    ends = {sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))}
    for cut in range(0, len(buf) + 1, 7):
        c = FrameChecker()
        c.feed(buf[:cut])
        report = c.report()
        whole = cut in ends or cut == 0
        assert report.clean is whole, (cut, report.problem_counts)
        if not whole:
            assert list(report.problem_counts) == ["torn_tail"]
    c = FrameChecker()
    for i in range(0, len(buf), 5):  # fed in small pieces
        c.feed(buf[i: i + 5])
    report = c.report()
    assert report.clean and report.entries == 15 and report.bytes_checked == len(buf)


def test_a_bad_checksum_is_a_damaged_frame_with_its_number_and_offset() -> None:
    frames, _ = _session(3)
    bad = bytearray(frames[1])
    bad[-2] ^= 0x55
    c = FrameChecker()
    c.feed(frames[0] + bytes(bad) + frames[2])
    report = c.report()
    assert report.problem_counts == {"damaged_frame": 1}
    (p,) = report.problems
    assert p.line == 2 and p.offset == len(frames[0]) and "does not decompress" in p.message
    assert report.entries == 6  # the frames around it are checked


def test_bytes_that_are_no_frame_are_damage_and_a_line_check_would_not_know() -> None:
    _, buf = _session(2)
    c = FrameChecker()
    c.feed(buf + b"{not a frame}\n")
    report = c.report()
    assert report.problem_counts == {"damaged_frame": 1}
    assert report.problems[0].line == 3 and report.problems[0].offset == len(buf)
    lines = LogChecker()
    lines.feed(buf)
    assert not lines.report().clean  # what main did with a .zstd file: invalid_json


def test_bad_json_inside_a_frame_is_found() -> None:
    c = FrameChecker()
    c.feed(zstd.frame(_line(1) + b"{oops\n"))
    assert c.report().problem_counts == {"invalid_json": 1}


def test_the_state_round_trips_mid_frame() -> None:
    frames, buf = _session(4)
    cut = len(frames[0]) + len(frames[1]) // 2
    c = FrameChecker(hold=1 << 20)
    c.feed(buf[:cut])
    restored = checker_from_state("zstd-frames", c.to_state(), 1 << 20)
    restored.feed(buf[cut:])
    report = restored.report()
    assert report.clean and report.entries == 12
    assert isinstance(checker_for("lines"), LogChecker)
