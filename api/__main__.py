"""``python -m raysaga`` is the ``raysaga`` command."""

from raysaga.orchestrator.cli import main

main()
