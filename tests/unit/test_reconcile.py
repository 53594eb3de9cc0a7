"""The pure rule, driven by random histories (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.core.ledger import BLOCK, Ledger, Position, block_start
from syncd.core.reconcile import (
    LocalChange,
    PeerState,
    Verdict,
    choose_source,
    file_state,
    first_change,
    judge_data,
    judge_local,
    judge_peer,
    judge_request,
)

lines = st.lists(st.binary(min_size=0, max_size=300).map(lambda b: b.replace(b"\n", b"") + b"\n"),
                 min_size=0, max_size=30).map(b"".join)


def ledger_of(data: bytes) -> Ledger:
    ledger = Ledger()
    ledger.extend(data)
    return ledger


def position(data: bytes) -> Position:
    return Position(len(data), ledger_of(data).digest())


def digest_at(data: bytes, offset: int) -> bytes:
    return ledger_of(data).digest_at(offset, data[block_start(offset) : offset])


@settings(max_examples=150, deadline=None)
@given(common=lines, ours=lines, theirs=lines)
def test_peer_is_diverged_exactly_when_neither_copy_is_a_prefix_of_the_other(
    common: bytes, ours: bytes, theirs: bytes
) -> None:
    local, peer = common + ours, common + theirs
    consistent = local.startswith(peer) or peer.startswith(local)
    ours_at = digest_at(local, len(peer)) if len(peer) <= len(local) else None
    state = judge_peer(position(local), position(peer), ours_at)
    if len(peer) > len(local):
        assert state is PeerState.AHEAD  # checked later, when it answers a request
    elif consistent:
        assert state is (PeerState.IN_SYNC if len(peer) == len(local) else PeerState.BEHIND)
    else:
        assert state is PeerState.DIVERGED
    # The rule is the same seen from the other side.
    if len(local) <= len(peer):
        theirs_at = digest_at(peer, len(local))
        back = judge_peer(position(peer), position(local), theirs_at)
        assert (back is PeerState.DIVERGED) == (not consistent)


@settings(max_examples=150, deadline=None)
@given(
    source=lines,
    schedule=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["send", "dup", "drop"])),
                      max_size=40),
)
def test_receiver_copy_is_always_a_prefix_and_completes_by_anti_entropy(
    source: bytes, schedule: list[tuple[int, str]]
) -> None:
    # The writer's bytes go out as frames cut at random line ends; the network drops,
    # duplicates and reorders them. The receiver applies only what judge_data allows.
    ends = [i + 1 for i, b in enumerate(source) if b == ord("\n")]
    cuts = sorted({ends[c % len(ends)] for c, _ in schedule} | {len(source)}) if ends else []
    frames, start = [], 0
    for end in cuts:
        if end > start:
            frames.append((start, digest_at(source, start), source[start:end]))
            start = end
    network = []
    for (pick, fate), frame in zip(schedule, frames, strict=False):
        if fate != "drop":
            network.insert(pick % (len(network) + 1), frame)
        if fate == "dup":
            network.append(frame)
    copy = Ledger()
    held = b""
    for offset, base, data in network:
        verdict = judge_data(Position(copy.size, copy.digest()), offset, base)
        assert verdict is not Verdict.DIVERGED
        if verdict is Verdict.APPEND:
            copy.extend(data)
            held += data
        assert source.startswith(held)
    # Anti-entropy: the receiver asks for what it lacks; the source checks and answers.
    have = len(held)
    answer = judge_request(len(source), have, copy.digest(),
                           digest_at(source, have) if have <= len(source) else None)
    if have < len(source):
        assert answer is Verdict.APPEND
        held += source[have:]
    assert held == source


@settings(max_examples=100, deadline=None)
@given(common=lines, ours=lines, theirs=lines)
def test_data_after_a_different_prefix_is_refused(common: bytes, ours: bytes,
                                                  theirs: bytes) -> None:
    local, sender = common + ours, common + theirs
    if len(sender) < len(local) or sender.startswith(local):
        return
    # The sender sends its bytes from our size on: its prefix there differs from ours.
    verdict = judge_data(position(local), len(local), digest_at(sender, len(local)))
    assert verdict is Verdict.DIVERGED


def test_data_verdicts_by_offset() -> None:
    here = position(b"a\nb\n")
    assert judge_data(here, 4, here.digest) is Verdict.APPEND
    assert judge_data(here, 2, b"x" * 32) is Verdict.DUPLICATE
    assert judge_data(here, 9, b"x" * 32) is Verdict.GAP
    assert judge_data(here, 4, b"x" * 32) is Verdict.DIVERGED


def test_request_verdicts() -> None:
    data = b"a\nb\nc\n"
    assert judge_request(6, 2, digest_at(data, 2), digest_at(data, 2)) is Verdict.APPEND
    assert judge_request(6, 2, b"x" * 32, digest_at(data, 2)) is Verdict.DIVERGED
    assert judge_request(6, 6, digest_at(data, 6), digest_at(data, 6)) is Verdict.DUPLICATE
    assert judge_request(6, 9, b"x" * 32, None) is Verdict.DUPLICATE


def test_choose_source_takes_the_longest_usable_copy() -> None:
    assert choose_source(10, {"a": (50, True), "b": (80, False), "c": (60, True)}) == "c"
    assert choose_source(10, {"a": (5, True)}) is None
    assert choose_source(10, {"b": (20, True), "a": (20, True)}) == "a"


def test_judge_local_says_whether_our_history_is_still_a_prefix() -> None:
    ino = (1, 2)
    assert judge_local(0, None, None, None, None) is LocalChange.NONE
    assert judge_local(10, ino, (10, 5), None, None) is LocalChange.REPLACED  # deleted
    assert judge_local(10, ino, (10, 5), (1, 3, 20, 6), True) is LocalChange.REPLACED  # inode
    assert judge_local(10, ino, (10, 5), (1, 2, 4, 6), None) is LocalChange.SHRUNK
    assert judge_local(10, ino, (10, 5), (1, 2, 20, 6), True) is LocalChange.GROWTH
    assert judge_local(10, ino, (10, 5), (1, 2, 20, 6), False) is LocalChange.EDITED
    assert judge_local(10, ino, (20, 6), (1, 2, 20, 6), True) is LocalChange.NONE  # torn, seen
    assert judge_local(10, ino, (10, 5), (1, 2, 10, 9), True) is LocalChange.TOUCHED
    assert judge_local(10, ino, (10, 5), (1, 2, 10, 5), True) is LocalChange.NONE
    assert judge_local(10, ino, None, (1, 2, 10, 5), False) is LocalChange.EDITED


def test_first_change_names_the_byte_in_the_last_block_and_the_block_before() -> None:
    old, new = ledger_of(b"a" * 100), ledger_of(b"a" * 40 + b"b" * 60)
    assert first_change(old.chain, old.tail, old.size, new.chain, new.tail, new.size) == 40
    big_old = ledger_of(b"x" * (BLOCK * 2 + 5))
    big_new = ledger_of(b"x" * BLOCK + b"y" * (BLOCK + 5))
    assert first_change(big_old.chain, big_old.tail, big_old.size, big_new.chain,
                        big_new.tail, big_new.size) == BLOCK
    assert first_change([], None, 10, new.chain, new.tail, new.size) == 0


def test_file_state_words() -> None:
    assert file_state(None, True, []) == "verifying"
    assert file_state("reset", False, [PeerState.IN_SYNC]) == "reset"
    assert file_state(None, False, [PeerState.IN_SYNC, PeerState.DIVERGED]) == "diverged"
    assert file_state(None, False, [PeerState.BEHIND, PeerState.AHEAD]) == "behind"
    assert file_state(None, False, [PeerState.BEHIND, PeerState.IN_SYNC]) == "ahead"
    assert file_state(None, False, [PeerState.IN_SYNC]) == "in_sync"
    assert file_state(None, False, []) == "alone"
    assert file_state(None, False, [PeerState.IN_SYNC], "error") == "error"
    assert file_state("diverged", False, [PeerState.IN_SYNC], "paused") == "diverged"
    # Diverged from a peer (even one that announces nothing now), live with the others.
    assert file_state(None, False, [PeerState.IN_SYNC], diverged=True) == "diverged"
    assert file_state(None, False, [], diverged=True) == "diverged"


@settings(max_examples=100, deadline=None)
@given(common=st.binary(max_size=3 * 65536 + 10), a=st.binary(min_size=1, max_size=50),
       b=st.binary(min_size=1, max_size=50))
def test_locating_the_first_difference(common: bytes, a: bytes, b: bytes) -> None:
    from syncd.core.ledger import BLOCK
    from syncd.core.reconcile import first_differing_block, first_differing_byte

    if a[0] == b[0]:
        b = bytes([(a[0] + 1) % 256]) + b[1:]
    ours, theirs = common + a, common + b
    lo, lt = ledger_of(ours), ledger_of(theirs)
    block = first_differing_block(lo.chain, lt.chain[1:], 0)
    if block is None:  # the difference sits after the last common full block
        block = min(len(lo.chain), len(lt.chain)) - 1
    assert block == len(common) // BLOCK
    start = block * BLOCK
    i = first_differing_byte(ours[start : start + BLOCK], theirs[start : start + BLOCK])
    assert i is not None and start + i == len(common)
    assert first_differing_byte(b"abc", b"abcd") is None
