"""Quantities written for people (the CLI's status and the status page)."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """Bytes for people: exact below 1 KiB, else three significant digits and a binary unit."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")
