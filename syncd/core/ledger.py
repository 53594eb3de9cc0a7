"""What a host knows about the bytes of one copy: its size and digests of every prefix.

Theory of operation
-------------------
A copy is cut into fixed blocks of BLOCK bytes. We keep a *chain* value after every full block:

    chain[0] = 32 zero bytes
    chain[i + 1] = sha256(chain[i] || sha256(block i))

and the digest of the prefix of length N is

    prefix_digest(N) = sha256(chain[N // BLOCK] || sha256(bytes[(N // BLOCK) * BLOCK : N]) || N)

So the digest of any prefix costs at most one block of hashing (the partial block), the digest
at the current end costs nothing (the partial block's hasher runs as bytes are appended), and two
hosts can find their first differing block by comparing chain values, which only ever diverge
once (a chain that differs at i differs at every later index).

The partial block's bytes are kept too (at most BLOCK bytes per file): they let a host check
the bytes just below its end by comparison instead of hashing, and decide whether a file that
shrank is a truncation of what it held or an edit. hashlib objects cannot be serialised, so a
restart rebuilds the partial block's hasher from disk; the chain itself is persisted. The
bytes themselves are not kept after a restart (`restore(keep_tail=False)`: 1000 idle files
held ~64 MB of them for nothing): until the partial block fills up, the bytes below the end
are checked against its digest instead, and what needs the bytes says it cannot tell.

This module is pure: no files, no clocks. Callers hand it bytes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from syncd.core.recordkinds import LINES, ZSTD_FRAMES
from syncd.core.zstdframes import FrameScanner

BLOCK = 64 * 1024
# Full blocks below the partial one re-read at most to reach the last line's start (a longer
# line is checked on its last RECHECK_LINE_BLOCKS blocks only: every look re-reads them).
RECHECK_LINE_BLOCKS = 2
DIGEST_SIZE = 32
ZERO_CHAIN = bytes(DIGEST_SIZE)


def _finish(chain: bytes, partial_digest: bytes, size: int) -> bytes:
    return hashlib.sha256(chain + partial_digest + struct.pack(">Q", size)).digest()


def block_start(offset: int) -> int:
    """Offset of the first byte of the block that holds `offset` (the partial block's start)."""
    return offset - offset % BLOCK


class Ledger:
    """Size and prefix digests of one copy. Only grows: `extend` is the one way to change it."""

    __slots__ = ("_chain", "_digest", "_ends_line", "_frames", "_keep", "_line_start",
                 "_partial", "_size", "_tail")

    def __init__(self, records: str = LINES) -> None:
        self._chain: list[bytes] = [ZERO_CHAIN]
        self._partial = hashlib.sha256()
        self._tail: bytearray | None = bytearray()  # None: not kept (restored without it)
        self._keep = True  # the next partial block's bytes are kept (see forget_tail)
        self._size = 0
        self._digest: bytes | None = None  # digest() until the next extend
        # Where the last line (finished or not) begins, and whether our bytes end with a
        # newline; None when not known (restored from the partial block only).
        # The same for Zstandard frames ("line" below reads "record"): kept by a scanner of
        # the frame headers, fed every byte (recordkinds.py).
        self._line_start: int | None = 0
        self._ends_line: bool | None = True
        self._frames = FrameScanner(0) if records == ZSTD_FRAMES else None

    @property
    def records(self) -> str:
        return LINES if self._frames is None else ZSTD_FRAMES

    @property
    def size(self) -> int:
        return self._size

    @property
    def chain(self) -> list[bytes]:
        """chain[i] covers the first i full blocks. Read-only by convention."""
        return self._chain

    def extend(self, data: bytes) -> None:
        self._digest = None
        if self._frames is not None:
            self._frames.feed(data)
            self._line_start = self._frames.record_start
            self._ends_line = self._frames.at_boundary
        elif data:
            inner = data.rfind(b"\n", 0, len(data) - 1)
            if inner >= 0:
                self._line_start = self._size + inner + 1
            elif self._ends_line is None:
                self._line_start = None
            elif self._ends_line:
                self._line_start = self._size
            self._ends_line = data.endswith(b"\n")
        view = memoryview(data)
        while view:
            room = BLOCK - self._size % BLOCK
            piece = view[:room]
            self._partial.update(piece)
            if self._tail is not None:
                self._tail += piece
            self._size += len(piece)
            view = view[room:]
            if len(piece) == room:
                self._chain.append(
                    hashlib.sha256(self._chain[-1] + self._partial.digest()).digest()
                )
                self._partial = hashlib.sha256()
                self._tail = bytearray() if self._keep else None

    def digest(self) -> bytes:
        """Digest of the whole prefix this ledger covers (O(1), and kept until it grows: a
        replicated write asks for it half a dozen times)."""
        d = self._digest
        if d is None:
            d = self._digest = _finish(self._chain[-1], self._partial.digest(), self._size)
        return d

    def partial_digest(self) -> bytes:
        """sha256 of the bytes after the last full block: what a restart checks against disk."""
        return self._partial.digest()

    def ends_record_with(self, data: bytes) -> bool | None:
        """Whether our bytes followed by `data` end where a record ends (None: not known)."""
        if self._frames is None:
            return data.endswith(b"\n")
        scanner = self._frames.copy()
        scanner.feed(data)
        return scanner.at_boundary

    @property
    def open_line_start(self) -> int | None:
        """Where the unfinished line at our end begins, if we end mid-line (and know it)."""
        return self._line_start if self._ends_line is False else None

    @property
    def tail(self) -> bytes:
        """The bytes after the last full block (fewer than BLOCK); only of a ledger that keeps
        them (see known_tail)."""
        if self._tail is None:
            raise ValueError("the partial block's bytes are not kept (restored without them)")
        return bytes(self._tail)

    def forget_tail(self) -> None:
        """Keep no partial block's bytes from now on, as a restored ledger does not keep its
        own (the module's docstring): for a copy whose bytes only peers write, a key made on
        a peer's word, where up to BLOCK bytes per key would be held on that peer's word
        (docs/peer-limits.md)."""
        self._keep = False
        self._tail = None

    @property
    def known_tail(self) -> bytes | None:
        """The bytes after the last full block, or None if not kept (restored without them,
        until the partial block fills up)."""
        return None if self._tail is None else bytes(self._tail)

    def recheck_start(self) -> int:
        """Where the bytes re-read before vouching for our end begin.

        Normally the partial block below the end (kept here, so the check is a comparison).
        When the end lies exactly on a block boundary the partial block is empty and would
        check nothing, so the last full block is re-read instead and checked against its chain
        value: an edit just below the end must never ship under a stale digest.

        And never less than the start of the last line (up to RECHECK_LINE_BLOCKS more full
        blocks): a file cut back to a line boundary and written again between two looks can
        end past ours with other bytes below our end. If the bytes checked were only those of
        a line's middle, which may read the same in the new line (padding, say), the new
        line's end would ship onto the old line's start: a line nobody wrote.
        """
        size = self._size
        last = block_start(size) if size % BLOCK or size == 0 else size - BLOCK
        floor = max(0, last - RECHECK_LINE_BLOCKS * BLOCK)
        line = self._line_start
        return floor if line is None else max(floor, min(last, block_start(line)))

    def matches_end(self, data: bytes) -> bool:
        """Whether `data`, the bytes [recheck_start(), size) as read now, are what we recorded."""
        start = self.recheck_start()
        return len(data) == self._size - start and self.holds(start, data)

    def holds(self, first: int, data: bytes) -> bool:
        """Whether `data`, read from the file at block-aligned `first`, are the bytes this
        ledger recorded there: full blocks are checked against their chain values, and a last
        piece that ends at our end against the partial block we keep. A sender checks what it
        serves this way, so that it never vouches for bytes changed since it recorded them."""
        if first % BLOCK:
            raise ValueError("first must be block-aligned")
        at = 0
        while at < len(data):
            block = first // BLOCK + at // BLOCK
            piece = data[at : at + BLOCK]
            if len(piece) == BLOCK and block + 1 < len(self._chain):
                value = hashlib.sha256(self._chain[block] + hashlib.sha256(piece).digest())
                if value.digest() != self._chain[block + 1]:
                    return False
            elif first + at + len(piece) == self._size:
                if self._tail is None:  # not kept: its digest is (the whole partial block)
                    if hashlib.sha256(piece).digest() != self._partial.digest():
                        return False
                elif piece != self._tail:
                    return False
            at += BLOCK
        return True

    def digest_known(self, offset: int) -> bytes | None:
        """Digest of the prefix of length `offset` if it can be told without reading the file:
        at the end, on a block boundary, or inside the partial block we keep."""
        if not 0 <= offset <= self._size:
            return None
        if offset == self._size:
            return self.digest()
        start = block_start(offset)
        if offset == start:
            return self.digest_at(offset, b"")
        if start == block_start(self._size) and self._tail is not None:
            return self.digest_at(offset, bytes(self._tail[: offset - start]))
        return None

    def digest_with(self, extra: bytes) -> bytes:
        """Digest of our prefix followed by `extra` (bytes that are not ours to record)."""
        other = Ledger()  # lines: only its digest is asked
        other._chain = list(self._chain)
        other._partial = self._partial.copy()  # the partial block's bytes are not needed
        other._tail = None
        other._size = self._size
        other._line_start = other._ends_line = None
        other.extend(extra)
        return other.digest()

    def is_prefix_of_ours(self, other: Ledger) -> bool | None:
        """Whether `other` (a copy no longer than ours) is a prefix of ours.

        None when it cannot be told: `other` ends inside a block that is full here, and of
        full blocks only the digest is kept.
        """
        if other.size > self._size:
            raise ValueError("the other copy is longer")
        full = other.size // BLOCK
        if self.first_changed_block(other.chain) is not None:
            return False
        if full < len(self._chain) - 1:
            return None if other.size % BLOCK else True
        if self._tail is None or other._tail is None:
            return None  # our partial block's bytes are not kept
        return self._tail.startswith(other._tail)

    def digest_at(self, offset: int, partial: bytes) -> bytes:
        """Digest of the prefix of length `offset` <= size.

        `partial` must be the copy's bytes [block_start(offset), offset): the caller reads them.
        """
        if not 0 <= offset <= self._size:
            raise ValueError(f"offset {offset} outside 0..{self._size}")
        if offset == self._size:
            return self.digest()
        if len(partial) != offset - block_start(offset):
            raise ValueError("partial block has the wrong length")
        return _finish(self._chain[offset // BLOCK], hashlib.sha256(partial).digest(), offset)

    def first_changed_block(self, other_chain: list[bytes]) -> int | None:
        """Index of the first full block whose chain differs from `other_chain`, if any.

        Only the blocks both chains cover are compared.
        """
        n = min(len(self._chain), len(other_chain))
        for i in range(1, n):
            if self._chain[i] != other_chain[i]:
                return i - 1
        return None

    @classmethod
    def restore(cls, chain: list[bytes], size: int, partial: bytes, records: str = LINES,
                hashed: hashlib._Hash | None = None, keep_tail: bool = True) -> Ledger:
        """Rebuild from a persisted chain and the partial block read back from disk. For
        frames, where the last record began is not known until bytes that begin with a
        frame's magic number are appended (zstdframes.FrameScanner). `hashed`: a sha256
        already fed `partial` (the caller checked it against the record), not hashed
        again. `keep_tail` False: `partial` is not kept (see the module's docstring)."""
        full_blocks = size // BLOCK
        if len(chain) < full_blocks + 1:
            raise ValueError("persisted chain is shorter than the persisted size")
        if len(partial) != size - full_blocks * BLOCK:
            raise ValueError("partial block has the wrong length")
        ledger = cls(records)
        ledger._chain = chain[: full_blocks + 1]
        if hashed is not None:
            ledger._partial = hashed
        else:
            ledger._partial.update(partial)
        ledger._tail = bytearray(partial) if keep_tail else None
        ledger._size = size
        ledger._digest = None
        if ledger._frames is not None:
            if size:
                ledger._frames = FrameScanner(size, known=False)
                ledger._line_start = ledger._ends_line = None
        elif size:
            # Known only if the partial block holds the last line's start (or our end).
            inner = partial.rfind(b"\n", 0, len(partial) - 1)
            ledger._line_start = full_blocks * BLOCK + inner + 1 if inner >= 0 else None
            ledger._ends_line = partial.endswith(b"\n") if partial else None
        return ledger


@dataclass(frozen=True, slots=True)
class Position:
    """What a host announces about its copy: length and digest of the prefix it holds."""

    size: int
    digest: bytes

    @staticmethod
    def empty() -> Position:
        return Position(0, Ledger().digest())


def digest_of(data: bytes) -> bytes:
    """Prefix digest of a complete byte string (for tests and one-shot checks)."""
    ledger = Ledger()
    ledger.extend(data)
    return ledger.digest()


__all__ = [
    "BLOCK",
    "DIGEST_SIZE",
    "Ledger",
    "Position",
    "block_start",
    "digest_of",
]

