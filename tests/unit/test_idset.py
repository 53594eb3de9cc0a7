"""Entry ids as 64-bit digests (syncd/core/idset.py): membership across merges, and the saved
form, little-endian whatever the host."""

from __future__ import annotations

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
