"""The `tandem` command line: one module per command group."""

from tandem.cli.main import main

__all__ = ["main"]
