"""The lock files against pyproject.toml, and the packaging scripts' syntax.

The package itself is tested by `packaging/test-deb` (root, a booted Debian 12), not here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

TOP = Path(__file__).parents[2]


def pins(lock: str) -> dict[str, str]:
    """name -> version; each pin must come with at least one hash (pip needs them all)."""
    found = {}
    # One entry per line starting in column 0: `name[extras]==version [; marker] \`, then
    # its hashes (extras as another package asks for them: packaging/lock, --no-strip-extras).
    for entry in re.split(r"\n(?=[^\s#])", (TOP / lock).read_text()):
        if entry.startswith("#"):
            continue
        pin = re.match(r"([A-Za-z0-9._-]+)(?:\[[A-Za-z0-9._,-]+\])?==([^\s;\\]+)", entry)
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


def apt_mirror(etc_apt: Path, suite: str = "bookworm") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOP / "packaging" / "apt-mirror"), suite,
                           str(etc_apt)], capture_output=True, text=True, check=False)


def test_test_deb_takes_the_mirror_from_this_machines_apt_sources(tmp_path: Path) -> None:
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    # deb822, as Debian 12 writes it: a disabled entry, source-only, security and updates
    # suites first; the first enabled `deb` entry of the suite itself wins.
    (parts / "debian.sources").write_text(
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n"
        "Components: main\nEnabled: no\n\n"
        "# a comment\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "types: deb\nURIs: http://mirror.example/debian/\n"
        " http://second.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    assert apt_mirror(tmp_path).stdout == "http://mirror.example/debian\n"
    # One-line sources come first, as apt reads them; options in brackets are skipped.
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] https://one-line.example/debian bookworm main\n")
    assert apt_mirror(tmp_path).stdout == "https://one-line.example/debian\n"
    # No source for the suite: an error, and no host name made up.
    done = apt_mirror(tmp_path, "trixie")
    assert done.returncode == 1 and done.stdout == ""
    assert "no 'deb' source for trixie" in done.stderr and "SYNCD_TEST_MIRROR" in done.stderr
    assert "deb.debian.org" not in (TOP / "packaging" / "test-deb").read_text()


def test_the_bot_drop_in_waits_for_syncd_and_is_shipped() -> None:
    conf = (TOP / "systemd" / "wait-for-syncd.conf").read_text()
    lines = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "[Unit]", "Wants=syncd.service", "After=syncd.service", "[Service]",
        "ExecStartPre=+/usr/bin/syncd status --config /etc/syncd/syncd.toml --ready --wait 300 "
        "-- %i",
        "TimeoutStartSec=360",
    ]
    build = (TOP / "packaging" / "build-deb").read_text()
    assert "systemd/wait-for-syncd.conf" in build and "docs/*.md" in build
