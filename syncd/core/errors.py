"""One root for every error syncd raises on purpose (ConfigError, FrameError, SecretError,
StartupError, ControlError, ... all derive from it), like aiomqtt's MqttError or h11's
ProtocolError: callers that only want "syncd said no" catch SyncdError; the subclasses name
the expected conditions, so that none of them hides behind a built-in (a file that shrank
under us is not an EOFError).
"""

from __future__ import annotations


class SyncdError(Exception):
    """Base of every expected error in syncd."""


class FileShrank(SyncdError):
    """A file held fewer bytes than we needed to read: it shrank (or was replaced) under us."""


class FileReplaced(SyncdError):
    """The path now names another file (another inode) than the one our ledger describes."""


class ConcurrentWrite(SyncdError):
    """The file changed size under us while appending: someone else writes to it."""


class FrameError(SyncdError, ValueError):
    """A topic or payload that is not a valid syncd frame (frames.py, topics.py, items.py)."""
