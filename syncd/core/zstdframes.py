"""Where each Zstandard frame of a `*.zstd` log ends, from its headers alone (RFC 8878).

A `.zstd` log (dsh-session's default `session.jsonl.zstd`) is a sequence of frames, one per
batch of the writer; a frame is the record that may travel, a `0x0A` byte inside compressed
data means nothing. A frame's length follows from its headers: the frame header (magic,
descriptor, window, dictionary id, content size), then blocks (a 3-byte header each: Last_Block,
Block_Type, Block_Size; an RLE block's content is one byte), then a 4-byte content checksum when
the descriptor says so. A skippable frame is a magic and a 4-byte size. Nothing is decompressed
here: the content checksum is checked by the log check, which decompresses (frames that are
whole but damaged inside travel, as a line with bad JSON does; the check reports them).

`FrameScanner` is fed bytes in file order and knows at every point where the last record began
and whether the bytes so far end on a record boundary. It never buffers content: at most one
header (14 bytes). It can also be driven over a file without reading the contents: `wanted()`
names the next header bytes it needs; `skip_to()` jumps over content. State is a few integers,
so a walk over a long unfinished frame can be kept and resumed (`copy()`).

Hostile input is bounded by construction: sizes declared in headers are only compared and
added, never allocated; a block larger than its frame allows (or of the reserved type, or a
reserved descriptor bit) is damage, reported with the offset of the frame that holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAGIC = 0xFD2FB528
SKIPPABLE_FIRST, SKIPPABLE_LAST = 0x184D2A50, 0x184D2A5F
BLOCK_MAX = 128 * 1024  # Block_Maximum_Size: min(Window_Size, 128 KiB)

# What the next header bytes are.
(_MAGIC, _DESCRIPTOR, _HEADER_REST, _HEADER_REST_SINGLE, _SKIP_SIZE, _BLOCK, _CHECKSUM,
 _DAMAGED, _LOST) = range(9)
_DID_BYTES = (0, 1, 2, 4)
_FCS_BYTES = (0, 2, 4, 8)


class FrameScanner:
    """Record boundaries of a zstd byte stream fed in order from `offset` (a frame's start,
    or `known=False`: not known; the first fed chunk that begins with a magic number starts
    over there, which random bytes do with odds of 2**-32)."""

    __slots__ = ("_block_max", "_checksum", "_hdr", "_need", "_next", "_state", "damage",
                 "pos", "record_start")

    def __init__(self, offset: int = 0, known: bool = True) -> None:
        self.pos = offset  # bytes consumed (or skipped) so far
        self.record_start: int | None = offset if known else None  # last frame's start
        self.damage: str | None = None  # why the bytes from record_start are no frame
        self._state = _MAGIC if known else _LOST
        self._next = offset  # where the next header begins
        self._need = 4 if known else 0  # its length
        self._hdr = bytearray()
        self._checksum = False
        self._block_max = BLOCK_MAX

    def copy(self) -> FrameScanner:
        other = FrameScanner.__new__(FrameScanner)
        for name in FrameScanner.__slots__:
            setattr(other, name, getattr(self, name))
        other._hdr = bytearray(self._hdr)
        return other

    def to_state(self) -> list[int | str | None]:
        return [self.pos, self.record_start, self.damage, self._state, self._next, self._need,
                bytes(self._hdr).hex(), int(self._checksum), self._block_max]

    @classmethod
    def from_state(cls, state: list[Any]) -> FrameScanner:
        s = cls.__new__(cls)
        (s.pos, s.record_start, s.damage, s._state, s._next, s._need, hdr, checksum,
         s._block_max) = state
        s._hdr, s._checksum = bytearray.fromhex(hdr), bool(checksum)
        if not (isinstance(s.pos, int) and isinstance(s._next, int)
                and 0 <= len(s._hdr) <= s._need <= 14 and _MAGIC <= s._state <= _LOST):
            raise ValueError("not a saved FrameScanner state")
        return s

    @property
    def at_boundary(self) -> bool | None:
        """Whether the bytes so far end exactly where a record ends (None: not known)."""
        if self._state == _LOST:
            return None
        return self._state == _MAGIC and self.pos == self._next and not self._hdr

    def wanted(self) -> tuple[int, int] | None:
        """(offset, length) of the header bytes needed next; None when damaged or lost."""
        if self._state in (_DAMAGED, _LOST):
            return None
        return self._next + len(self._hdr), self._need - len(self._hdr)

    def skip_to(self, offset: int) -> None:
        """Jump over content: bytes up to `offset` (at most the next header's start) are
        taken as read without being fed."""
        if self._state not in (_DAMAGED, _LOST) and self.pos < offset <= self._next:
            self.pos = offset

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        if self._state == _LOST:
            if len(view) >= 4 and _is_magic(int.from_bytes(view[:4], "little")):
                self._state, self._next, self._need = _MAGIC, self.pos, 4
            else:
                self.pos += len(view)
                return
        base = self.pos  # the offset of view[0]
        end = base + len(view)
        while self._state != _DAMAGED:
            held = len(self._hdr)
            at = self._next + held  # the next header byte needed; before it: content
            if at >= end:
                break
            if self._state == _MAGIC and not held:
                self.record_start = at
            need = self._need - held
            take = min(need, end - at)
            if not held and take == need:  # the whole header is here (the usual case)
                header = bytes(view[at - base: at - base + need])
            else:
                self._hdr += view[at - base: at - base + take]
                if take < need:
                    break
                header = bytes(self._hdr)
                self._hdr.clear()
            self.pos = at + take
            self._header(header)
        self.pos = end

    def _header(self, h: bytes) -> None:
        """A whole header ends at self.pos: what follows it."""
        state, pos = self._state, self.pos
        if state == _MAGIC:
            magic = int.from_bytes(h, "little")
            if magic == MAGIC:
                self._expect(_DESCRIPTOR, pos, 1)
            elif SKIPPABLE_FIRST <= magic <= SKIPPABLE_LAST:
                self._expect(_SKIP_SIZE, pos, 4)
            else:
                self._damaged(f"no frame starts here (magic {magic:#010x})")
        elif state == _SKIP_SIZE:
            self._expect(_MAGIC, pos + int.from_bytes(h, "little"), 4)
        elif state == _DESCRIPTOR:
            d = h[0]
            if d & 0x08:
                self._damaged("reserved bit set in the frame header descriptor")
                return
            single = bool(d & 0x20)
            self._checksum = bool(d & 0x04)
            fcs = _FCS_BYTES[d >> 6] or (1 if single else 0)
            rest = (0 if single else 1) + _DID_BYTES[d & 3] + fcs
            self._block_max = BLOCK_MAX
            # Single segment: no window descriptor (the window is the content size, which
            # libzstd holds blocks to; a frame that breaks that is whole, and does not
            # decompress: the log check says so).
            self._expect(_HEADER_REST_SINGLE if single else _HEADER_REST, pos, rest)
        elif state == _HEADER_REST:
            self._block_max = min(BLOCK_MAX, window_size(h[0]))
            self._expect(_BLOCK, pos, 3)
        elif state == _HEADER_REST_SINGLE:
            self._expect(_BLOCK, pos, 3)
        elif state == _BLOCK:
            word = int.from_bytes(h, "little")
            last, kind, size = word & 1, (word >> 1) & 3, word >> 3
            if kind == 3:
                self._damaged("block of the reserved type")
                return
            if kind != 1 and size > self._block_max:
                self._damaged(f"block of {size} bytes, more than the frame allows "
                              f"({self._block_max})")
                return
            end = pos + (1 if kind == 1 else size)
            if not last:
                self._expect(_BLOCK, end, 3)
            elif self._checksum:
                self._expect(_CHECKSUM, end, 4)
            else:
                self._expect(_MAGIC, end, 4)
        elif state == _CHECKSUM:
            self._expect(_MAGIC, pos, 4)

    def _expect(self, state: int, at: int, need: int) -> None:
        self._state, self._next, self._need = state, at, need

    def _damaged(self, why: str) -> None:
        self._state = _DAMAGED
        self.damage = why


def _is_magic(magic: int) -> bool:
    return magic == MAGIC or SKIPPABLE_FIRST <= magic <= SKIPPABLE_LAST


def window_size(descriptor: int) -> int:
    exponent, mantissa = descriptor >> 3, descriptor & 7
    base = 1 << (10 + exponent)
    return base + (base // 8) * mantissa


Read = Callable[[int, int], bytes]


FRAME_STEPS = 1 << 15  # header reads per frame at most: 4 GiB at libzstd's 128 KiB blocks


def walk(scanner: FrameScanner, read: Read, size: int, stop_at: int | None = None,
         frame_steps: int = FRAME_STEPS) -> None:
    """Advance `scanner` over a file of `size` bytes reading headers only (`read(offset, n)`
    returns up to n bytes there), as far as whole headers go; stop at the first frame end
    at or past `stop_at`, and inside a frame of more than `frame_steps` headers (a frame that
    long, or a bot's stream of empty 3-byte blocks, is never whole here)."""
    steps = 0
    while (want := scanner.wanted()) is not None:
        at, n = want
        if at + n > size:
            scanner.skip_to(min(at, size))
            return
        scanner.skip_to(at)
        if scanner.at_boundary:
            if stop_at is not None and scanner.pos >= stop_at:
                return
            steps = 0
        steps += 1
        if steps > frame_steps:
            return
        data = read(at, n)
        if len(data) < n:
            return
        scanner.feed(data)


def record_number(read: Read, offset: int, max_steps: int = 1 << 24) -> int:
    """1-based number of the frame that holds byte `offset` (headers read only)."""
    scanner = FrameScanner(0)
    number = 0
    for _ in range(max_steps):
        want = scanner.wanted()
        if want is None or want[0] > offset:
            break
        at, n = want
        scanner.skip_to(at)
        if scanner.at_boundary:
            number += 1
        data = read(at, n)
        if len(data) < n:
            break
        scanner.feed(data)
    return max(number, 1)


def last_end(buf: bytes | memoryview, start: int = 0) -> tuple[int, str | None]:
    """End of the last whole frame in buf[start:] (start: a frame's start), and why the bytes
    after it are no frame, if they are not the start of one."""
    s = FrameScanner(start)
    s.feed(memoryview(buf)[start:])
    end = s.pos if s.at_boundary else s.record_start
    assert end is not None
    return end, s.damage


def split(buf: bytes | memoryview) -> tuple[list[bytes], int, str | None]:
    """The whole frames of `buf` (which starts with one), where they stop, and the damage
    after them, if any."""
    out: list[bytes] = []
    view = memoryview(buf)
    s = FrameScanner(0)
    while True:
        want = s.wanted()
        if want is None:
            break
        at, n = want
        if at > len(view):
            break
        s.feed(view[s.pos:at])  # content, up to the next header
        if s.at_boundary and s.record_start is not None and s.pos > s.record_start:
            out.append(bytes(view[s.record_start: s.pos]))
        if at + n > len(view):
            break
        s.feed(view[at: at + n])
    end = s.pos if s.at_boundary else s.record_start
    return out, end or 0, s.damage
