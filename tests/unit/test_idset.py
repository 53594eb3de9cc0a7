"""Entry ids as 64-bit digests (syncd/core/idset.py): membership across merges, and the saved
form, little-endian whatever the host."""

from __future__ import annotations

import pytest

from syncd.core.idset import IdSet, id_digest, pack_ids, unpack_ids

PINNED = 3405396810240292928  # id_digest("a"): BLAKE2b-64 of its UTF-8, little-endian


def test_ids_stay_members_across_merges_and_a_save() -> None:
    ids = IdSet()
    digests = [id_digest(f"entry-{i}") for i in range(5000)]  # several merges (1024 at first)
    for d in digests:
        ids.add(d)
    assert all(d in ids for d in digests)
    assert id_digest("never added") not in ids
    back = unpack_ids(pack_ids(ids))
    assert all(d in back for d in digests) and id_digest("never added") not in back
    assert len(pack_ids(ids)) == 8 * len(digests)


def test_the_saved_form_is_little_endian_and_the_digest_stable() -> None:
    ids = IdSet()
    ids.add(1)
    assert pack_ids(ids) == (1).to_bytes(8, "little")
    # Saved states hold these digests: they must not change between releases.
    assert id_digest("a") == PINNED
    assert id_digest("a") != id_digest("b")


def test_a_loaded_set_is_read_when_first_used_and_saves_back_the_same_bytes() -> None:
    ids = IdSet()
    digests = [id_digest(f"entry-{i}") for i in range(3000)]
    for d in digests:
        ids.add(d)
    saved = pack_ids(ids)
    back = unpack_ids(saved)
    assert pack_ids(back) == saved  # not read: the saved bytes as they are
    assert digests[7] in back and id_digest("never added") not in back
    back.add(id_digest("one more"))
    again = unpack_ids(pack_ids(back))
    assert all(d in again for d in [*digests, id_digest("one more")])
    assert len(pack_ids(again)) == 8 * 3001


def test_saved_ids_of_a_wrong_length_are_refused_at_load() -> None:
    with pytest.raises(ValueError):
        unpack_ids(b"\x00" * 12)
    assert id_digest("a") not in unpack_ids(b"")
