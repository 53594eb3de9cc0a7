"""A host's own position topics, in the form `[mqtt] hide_names` says (topics.py), no I/O.

The keyed level's secret is HKDF-SHA256 of the identity key's seed (info "syncd topic names
v1"): only this host holds it, it needs no file of its own, and it stays the same across
restarts, so a file's retained position keeps replacing itself under one topic. (A new
identity key gives new levels: the old ones are cleared by hand, docs/operations.md.)
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from syncd.core.topics import keyed_position_topic, position_topic

_INFO = b"syncd topic names v1"


def names_secret(identity_key: Ed25519PrivateKey) -> bytes:
    seed = identity_key.private_bytes(serialization.Encoding.Raw,
                                      serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
    return HKDF(hashes.SHA256(), 32, salt=None, info=_INFO).derive(seed)


class PositionTopics:
    """Where this host publishes each file's retained position; `hide`: under a keyed level.
    Each topic is made once per file (an HMAC and a format), then looked up."""

    def __init__(self, prefix: str, node: str, identity_key: Ed25519PrivateKey,
                 hide: bool) -> None:
        self.prefix = prefix
        self.node = node
        self.hide = hide
        self._secret = names_secret(identity_key)
        self._made: dict[tuple[str, str], str] = {}

    def of(self, key: str, file: str) -> str:
        topic = self._made.get((key, file))
        if topic is None:
            topic = self._made[(key, file)] = self._form(key, file, self.hide)
        return topic

    def drop(self, key: str, file: str) -> None:
        self._made.pop((key, file), None)

    def _form(self, key: str, file: str, hide: bool) -> str:
        if hide:
            return keyed_position_topic(self.prefix, self.node, self._secret, key, file)
        return position_topic(self.prefix, self.node, key, file)
