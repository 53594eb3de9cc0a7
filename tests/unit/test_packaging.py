"""The lock files against pyproject.toml, and the packaging scripts' syntax.

The package itself is tested by `packaging/test-deb` (root, a booted Debian 12), not here.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

TOP = Path(__file__).parents[2]


def pins(lock: str) -> dict[str, str]:
    """name -> version; each pin must come with at least one hash (pip needs them all)."""
    found = {}
    # One entry per line starting in column 0: `name==version [; marker] \`, then its hashes.
    for entry in re.split(r"\n(?=[^\s#])", (TOP / lock).read_text()):
        if entry.startswith("#"):
            continue
        pin = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", entry)
        assert pin, f"{lock}: not an exact pin: {entry.splitlines()[0]}"
        assert "--hash=sha256:" in entry, f"{lock}: {pin.group(0)} has no hash"
        found[canonicalize_name(pin.group(1))] = pin.group(2)
    return found


def test_locks_pin_what_pyproject_asks_for_with_hashes() -> None:
    project = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    extras = project["optional-dependencies"]
    for lock, wanted in ((runtime, project["dependencies"]),
                         (dev, [*project["dependencies"], *extras["dev"], *extras["demo"]])):
        for line in wanted:
            req = Requirement(line)
            name = canonicalize_name(req.name)
            assert name in lock, f"{req.name} is not locked: run bash packaging/lock"
            assert req.specifier.contains(lock[name], prereleases=True), (
                f"{req.name}=={lock[name]} does not satisfy {req.specifier}: "
                "run bash packaging/lock")
    # The tests run on the versions the package ships.
    assert {n: dev[n] for n in runtime} == runtime


@pytest.mark.parametrize("script", ["packaging/build-deb", "packaging/test-deb",
                                    "packaging/lock", "tests/run.sh"])
def test_bash_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(TOP / script)], check=True)


@pytest.mark.parametrize("script", ["postinst", "prerm", "postrm"])
def test_maintainer_scripts_are_posix_sh(script: str) -> None:
    path = TOP / "packaging" / "debian" / script
    assert path.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(path)], check=True)
