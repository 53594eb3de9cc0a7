"""syncd: hot-standby replication of append-only JSONL memory logs over MQTT."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml holds the one version number; the installed metadata carries it here.
    __version__ = version("syncd")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
