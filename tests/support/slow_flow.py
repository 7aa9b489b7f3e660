"""A workflow whose one step waits for the test's go-ahead (``raysaga run tests.support.slow_flow:wf``).

``hold`` writes ``<dir>/started``, then waits until ``<dir>/go`` exists (polling the file: the
test's hand on a running step; bounded, so a broken test cannot hang a process forever), then
returns; ``after`` depends on it. Used to make a store fail under a driver at a known moment.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from raysaga import Permanent, Workflow


class HoldIn(BaseModel):
    dir: str


wf = Workflow("slow_flow", version="1")


@wf.step()
def hold(input: HoldIn) -> str:
    folder = Path(input.dir)
    (folder / "started").touch()
    deadline = time.monotonic() + 120
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise Permanent("the test never said go")
        time.sleep(0.02)  # polling the test's file
    return "held"


@wf.step()
def after(hold: str) -> str:
    return hold + " then after"
