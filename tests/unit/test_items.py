"""The items of the wire format (syncd/core/items.py) and the channels they go on
(syncd/core/topics.py), without frames or keys: every kind is written and read back, and
every kind has a channel that accepts it."""

from __future__ import annotations

import pytest

from syncd.core import items
from syncd.core.errors import FrameError
from syncd.core.items import Item, Kind
from syncd.core.topics import CHANNEL_KINDS, Channel, channel_of

D = bytes(range(32))
ENTRY = items.ResEntry("assets/a.png", 3, D, 0, "")

ONE_OF_EACH = {
    Kind.NODE: items.Presence(True, speaks=(5, 6), run_key=D),
    Kind.POS: items.Announce(10, D, "adopting", answers=2, diverged=("b",)),
    Kind.LIVE: items.Data(0, D, b"x\n"),
    Kind.REQ: items.Request(5, D, 5, 100, force=True, ask=3),
    Kind.FILL: items.Data(5, D, b"y\n"),
    Kind.REFUSE: items.Refuse(7, D),
    Kind.PROBE: items.Probe(items.ProbeWhat.SUMS, 0, 16),
    Kind.PROBED: items.Probed(items.ProbeWhat.BYTES, 64, 900, b"abc"),
    Kind.RSUM: items.ResSum(D, 1),
    Kind.RLIST: items.ResList(D),
    Kind.RHAVE: items.res_have(True, (ENTRY,), 1, 2),
    Kind.RREQ: items.ResAsk("assets/a.png", D, 0, 3),
    Kind.RDATA: items.ResChunk("assets/a.png", D, 3, 0, b"png"),
    Kind.RREFUSE: items.ResRefuse("assets/a.png", D, None, "not held here"),
    Kind.BEAT: items.Beat(40, 1000),
    Kind.ASK: items.Ask(),
}


def test_one_of_each_kind_is_listed() -> None:
    assert set(ONE_OF_EACH) == set(Kind)


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_is_written_and_read_back(kind: Kind) -> None:
    about = ("", "") if kind in (Kind.NODE, Kind.BEAT, Kind.ASK) else ("bot-1", "events.jsonl")
    item = Item(kind, ONE_OF_EACH[kind], *about)
    header, body = items.item_header(item)
    # Another item's bytes follow in the frame: only `n` of them are this one's.
    back, used = items.decode_item(header, memoryview(body + b"next"), 0, 1 << 20, set(Kind))
    assert back == item and used == len(body)


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_a_channel_that_accepts_it(kind: Kind) -> None:
    for to in ("", "b"):
        try:
            channel = channel_of(kind, to)
        except ValueError:
            assert not to  # only an addressed kind without its addressee
            continue
        assert kind in CHANNEL_KINDS[channel]


def test_an_item_on_a_channel_that_does_not_carry_it_is_refused() -> None:
    header, body = items.item_header(Item(Kind.REQ, ONE_OF_EACH[Kind.REQ], "bot-1", "f"))
    with pytest.raises(FrameError, match="req item on the wrong topic"):
        items.decode_item(header, memoryview(body), 0, 1 << 20, CHANNEL_KINDS[Channel.ALL])


@pytest.mark.parametrize("k", ["nope", "LIVE", "Kind.LIVE", 3, None, True, ["live"], {"k": 1}])
def test_an_item_of_no_known_kind_is_refused(k: object) -> None:
    header, body = items.item_header(Item(Kind.LIVE, ONE_OF_EACH[Kind.LIVE], "bot-1", "f"))
    header["k"] = k
    with pytest.raises(FrameError, match="unknown item kind"):
        items.decode_item(header, memoryview(body), 0, 1 << 20, set(Kind))
