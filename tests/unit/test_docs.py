"""The documentation: links that resolve, paths that exist, and nothing the old README said lost.

README.md and docs/*.md are read as they are in the tree, so a page another change adds is
checked as soon as it is there. The names the README documented before the docs moved to
docs/ (commit b20ff7e: every command, option, config key, JSON field, metric and other
identifier in its code) are a fixture, tests/fixtures/docs/readme_b20ff7e_names.txt, made by

    python -m tests.unit.test_docs --extract

which reads that README from git; `test_the_fixture_is_what_the_old_readme_names` checks that
the fixture is still exactly that (where git and the commit are at hand).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from syncd import config
from syncd.ops import metrics

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIXTURE = ROOT / "tests" / "fixtures" / "docs" / "readme_b20ff7e_names.txt"
OLD_README_COMMIT = "b20ff7e"
README_MAX_WORDS = 1500

# Names the layout commit (2a82301) changed: the old name is documented under the new one.
RENAMED = {"python -m tests.chaos": "python -m tests.support.chaos"}
COMMANDS = ("adopt", "check-config", "demo", "forget", "inspect", "keygen", "reload", "run",
            "status", "verify")
# Paths the docs name that must exist: these top-level folders, with a file extension (or
# under packaging/, whose scripts have none); `file.py::test_name` must define that test.
_PATH = re.compile(r"(?<![\w/.~-])((?:syncd|tests|bench|config|monitoring|systemd|packaging)"
                   r"/[A-Za-z0-9_./-]*[A-Za-z0-9_])(::[A-Za-z_]\w*)?")
_EXTENSIONS = {".py", ".md", ".conf", ".toml", ".yml", ".json", ".acl", ".lock", ".txt"}


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


# --- markdown, just as much as these pages use -----------------------------------------------

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")


def code_of(text: str) -> list[str]:
    """The code in a page: every fenced block and every code span outside them."""
    blocks = _FENCE.findall(text)
    return blocks + _SPAN.findall(_FENCE.sub("", text))


def prose_of(text: str) -> str:
    """The page without its code (each span kept as a placeholder, so `[`x`](y)` stays a link)."""
    return _SPAN.sub("x", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for line in _FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def links(text: str) -> Iterator[str]:
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", prose_of(text)):
        yield m.group(1)


def tokens(name: str, code: Iterable[str]) -> bool:
    """Whether `name` occurs in the code as a whole token (not inside a longer name)."""
    pattern = re.compile(r"(?<![A-Za-z0-9_-])" + re.escape(name) + r"(?![A-Za-z0-9_-])")
    return any(pattern.search(c) for c in code)


def config_keys(text: str) -> set[tuple[str, str]]:
    """(section, key) of each row of the first table whose header starts with `| key |`:
    `[mqtt] host`, `port` -> (mqtt, host), (mqtt, port); `node` -> ("", node); a table
    named alone (`[peers]`) -> (peers, "")."""
    out: set[tuple[str, str]] = set()
    lines = iter(text.splitlines())
    for line in lines:
        if re.match(r"\|\s*key\s*\|", line):
            break
    next(lines, None)  # the |---| line
    for line in lines:
        if not line.startswith("|"):
            break
        section = ""
        for span in _SPAN.findall(line.split("|")[1]):
            m = re.fullmatch(r"\[([^\]]+)\](?:\s+(.+))?", span)
            if m:
                section = m.group(1)
                out.add((section, m.group(2) or ""))
            else:
                out.add((section, span))
    return out


# --- the names of the old README -------------------------------------------------------------

def _expand(metric: str) -> list[str]:
    """syncd_{shipped,applied}_{bytes,frames}_total{key,file} -> the plain names."""
    metric = re.sub(r"\{[^{}]*\}$", "", metric)  # the labels
    parts = re.split(r"(\{[^{}]*\})", metric)
    options = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(choice) for choice in itertools.product(*options)]


def extract(text: str) -> list[tuple[str, str]]:
    """(category, name) of every name a README documents, in a stable order."""
    code = code_of(text)
    joined = "\n".join(code)
    found: dict[tuple[str, str], None] = {}

    def add(category: str, name: str) -> None:
        found.setdefault((category, name), None)

    for cmd in COMMANDS:
        if tokens(f"syncd {cmd}", code):
            add("command", f"syncd {cmd}")
    for m in re.finditer(r"\bpython3? -m [\w.]+", joined):
        add("command", m.group(0))
    for m in re.finditer(r"\bbash ((?:tests|packaging)/[\w./-]+)", joined):
        add("command", f"bash {m.group(1)}")
    for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)", joined):
        add("option", m.group(1))
    for section, key in sorted(config_keys(text)):
        add("config", (f"[{section}] {key}" if key else f"[{section}]") if section else key)
    for m in re.finditer(r"\bsyncd_[a-z_]*(?:\{[a-z_,]*\}[a-z_]*)*", joined):
        for name in _expand(m.group(0)):
            if name.rstrip("_") == name:
                add("metric", name)
    for name in ("process_*", "python_info"):
        if name in joined:
            add("metric", name)
    body = _FENCE.sub("", text)
    for paragraph in re.split(r"\n\s*\n|\n(?=- )", body):
        # A heuristic split, for the reader of the fixture: both are checked the same way.
        is_json = re.search(r"\bjson\b", paragraph, re.I) is not None
        is_json = is_json and not paragraph.startswith("|")
        for span in _SPAN.findall(paragraph):
            keyed = re.fullmatch(r"(\w+): \{.*", span)  # `ready_count: {"yes": n, ...}`
            if keyed:
                add("field", keyed.group(1))
            elif re.fullmatch(r"[A-Za-z_]\w*(\[\]\.\w+)?", span):
                known = {n for _, n in found}
                if span not in known and f"syncd {span}" not in known:
                    add("field" if is_json else "name", span)
    return list(found)


def fixture_lines(names: Iterable[tuple[str, str]]) -> list[str]:
    out = []
    for category, name in names:
        new = RENAMED.get(name)
        out.append(f"{category} {name}" + (f" -> {new}" if new else ""))
    return out


def read_fixture() -> list[tuple[str, str, str]]:
    """(category, old name, name to look for)."""
    out = []
    for line in FIXTURE.read_text("utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        category, rest = line.split(" ", 1)
        old, _, new = rest.partition(" -> ")
        out.append((category, old, new or old))
    return out


def old_readme() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_README_COMMIT}:README.md"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


# --- the tests ---------------------------------------------------------------------------------

def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in pages():
        text = page.read_text("utf-8")
        for target in links(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:, file:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: {path} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for page in pages():
        for code in code_of(page.read_text("utf-8")):
            for m in _PATH.finditer(code):
                path, test = m.group(1), m.group(2)
                if Path(path).suffix not in _EXTENSIONS and not path.startswith("packaging/"):
                    continue
                where = f"{page.relative_to(ROOT)}: {m.group(0)}"
                if not (ROOT / path).exists():
                    missing.append(f"{where}: no such file")
                elif test and not re.search(rf"^\s*(async )?def {test[2:]}\(",
                                            (ROOT / path).read_text("utf-8"), re.M):
                    missing.append(f"{where}: no such test")
    assert not missing, "\n".join(missing)


def test_everything_the_old_readme_documented_is_still_documented() -> None:
    code = [c for page in pages() for c in code_of(page.read_text("utf-8"))]
    reference = config_keys((ROOT / "docs" / "configuration.md").read_text("utf-8"))
    lost = []
    for category, old, name in read_fixture():
        if category == "config":
            m = re.fullmatch(r"\[([^\]]+)\] ?(.*)", name)
            key = (m.group(1), m.group(2)) if m else ("", name)
            ok = key in reference
        else:
            ok = tokens(name, code)
        if not ok:
            lost.append(f"{category} {old}" + (f" (now {name})" if name != old else ""))
    assert not lost, ("documented in the README of " + OLD_README_COMMIT
                      + ", now in neither README.md nor docs/:\n" + "\n".join(lost))


def test_the_fixture_is_what_the_old_readme_names() -> None:
    text = old_readme()
    if text is None:
        pytest.skip(f"git or commit {OLD_README_COMMIT} not available (a shallow clone?)")
    lines = [ln for ln in FIXTURE.read_text("utf-8").splitlines() if ln and not ln.startswith("#")]
    assert lines == fixture_lines(extract(text))


def test_every_config_key_is_in_the_reference() -> None:
    reference = config_keys((ROOT / "docs" / "configuration.md").read_text("utf-8"))
    sections = {s for s, _ in reference}
    tables = {"mqtt", "peers", "keys", "metrics", "roots", "limits", "resources", "records",
              "settle"}
    expected = [("", k) for k in config._TOP - tables]
    expected += [("mqtt", k) for k in config._MQTT]
    expected += [("limits", k) for k in config._LIMITS]
    expected += [("resources", k) for k in config._RESOURCES]
    expected += [('keys."<key>"', k) for k in config._KEY - {"resources"}]
    expected += [("metrics", "listen")]
    missing = [f"[{s}] {k}" if s else k for s, k in expected if (s, k) not in reference]
    missing += [f"[{t}]" for t in tables if not any(s.split(".")[0] == t for s in sections)]
    assert not missing, "config keys missing from docs/configuration.md: " + ", ".join(missing)


def test_every_metric_is_documented() -> None:
    status = {"connected": True, "rejected_frames": 0, "peers": {}, "files": []}
    names = sorted({family.name for family in metrics.families(status)})
    table = [c for c in code_of((ROOT / "docs" / "operations.md").read_text("utf-8"))]
    missing = [n for n in names if not (tokens(n, table) or tokens(n + "_total", table))]
    assert names and not missing, "metrics missing from docs/operations.md: " + ", ".join(missing)


def test_the_readme_stays_short() -> None:
    words = len(README.read_text("utf-8").split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words; the details go in docs/"


def test_the_readme_keeps_the_test_command() -> None:
    # .ci/run runs "the test command documented in README.md": a block of its own there.
    assert any(c.strip() == "bash tests/run.sh" for c in _FENCE.findall(README.read_text("utf-8")))


if __name__ == "__main__":
    if sys.argv[1:] != ["--extract"]:
        sys.exit("usage: python -m tests.unit.test_docs --extract")
    old = old_readme()
    if old is None:
        sys.exit(f"cannot read README.md of {OLD_README_COMMIT} from git")
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Every name README.md documented at commit {OLD_README_COMMIT}, before the docs moved\n"
        "# to docs/: <category> <name>[ -> <its name since the layout commit>]. Each must\n"
        "# still be documented (tests/unit/test_docs.py). 'field' is an identifier of a paragraph\n"
        "# about JSON output, 'name' any other identifier in the README's code (states, kinds,\n"
        "# reasons, constants): both must still appear in the code of README.md or docs/.\n"
        "# Regenerate, never edit:\n"
        "#     python -m tests.unit.test_docs --extract\n")
    body = "\n".join(fixture_lines(extract(old))) + "\n"
    FIXTURE.write_text(header + body, encoding="utf-8")
    print(f"wrote {FIXTURE.relative_to(ROOT)}")
