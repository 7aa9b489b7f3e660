"""Workflows the fleet-registry tests register (``raysaga worker -w tests.support.fleet_view_flows:NAME``).

Not a test module. ``alpha`` and ``beta`` are two workflows of one step each; ``alpha_v2`` is
another definition of ``alpha`` (version 2, another step), so a run of one is not the other's.
``gate``'s step blocks until the file its input names exists: the test's hand on a worker's slot.
"""

from __future__ import annotations

import time
from pathlib import Path

from raysaga import Workflow

#: Longest ``gate`` waits for its file (never reached when the test works).
GATE_LIMIT = 120.0

alpha = Workflow("view_alpha")


@alpha.step
def double(input: int) -> int:
    return input * 2


beta = Workflow("view_beta")


@beta.step
def triple(input: int) -> int:
    return input * 3


alpha_v2 = Workflow("view_alpha", version="2")


@alpha_v2.step
def quadruple(input: int) -> int:
    return input * 4


gate = Workflow("view_gate")


@gate.step
def hold(input: str) -> str:
    deadline = time.monotonic() + GATE_LIMIT
    while not Path(input).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return input
