"""Each peer's newest run as heard here (`state_dir/peer-epochs.json`), kept across restarts.

The replay guard (core/freshness.py) refuses a frame from an earlier run than the newest one
heard of its sender. After a restart this host knows only what the broker retains, and a
client holding a peer's broker login can replace that with the peer's old, authentic frames
(an old position, an old presence): kept here, the newest runs still count. Written durably
(file, then directory), and only when a peer's run changed: a few times a day.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from syncd.disk import durable

log = logging.getLogger("syncd.epochs")

FILE_NAME = "peer-epochs.json"


class PeerEpochs:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self._saved: dict[str, int] = {}

    def load(self) -> dict[str, int]:
        """What was saved; nothing (and a warning) for a file that is not ours."""
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("%s is unreadable (%s): peers' runs are learned again from what they "
                        "send", self.path, e)
            return {}
        if not isinstance(data, dict) or not all(
                isinstance(k, str) and type(v) is int for k, v in data.items()):
            log.warning("%s does not hold peers' runs: ignored", self.path)
            return {}
        self._saved = dict(data)
        return dict(data)

    def save(self, epochs: dict[str, int]) -> None:
        """Write `epochs` durably, if they differ from what was saved last."""
        if epochs == self._saved:
            return
        durable.replace_file(self.path, orjson.dumps(epochs, option=orjson.OPT_SORT_KEYS))
        self._saved = dict(epochs)
