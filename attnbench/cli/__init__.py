"""The ``attnbench`` command. Thin Typer commands over the library; one file per command group."""

from attnbench.cli.app import app, main

__all__ = ["app", "main"]
