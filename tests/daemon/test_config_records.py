"""[records] and [settle]: what one record of a file is, and how long its writer's file
must hold still before new records ship (syncd/config.py; docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncd.config import ConfigError, load_config
from tests.daemon.test_config import GOOD, write


def test_record_kinds_by_pattern_with_zstd_frames_by_default(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, GOOD))
    assert c.records_of("k", "session.jsonl.zstd") == "zstd-frames"
    assert c.records_of("k", "events.jsonl") == "lines"
    c = load_config(write(tmp_path, GOOD.replace("[mqtt]", '''[records]
"*.log.zst" = "zstd-frames"
"plain.zstd" = "lines"
[keys."bot-1"]
records = "lines"
settle = 0.2
[mqtt]''')))
    assert c.records_of("k", "a.log.zst") == "zstd-frames"
    assert c.records_of("k", "plain.zstd") == "lines"  # first match, before the default
    assert c.records_of("bot-1", "session.jsonl.zstd") == "lines"  # the key's own
    assert c.settle_of("bot-1", "events.jsonl") == 0.2


def test_settle_defaults_to_dsh_files_only(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, GOOD))
    assert c.settle_of("k", "session.jsonl") == 0.05
    assert c.settle_of("k", "session.jsonl.zstd") == 0.05
    assert c.settle_of("k", "events.jsonl") == 0.0  # Ishiki's writer never rolls back
    c = load_config(write(tmp_path, GOOD.replace("[mqtt]", '[settle]\n"*" = 0.01\n[mqtt]')))
    assert c.settle_of("k", "session.jsonl") == 0.01


@pytest.mark.parametrize(("text", "message"), [
    ('[records]\n"*.x" = "frames"\n', 'records.*.x: must be one of lines, zstd-frames'),
    ('records = "lines"\n', "records: must be a table"),
    ('[keys."bot-1"]\nrecords = "zstd"\n', "keys.bot-1.records: must be one of"),
    ('[settle]\n"*" = 9\n', "settle.*: must be between 0 and 5"),
    ('[keys."bot-1"]\nsettle = -1\n', "keys.bot-1.settle: must be between 0 and 5"),
])
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("*", r"\*")):
        load_config(write(tmp_path, GOOD.replace("[mqtt]", text + "[mqtt]")))
