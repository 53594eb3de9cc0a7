"""The instance keys a host replicates, and whether a peer may add one.

Locally, an instance is a directory holding a configured file, and nothing below it is looked
at (discovery.py): two instances are never nested. A peer's word must not change that. A key
inside another instance (`bot-1/workspace`, `bot-1/resources/artifacts/x`) would put files
into that instance's tree that its `writers` never allowed, and be counted in its manifest; a
key above one (`onebot_1` over `onebot_1/group_2`) would make that instance's directory part
of another's. So a peer's new key is refused when it is inside or above a known key, or when
the host already holds `max_keys` keys (its own count too: they are never refused).

Pure bookkeeping: the node adds every key it replicates and asks before it creates one on a
peer's word; what is on disk but not known yet (an instance's directory made a moment ago) is
the node's own check (daemon/instances.py, `_new_key_refusal`).
"""

from __future__ import annotations

from collections import Counter

from syncd.core.names import printable


def ancestors(key: str) -> list[str]:
    """`a/b/c` -> [`a`, `a/b`]: the keys a key would be inside of."""
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class KeySpace:
    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._below: Counter[str] = Counter()  # key prefix -> known keys strictly below it

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        if key in self._keys:
            return
        self._keys.add(key)
        for up in ancestors(key):
            self._below[up] += 1

    def discard(self, key: str) -> None:
        if key not in self._keys:
            return
        self._keys.remove(key)
        for up in ancestors(key):
            self._below[up] -= 1
            if not self._below[up]:
                del self._below[up]

    def nesting(self, key: str) -> str | None:
        """Why `key` cannot be an instance beside the known ones (None: it can)."""
        for up in ancestors(key):
            if up in self._keys:
                return f"inside the instance {printable(up)}"
        below = self._below.get(key, 0)
        if below:
            return f"above {below} instance{'s' if below > 1 else ''} (a directory of keys " \
                   f"{printable(key)}/...)"
        return None

    def refusal(self, key: str, max_keys: int) -> tuple[str, str] | None:
        """(reason label, why in words) a peer may not add `key`; None: it may."""
        if key in self._keys:
            return None
        nested = self.nesting(key)
        if nested is not None:
            return "nested", nested
        if len(self._keys) >= max_keys:
            return "keys", f"this host holds {len(self._keys)} keys, over [limits] max_keys " \
                           f"({max_keys})"
        return None
