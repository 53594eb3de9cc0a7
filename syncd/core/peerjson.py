"""JSON from peers, parsed without orjson's transient of ~13x the input.

orjson (yyjson) allocates its document for the worst case of the input's length before it
parses: about 13 bytes per input byte, freed again at once. A peer's frame header or manifest
part of 900 KiB made a victim allocate 9-13 MiB at once, inside one message, in glibc's heap
(under allocator.MMAP_THRESHOLD), which the heap kept: the swings of the hostile-peer long mode
(docs/peer-limits.md). Past SMALL bytes the standard library's parser is used instead (about
2x the input besides the objects made), made to accept exactly what orjson accepts: no NaN,
Infinity or out-of-range floats, integers past 64 bits as floats, no lone surrogates, valid
UTF-8 only; every refusal is an orjson.JSONDecodeError, as from orjson.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

import orjson

# Inputs up to this many bytes go to orjson (its transient: under 1 MiB). Every frame header
# of a healthy peer is smaller (300 items: about 30 KiB).
SMALL = 64 << 10
_LONE = re.compile(r"\\u[dD][89a-fA-F]")  # a \u escape of a surrogate (a pair is fine)
_DECODER = None


def _error(msg: str, doc: str = "", pos: int = 0) -> NoReturn:
    raise orjson.JSONDecodeError(msg, doc, pos)


def _constant(name: str) -> NoReturn:
    _error(f"{name} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        _error("number out of range")
    return value


def _int(text: str) -> int | float:
    value = int(text)
    # orjson gives a float for an integer past what 64 bits hold (either sign)
    return value if -(1 << 63) <= value < (1 << 64) else float(text)


def _decoder() -> json.JSONDecoder:
    global _DECODER
    if _DECODER is None:
        _DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int,
                                    parse_constant=_constant)
    return _DECODER


def loads(data: bytes | bytearray | memoryview) -> Any:
    """What orjson.loads(data) returns, or raises, with a small transient."""
    if len(data) <= SMALL:
        return orjson.loads(data)
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError:
        _error("str is not valid UTF-8")
    try:
        value, end = _decoder().raw_decode(text, _skip(text, 0))
    except json.JSONDecodeError as e:
        _error(e.msg, "", e.pos)
    except RecursionError:
        _error("recursion limit reached")
    if _skip(text, end) != len(text):
        _error("trailing characters", "", end)
    if _LONE.search(text) is not None:
        _no_lone_surrogates(value)
    return value


def _skip(text: str, at: int) -> int:
    n = len(text)
    while at < n and text[at] in " \t\n\r":
        at += 1
    return at


def _no_lone_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                _error("lone surrogate in a string")
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
