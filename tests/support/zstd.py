"""Zstandard frames for tests, as dsh-session writes them: one checksummed frame per batch
(Python 3.14's compression.zstd, or its backport)."""

from __future__ import annotations

import struct

try:
    from compression import zstd as _zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd as _zstd  # type: ignore[no-redef,unused-ignore]

ZstdError = _zstd.ZstdError


def frame(payload: bytes, checksum: bool = True, level: int = 3) -> bytes:
    """One whole frame holding `payload` (with its content size and, by default, checksum)."""
    options = {_zstd.CompressionParameter.checksum_flag: int(checksum),
               _zstd.CompressionParameter.compression_level: level}
    return bytes(_zstd.compress(payload, options=options))


def skippable(payload: bytes, nibble: int = 0) -> bytes:
    return struct.pack("<II", 0x184D2A50 + nibble, len(payload)) + payload


def decompress_frame(data: bytes) -> bytes:
    """The content of exactly one frame (its checksum checked); ZstdError otherwise."""
    d = _zstd.ZstdDecompressor()
    out = d.decompress(data)
    if not d.eof or d.unused_data:
        raise ZstdError("not exactly one whole frame")
    return bytes(out)


def decompress_all(data: bytes) -> bytes:
    return bytes(_zstd.decompress(data))
