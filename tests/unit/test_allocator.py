"""allocator.tune(): glibc's thresholds are set, unless an operator set them by environment."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

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


ARENAS = r"""
import ctypes, ctypes.util, os, re, sys, tempfile, threading
from syncd.ops import allocator
assert allocator.tune()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
held = []
def work():  # what a reader thread does: many blocks past pymalloc's 512 bytes, kept
    held.extend(bytes(4096 + i) for i in range(2000))
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
print(len(re.findall(r'<heap nr="\d+">', open(path).read())))
os.unlink(path)
"""


def test_threads_allocate_from_one_arena() -> None:
    """Blocks allocated by threads come from the main heap, not from arenas of their own
    that keep their free memory resident (docs/peer-limits.md)."""
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(ctypes.CDLL(name), "malloc_info"):
        pytest.skip("not glibc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", ARENAS], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert int(out) == 1
