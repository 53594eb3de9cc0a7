"""allocator.tune(): glibc's thresholds are set, unless an operator set them by environment."""

from __future__ import annotations

import ctypes.util

import pytest

from syncd.ops import allocator


def test_the_thresholds_are_set_on_glibc() -> None:
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(ctypes.CDLL(name), "mallopt"):
        pytest.skip("not glibc")
    assert allocator.tune()


@pytest.mark.parametrize("variable", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_an_operators_environment_wins(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "131072")
    assert not allocator.tune()
