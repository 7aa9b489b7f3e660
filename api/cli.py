"""Entry point of the ``raysaga`` console script (the CLI lives in ``raysaga.orchestrator.cli``)."""

from raysaga.orchestrator.cli import app, main

__all__ = ["app", "main"]
