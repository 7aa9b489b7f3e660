"""A workflow whose first step waits for a file, for the worker signal tests
(``tests/fleet/test_worker_sigint_stop29.py``; ``raysaga worker -w tests.support.gated_stop29:gated``).
Not a test module.

``gate`` writes ``<dir>/started`` and waits until ``<dir>/go`` exists; ``after`` follows it.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from raysaga import Workflow


class GateIn(BaseModel):
    dir: str


gated = Workflow("stop29_gated", version="1")


@gated.step()
def gate(input: GateIn) -> int:
    folder = Path(input.dir)
    (folder / "started").write_text("yes")
    while not (folder / "go").exists():  # the test opens the gate once it has sent its signals
        time.sleep(0.01)
    return 1


@gated.step()
def after(input: GateIn, gate: int) -> int:
    return gate + 1
