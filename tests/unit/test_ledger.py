from __future__ import annotations

import hashlib
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.core.ledger import BLOCK, Ledger, block_start, digest_of

# Sizes around block boundaries matter most; keep examples small but crossing blocks.
data_st = st.binary(min_size=0, max_size=3 * BLOCK + 100)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=60, deadline=None)
@given(data=data_st, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_digest_does_not_depend_on_how_bytes_arrived(data: bytes, cuts: list[int]) -> None:
    ledger = Ledger()
    for piece in split(data, cuts):
        ledger.extend(piece)
    assert ledger.size == len(data)
    assert ledger.digest() == digest_of(data)


@settings(max_examples=60, deadline=None)
@given(data=data_st, at=st.integers(min_value=0))
def test_digest_at_any_offset_equals_digest_of_that_prefix(data: bytes, at: int) -> None:
    offset = at % (len(data) + 1)
    ledger = Ledger()
    ledger.extend(data)
    assert ledger.digest_at(offset, data[block_start(offset) : offset]) == digest_of(data[:offset])


@settings(max_examples=40, deadline=None)
@given(data=data_st, flip=st.integers(min_value=0))
def test_any_changed_byte_changes_the_digest_and_is_located(data: bytes, flip: int) -> None:
    if not data:
        return
    i = flip % len(data)
    other = bytearray(data)
    other[i] ^= 0x01
    a, b = Ledger(), Ledger()
    a.extend(data)
    b.extend(bytes(other))
    assert a.digest() != b.digest()
    changed = a.first_changed_block(b.chain)
    if i < (len(data) // BLOCK) * BLOCK:
        assert changed == i // BLOCK
    else:
        assert changed is None  # the change sits in the partial block, which has no chain value


def test_restore_continues_exactly_where_it_left_off() -> None:
    data = bytes(range(256)) * 700  # 179200 bytes: two full blocks and a partial one
    ledger = Ledger()
    ledger.extend(data)
    size = ledger.size
    restored = Ledger.restore(list(ledger.chain), size, data[block_start(size) : size])
    assert restored.digest() == ledger.digest()
    assert restored.partial_digest() == hashlib.sha256(data[block_start(size) :]).digest()
    restored.extend(b"more\n")
    assert restored.digest() == digest_of(data + b"more\n")


def test_digest_commits_to_the_length() -> None:
    # A prefix and its extension by zero-length never collide with other lengths.
    assert digest_of(b"") != digest_of(b"\x00")
    assert digest_of(b"a" * BLOCK) != digest_of(b"a" * (BLOCK - 1))


@settings(max_examples=60, deadline=None)
@given(data=data_st, cut=st.integers(min_value=0), flip=st.booleans())
def test_is_prefix_of_ours_tells_truncation_from_edit(data: bytes, cut: int, flip: bool) -> None:
    n = cut % (len(data) + 1)
    other = bytearray(data[:n])
    if flip and other:
        other[-1] ^= 0xFF
    ours = Ledger()
    ours.extend(data)
    theirs = Ledger()
    theirs.extend(bytes(other))
    verdict = ours.is_prefix_of_ours(theirs)
    truth = data.startswith(bytes(other))
    assert verdict in (truth, None)
    if n // BLOCK == len(data) // BLOCK or n % BLOCK == 0:
        assert verdict is truth  # decidable: ends in our partial block or on a block edge


def test_the_end_check_reaches_back_to_the_last_lines_start() -> None:
    """Simulator seed 4045912: a file cut back to a line boundary and written again between
    two looks, whose new line reads the same as the old one in the partial block (padding):
    checking the partial block alone vouched for the old line's start, and the new line's
    end shipped onto it. The check covers the last line from its start."""
    first = b"L" * 100 + b"\n"
    old = first + b'{"id":"old","p":"' + b"x" * BLOCK
    new = first + b'{"id":"new","p":"' + b"x" * BLOCK + b'"}\n'
    ledger = Ledger()
    ledger.extend(old)
    start = ledger.recheck_start()
    assert start == 0  # the last line starts in block 0
    assert ledger.matches_end(old[start:])
    assert not ledger.matches_end(new[start : ledger.size])
    # Its partial block alone reads the same: that check could not tell.
    assert new[block_start(ledger.size) : ledger.size] == ledger.tail


@settings(max_examples=60, deadline=None)
@given(data=data_st, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_the_end_check_covers_the_last_line_or_two_more_blocks(data: bytes,
                                                               cuts: list[int]) -> None:
    ledger = Ledger()
    for piece in split(data, cuts):
        ledger.extend(piece)
    start = ledger.recheck_start()
    line = data.rfind(b"\n", 0, max(0, len(data) - 1)) + 1
    last = block_start(len(data)) if len(data) % BLOCK or not data else len(data) - BLOCK
    assert start <= last and (start <= block_start(line) or start == last - 2 * BLOCK)
    assert ledger.matches_end(data[start:])
    # Restored from the partial block (the line's start may be unknown): never a later start.
    restored = Ledger.restore(ledger.chain, ledger.size, ledger.tail)
    assert restored.recheck_start() <= start
    assert restored.matches_end(data[restored.recheck_start():])


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=2 * BLOCK + 100),
       more=st.binary(min_size=1, max_size=BLOCK + 10))
def test_a_ledger_restored_without_its_partial_bytes_checks_and_grows_alike(
        data: bytes, more: bytes) -> None:
    """A restart keeps the partial block's digest, not its bytes (1000 idle files held ~64 MB
    of them): the end is checked against the digest, what needs the bytes says it cannot
    tell, and the bytes are kept again once the block fills up."""
    kept = Ledger()
    kept.extend(data)
    lean = Ledger.restore(kept.chain, kept.size, kept.tail, keep_tail=False)
    assert lean.digest() == kept.digest() and lean.known_tail is None
    start = lean.recheck_start()
    assert lean.matches_end(data[start:])
    if len(data) % BLOCK:  # an edit inside the partial block is seen through its digest
        edited = data[:-1] + bytes([data[-1] ^ 1])
        assert not lean.matches_end(edited[start:])
        if len(data) % BLOCK > 1:  # inside the partial block: the file must be read
            assert kept.digest_known(len(data) - 1) is not None
            assert lean.digest_known(len(data) - 1) is None
        shorter = Ledger()
        shorter.extend(data[:-1])
        assert kept.is_prefix_of_ours(shorter) is True
        assert lean.is_prefix_of_ours(shorter) is None  # cannot tell a cut from an edit
    assert lean.digest_with(more) == kept.digest_with(more) == digest_of(data + more)
    lean.extend(more)
    kept.extend(more)
    assert lean.digest() == kept.digest() == digest_of(data + more)
    filled = block_start(len(data)) != block_start(len(data) + len(more))
    assert (lean.known_tail == kept.tail) if filled else lean.known_tail is None
    assert lean.matches_end((data + more)[lean.recheck_start():])


@given(data=st.binary(min_size=0, max_size=2 * BLOCK + 100),
       more=st.binary(min_size=1, max_size=2 * BLOCK + 10))
def test_a_ledger_that_forgets_its_tail_checks_and_grows_alike_and_keeps_none(
        data: bytes, more: bytes) -> None:
    """A key made on a peer's word keeps no partial block's bytes (up to 64 KiB a key): not
    now, and not after the block fills up either; digests and checks are the same."""
    kept, lean = Ledger(), Ledger()
    kept.extend(data)
    lean.extend(data)
    lean.forget_tail()
    assert lean.digest() == kept.digest() and lean.known_tail is None
    lean.extend(more)
    kept.extend(more)
    assert lean.digest() == kept.digest() == digest_of(data + more)
    assert lean.known_tail is None
    assert lean.matches_end((data + more)[lean.recheck_start():])
    whole = data + more
    if len(whole) % BLOCK:
        edited = whole[:-1] + bytes([whole[-1] ^ 1])
        assert not lean.matches_end(edited[lean.recheck_start():])
