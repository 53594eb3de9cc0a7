"""The `syncd` command line: one module per command (cli/run.py, cli/status.py, …)."""

from syncd.cli.main import main

__all__ = ["main"]
