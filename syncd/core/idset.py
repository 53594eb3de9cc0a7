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
    per replicated file, and thousands of files of thousands of entries add up.

    One loaded from a saved state (unpack_ids) keeps the saved bytes as they are until it is
    first asked or added to: sorting them is the costly part of loading a log check's state,
    and an idle file after a restart is never asked (1000 keys of 1800 ids: 0.45 s of a
    start-up on these machines, for nothing)."""

    __slots__ = ("_recent", "_saved", "_sorted")
    _MERGE_AT = 1024

    def __init__(self, ids: array[int] | None = None) -> None:
        self._sorted = array("Q", sorted(ids or ()))
        self._recent: set[int] = set()
        self._saved: bytes | None = None  # little-endian, not yet read into _sorted

    @classmethod
    def from_saved(cls, blob: bytes) -> IdSet:
        """The set packed by pack_ids, read when first used."""
        if len(blob) % 8:
            raise ValueError("saved ids are not a whole number of 8-byte digests")
        ids = cls()
        ids._saved = blob if blob else None
        return ids

    def _load(self) -> None:
        blob, self._saved = self._saved, None
        if blob is not None:
            packed = array("Q")
            packed.frombytes(blob)
            if sys.byteorder == "big":
                packed.byteswap()
            self._sorted = array("Q", sorted(packed))

    def add(self, digest: int) -> None:
        if self._saved is not None:
            self._load()
        self._recent.add(digest)
        # Merge when the recent set reaches an eighth of the sorted part: O(n log n) in all,
        # while the set (the expensive part per id) stays small.
        if len(self._recent) >= max(self._MERGE_AT, len(self._sorted) >> 3):
            self._sorted = array("Q", sorted(self._sorted + array("Q", self._recent)))
            self._recent = set()

    def __contains__(self, digest: int) -> bool:
        if self._saved is not None:
            self._load()
        if digest in self._recent:
            return True
        i = bisect.bisect_left(self._sorted, digest)
        return i < len(self._sorted) and self._sorted[i] == digest

    def all(self) -> array[int]:
        if self._saved is not None:
            self._load()
        return self._sorted + array("Q", self._recent)

    def packed(self) -> bytes:
        """The saved form (little-endian digests): the bytes loaded, if never used since."""
        if self._saved is not None:
            return self._saved
        packed = self.all()
        if sys.byteorder == "big":
            packed.byteswap()  # saved little-endian, so that a state file moves between hosts
        return packed.tobytes()


def pack_ids(ids: IdSet) -> bytes:
    return ids.packed()


def unpack_ids(blob: bytes) -> IdSet:
    return IdSet.from_saved(blob)
