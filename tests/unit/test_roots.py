"""Runtimes roots and the key <-> path rule (syncd/core/roots.py), as the config builds them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from syncd.config import Config, ConfigError, load_config, parse_config
from syncd.core.roots import KeyPathError, Layout, Place, Root

HEAD = 'node = "host-a"\nstate_dir = "state"\nsecret_file = "cluster.key"\n'


def config(tmp_path: Path, text: str) -> Config:
    p = tmp_path / "syncd.toml"
    p.write_text(HEAD + text)
    return load_config(p)


def test_one_root_keeps_todays_keys(tmp_path: Path) -> None:
    c = config(tmp_path, 'runtimes_dir = "/srv/rt"\n')
    assert not c.roots.prefixed
    assert c.key_dir("bot-1") == Path("/srv/rt/bot-1")
    assert c.key_dir("onebot_123/group_456") == Path("/srv/rt/onebot_123/group_456")
    assert c.key_dir("a/b/c/d") == Path("/srv/rt/a/b/c/d")  # MAX_DEPTH levels
    with pytest.raises(KeyPathError, match="5 levels below its root"):
        c.key_dir("a/b/c/d/e")
    with pytest.raises(KeyPathError, match=re.escape("component '..'")):
        c.key_dir("a/../../etc")


def test_a_glob_names_each_root_by_what_its_star_matched(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    (profiles / "alice" / "runtimes").mkdir(parents=True)
    c = config(tmp_path, f'runtimes_dir = "{profiles}/*/runtimes"\n')
    assert c.roots.prefixed
    assert c.key_dir("alice/onebot_123/group_456") == (
        profiles / "alice" / "runtimes" / "onebot_123" / "group_456")
    # A profile this host does not have yet maps the same way (a standby creates it).
    assert c.key_dir("bob/main") == profiles / "bob" / "runtimes" / "main"
    assert c.key_dir("alice/a/b/c/d") == profiles / "alice" / "runtimes" / "a/b/c/d"
    with pytest.raises(KeyPathError, match="names a root, not an instance"):
        c.key_dir("alice")
    with pytest.raises(KeyPathError, match=re.escape("no runtimes root is named '.hidden'")):
        c.key_dir(".hidden/main")  # a glob does not match hidden directories
    assert c.roots.watch_dirs() == [profiles]


def test_a_glob_with_a_prefix_in_its_component(tmp_path: Path) -> None:
    c = config(tmp_path, 'runtimes_dir = "/srv/profile-*/runtimes"\n')
    assert c.key_dir("alice/main") == Path("/srv/profile-alice/runtimes/main")
    [spec] = c.roots.globs()
    assert spec.match("profile-alice") == "alice"
    assert spec.match("profile-") is None and spec.match("other") is None


def test_named_roots_and_lists(tmp_path: Path) -> None:
    c = config(tmp_path, 'runtimes_dir = ["/srv/a/*/runtimes", "/srv/bots"]\n'
                         '[roots]\n"cross 大厅" = "/opt/cross"\n')
    assert c.key_dir("bots/x") == Path("/srv/bots/x")  # a plain path in a list: its own name
    assert c.key_dir("cross 大厅/main") == Path("/opt/cross/main")
    assert c.key_dir("alice/main") == Path("/srv/a/alice/runtimes/main")
    assert c.roots.describe() == "/srv/a/*/runtimes, /srv/bots, cross 大厅 = /opt/cross"
    single = config(tmp_path, 'runtimes_dir = ["/srv/rt"]\n')
    assert single.roots.prefixed and single.key_dir("rt/bot-1") == Path("/srv/rt/bot-1")


def test_place_of_watcher_paths() -> None:
    layout = Layout.single(Path("/rt"))
    root = Root(None, Path("/rt"))
    assert layout.place(Path("/rt/onebot_123/group_456/events.jsonl")) == Place(
        root, ("onebot_123", "group_456", "events.jsonl"))
    assert layout.place(Path("/elsewhere/x")) is None
    c = load_config_text('runtimes_dir = "/p/*/runtimes"\n')
    alice = Root("alice", Path("/p/alice/runtimes"))
    assert c.roots.place(Path("/p/alice/runtimes/main/events.jsonl")) == Place(
        alice, ("main", "events.jsonl"))
    assert c.roots.place(Path("/p/alice")) == Place(None)  # on the way to a root
    assert c.roots.place(Path("/p/alice/runtimes")) == Place(None)
    assert c.roots.place(Path("/p/alice/cache/x")) is None  # beside the root: not ours
    assert c.roots.key_of(alice, ("main",)) == "alice/main"


def load_config_text(text: str) -> Config:
    return parse_config(tomllib.loads(HEAD + text), Path("/etc/syncd/syncd.toml"), HEAD + text)


@pytest.mark.parametrize(("text", "message"), [
    ('runtimes_dir = "/p/*/x/*"\n',
     "syncd.toml:4: runtimes_dir: '/p/*/x/*': a glob may hold one '*' only"),
    ("runtimes_dir = 3\n", "syncd.toml:4: runtimes_dir: must be a path, a glob"),
    ("runtimes_dir = []\n", "syncd.toml:4: runtimes_dir: must be a path, a glob"),
    ('runtimes_dir = ["/a/rt", "/b/rt"]\n',
     "syncd.toml:4: runtimes_dir: two roots are named 'rt': keys would collide"),
    ('runtimes_dir = "/a/rt"\n[roots]\nx = "/p/*/rt"\n',
     "syncd.toml:6: roots.x: a [roots] entry is one directory"),
    ('[roots]\n".." = "/p"\n', "syncd.toml:5: roots...: '..' cannot name a root"),
    ("", "syncd.toml: runtimes_dir: is required (or name the roots in a [roots] table)"),
    ('runtimes_dir = "/rt"\n[keys."a/../b"]\nrole = "source"\n',
     "syncd.toml:5: keys: 'a/../b' is not a valid instance key: component '..'"),
    ('runtimes_dir = "/rt"\n[keys."a/b/c/d/e"]\nrole = "source"\n',
     "syncd.toml:5: keys: 'a/b/c/d/e' is not a valid instance key: 5 levels below its root "
     "(at most 4)"),
    ('runtimes_dir = "/p/*/rt"\n[keys.main]\nrole = "source"\n',
     "syncd.toml:5: keys: 'main' is not a valid instance key: names a root, not an "
     "instance"),
])
def test_root_and_key_errors_name_the_key_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(tmp_path, text)


def test_nested_keys_in_keys_tables_and_globs(tmp_path: Path) -> None:
    c = config(tmp_path, 'runtimes_dir = "/rt"\ninclude = ["onebot_123/*", "main"]\n'
                         'exclude = ["*/group_9*"]\n'
                         '[keys."matrix_@bot_example.org_!room_example.org/x+y#z"]\n'
                         'role = "source"\n')
    assert c.wants_key("onebot_123/group_456")
    assert c.wants_key("onebot_123/deep/er")  # `*` matches "/" too
    assert not c.wants_key("onebot_123/group_901")
    assert c.wants_key("main") and not c.wants_key("other/main")
    assert c.wants_key("matrix_@bot_example.org_!room_example.org/x+y#z")
    assert c.role_of("matrix_@bot_example.org_!room_example.org/x+y#z") == "source"
