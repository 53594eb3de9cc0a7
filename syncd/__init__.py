"""syncd: hot-standby replication of append-only JSONL memory logs over MQTT."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # `syncd.__version__`, read from the installed metadata when first asked for: importing
    # importlib.metadata costs a CLI call a tenth of a second it mostly does not need.
    if name != "__version__":
        raise AttributeError(f"module 'syncd' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        # pyproject.toml holds the one version number; the installed metadata carries it here.
        found = version("syncd")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
