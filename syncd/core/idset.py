"""Entry ids as 64-bit digests, in a compact set the log checker keeps per file and saves."""

from __future__ import annotations

import bisect
import hashlib
import sys
from array import array


def id_digest(entry_id: str) -> int:
    # Ids are kept as 64-bit digests: 8 bytes each in the saved state instead of a 36-character
    # UUID, at the price of a ~n/2^64 chance that a missing anchor goes unnoticed.
    digest = hashlib.blake2b(entry_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class IdSet:
    """A set of 64-bit id digests in 8 bytes each (a Python set costs ~70): a host keeps one
    per replicated file, and thousands of files of thousands of entries add up."""

    __slots__ = ("_recent", "_sorted")
    _MERGE_AT = 1024

    def __init__(self, ids: array[int] | None = None) -> None:
        self._sorted = array("Q", sorted(ids or ()))
        self._recent: set[int] = set()

    def add(self, digest: int) -> None:
        self._recent.add(digest)
        # Merge when the recent set reaches an eighth of the sorted part: O(n log n) in all,
        # while the set (the expensive part per id) stays small.
        if len(self._recent) >= max(self._MERGE_AT, len(self._sorted) >> 3):
            self._sorted = array("Q", sorted(self._sorted + array("Q", self._recent)))
            self._recent = set()

    def __contains__(self, digest: int) -> bool:
        if digest in self._recent:
            return True
        i = bisect.bisect_left(self._sorted, digest)
        return i < len(self._sorted) and self._sorted[i] == digest

    def all(self) -> array[int]:
        return self._sorted + array("Q", self._recent)


def pack_ids(ids: IdSet) -> bytes:
    packed = ids.all()
    if sys.byteorder == "big":
        packed.byteswap()  # saved little-endian, so that a state file moves between hosts
    return packed.tobytes()


def unpack_ids(blob: bytes) -> IdSet:
    packed = array("Q")
    packed.frombytes(blob)
    if sys.byteorder == "big":
        packed.byteswap()
    return IdSet(packed)
