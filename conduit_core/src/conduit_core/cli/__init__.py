"""The ``conduit`` command line: one entry point, subcommands grouped by what they act on."""

from conduit_core.cli._main import cli, main

__all__ = ["cli", "main"]
