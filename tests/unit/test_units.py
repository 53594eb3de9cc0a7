"""Quantities for people (core/units.py), as `syncd status` and the status page show them."""

from __future__ import annotations

from syncd.core.units import human_bytes


def test_human_sizes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 10 * 2**20, 999 * 2**30,
                                     5 * 2**40)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "10 MiB", "999 GiB", "5 TiB"]
