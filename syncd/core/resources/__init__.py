"""An instance's resources/ files as a pure machine: manifests and chunks in, effects out.

The log's rule ("the longer tail wins") does not fit these files: they are not appended to.
Their write patterns (docs/event-logs.md) give two other rules, stated here once, for local
and remote copies alike:

- WRITE-ONCE (blobs: an artifact, an asset's bytes): a name is written once, by a temp file and
  a rename. A host that lacks the name fetches it whole. Two hosts holding different bytes
  under one name are a CONFLICT: neither copy is replaced, both hosts show it (with the offset
  of the first differing byte, found by comparing the peer's bytes with ours chunk by chunk),
  exactly like a divergence of the log. It ends when the copies agree again (an operator moved
  the wrong one away; the other is then fetched).
- REPLACED (sidecars `<name>.json`, `<name>.view`): rewritten whole by its instance's writer.
  Each version carries (stamp, origin): a Lamport count (one more than any version of that
  name this host knew of, and at least the write's mtime in ms) and the host whose local
  write made it. The highest version wins,
  so a writer's newest replacement reaches every host, also after a failover; a version whose
  origin is not among the key's `writers` (when set) never counts.
- Anything else (temp files, names outside include) does not travel; see Rules.

Theory of operation: each host keeps a manifest (name -> ResEntry: size, SHA-256, version) of
the complete files it holds, and what it heard of each peer's. A summary (digest of the whole
manifest) goes to everyone on change, on (re)connect, when a peer comes online and every
SUM_INTERVAL; a peer whose summary is not one we were answered for is asked for its whole
manifest. Entries that changed go to everyone at once. Per name the machine then decides: fetch
(a window of chunks at a time, resumed from the last byte received after a timeout, from any
online peer holding the same digest), adopt a higher version number for identical bytes,
compare (a conflict), or nothing. The shell writes fetched bytes to a temp file and installs
it whole: a write-once name without overwriting anything, a replaced one only over the version
this machine last saw. Deletions are not propagated: a file deleted here is fetched back from a
peer that still holds it (nothing is lost by syncd; the writer never deletes today).

No files, sockets or clocks here: the shell (daemon/resourcefiles.py) and the simulator feed events
with the time and carry out the effects.

The package, by job: rules.py (which files travel, by which rule), messages.py (the events in
and the effects out), manifest.py (entries' costs, the manifest digest, our view of each
peer's manifest within its bounds) and machine.py (ResourceMachine: the decisions). Every
public name is importable from `syncd.core.resources`.
"""

from syncd.core.resources.machine import (
    BACKOFF,
    BIG_TRANSFERS,
    MAX_OFFSETS,
    MAX_TRANSFERS,
    PRESENCE_PASS,
    REFUSED_SHOWN,
    SUM_INTERVAL,
    ConflictView,
    ResourceMachine,
    Transfer,
)
from syncd.core.resources.manifest import (
    ENTRIES_PER_ITEM,
    ENTRY_COST,
    ENTRY_WIRE,
    PeerBounds,
    PeerManifest,
    entry_cost,
    manifest_digest,
)
from syncd.core.resources.messages import (
    Compare,
    Compared,
    Conflict,
    Connected,
    Discard,
    Effect,
    Event,
    Install,
    Installed,
    InstallFailed,
    LocalFile,
    LocalGone,
    PeerItem,
    PeerPresence,
    Refused,
    Save,
    Send,
    Serve,
    ServeFailed,
    Tick,
    Write,
)
from syncd.core.resources.rules import (
    CACHED_NAME,
    DEFAULT_EXCLUDE,
    DEFAULT_INCLUDE,
    DEFAULT_REPLACED,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    TEMP_PATTERNS,
    FileKind,
    Rules,
    version,
)

__all__ = [
    "BACKOFF", "BIG_TRANSFERS", "CACHED_NAME", "DEFAULT_EXCLUDE", "DEFAULT_INCLUDE",
    "DEFAULT_REPLACED", "ENTRIES_PER_ITEM", "ENTRY_COST", "ENTRY_WIRE", "MAX_DEPTH",
    "MAX_FILE_BYTES", "MAX_OFFSETS", "MAX_TRANSFERS", "PRESENCE_PASS", "REFUSED_SHOWN",
    "SUM_INTERVAL", "TEMP_PATTERNS", "Compare", "Compared", "Conflict", "ConflictView",
    "Connected", "Discard", "Effect", "Event", "FileKind", "Install", "InstallFailed",
    "Installed", "LocalFile", "LocalGone", "PeerBounds", "PeerItem", "PeerManifest",
    "PeerPresence", "Refused", "ResourceMachine", "Rules", "Save", "Send", "Serve",
    "ServeFailed", "Tick", "Transfer", "Write", "entry_cost", "manifest_digest", "version",
]
