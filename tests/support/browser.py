"""A real headless browser for the page tests: Debian's `chromium`, one run per page.

No WebDriver: `--dump-dom` prints the document as Chromium built it (after parsing, with the
Content-Security-Policy applied), `--screenshot` writes what it drew. Each run gets a fresh
profile directory and HOME under the test's temporary directory, and runs in a process group
of its own, killed afterwards: Chromium's helper processes (zygote, renderer) never outlive
the test. As root it needs --no-sandbox; the other switches keep it off the network except for
the page asked for (no updates, sync, QUIC or background requests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

SWITCHES = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def run(workdir: Path, url: str, *args: str, timeout: float = 90) -> str:
    """Chromium's stdout for `url` with `args` (--dump-dom, --screenshot=...)."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("chromium is not installed (tests/run.sh installs it)")
    profile = workdir / "chromium-profile"
    home = workdir / "chromium-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
           "LANG": "C.UTF-8"}
    proc = subprocess.Popen([binary, *SWITCHES, f"--user-data-dir={profile}", *args, url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"chromium did not finish within {timeout} s on {url}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its group: helpers it left behind
        proc.wait(10)
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited with {proc.returncode} on {url}: "
                             f"{err.decode(errors='replace')[-2000:]}")
    return out.decode(errors="replace")
