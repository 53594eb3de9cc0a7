"""core/peerjson.py: a peer's large JSON parsed as orjson parses it, without its transient."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from syncd.core import peerjson

PAD = b" " * (peerjson.SMALL + 1)  # past SMALL: the standard library's parser

CASES = [
    b'[18446744073709551616]', b'[18446744073709551615]', b'[-9223372036854775809]',
    b'[-9223372036854775808]', b'[123456789012345678901234567890]', b'[1e400]', b'[-1e400]',
    b'[1e-400]', b'[-0.0]', b'[-0]', b'[1.0]', b'[1E2]', b'[.5]', b'[+1]', b'[01]',
    b'[NaN]', b'[Infinity]', b'[-Infinity]',
    b'["\\ud800"]', b'["\\udc80"]', b'{"\\ud800":1}', b'["\\ud83d\\ude00"]', b'["\\\\ud800"]',
    b'["\xed\xa0\x80"]', b'["\xff"]', b'\xef\xbb\xbf[1]', b'["\\u0000"]', b'["a\tb"]',
    b'{"a":1,"a":2}', b' [1] ', b'[1]\n\r\t ', b'[1]\x0b', b'[1]\x00', b'[1,]', b'[1] [2]',
    b'', b'"x"', b'true', b'null', b'{"a":[1,2,{"b":null}],"c":"\xc3\xa9"}',
    b'[' * 900 + b']' * 900, b'[' * 5000 + b']' * 5000,
]


def _outcome(loads, data: bytes) -> tuple[str, str]:
    try:
        value = loads(data)
    except orjson.JSONDecodeError:
        return ("refused", "")
    return ("parsed", "deep" if data.lstrip().startswith(b"[[[") else repr(value))


@pytest.mark.parametrize("case", CASES)
def test_a_large_input_is_parsed_or_refused_exactly_as_orjson_does(case: bytes) -> None:
    for data in (case + PAD, PAD + case):
        assert _outcome(peerjson.loads, data) == _outcome(orjson.loads, data)


def test_a_small_input_goes_to_orjson() -> None:
    assert peerjson.loads(b'{"a":[1]}') == {"a": [1]}
    with pytest.raises(orjson.JSONDecodeError):
        peerjson.loads(b"[NaN]")


def test_a_large_header_costs_a_few_times_its_size_not_thirteen() -> None:
    # A hostile frame header: 50 positions naming 80 made-up hosts each (about 800 KiB).
    names = ["y" * 200] * 80
    data = orjson.dumps({"items": [{"k": "pos", "diverged": names}] * 50})
    tracemalloc.start()
    try:
        for loads in (orjson.loads, peerjson.loads):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            value = loads(data)
            peak = tracemalloc.get_traced_memory()[1] - base
            del value
            if loads is orjson.loads:
                assert peak > 10 * len(data)  # what it was (the case for this module)
            else:
                assert peak < 4 * len(data)
    finally:
        tracemalloc.stop()
