"""With ``--executor inline``, each answered model turn of a mapped agent is durable before the
next agent's call runs (stop 51, a review).

The inline executor ran a round's attempts all at submit and committed them together: four
researchers' first turns were answered one after another, none committed, and a SIGKILL then
lost every answer: the resume asked the model (and billed) those turns again, against invariant
3. An agent's call now runs at a wait of its own, and its answer is committed before the next.

The offline research example (a scripted model: the edge this is not about) on a real SQLite
file, killed by the engine's own fault point (a real SIGKILL of the driver process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from raysaga.state import NodeStatus, SqlStore
from tests.support.services import FakeServices

REPO = Path(__file__).resolve().parents[2]


def test_the_turns_answered_before_a_kill_are_durable(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'crash.db'}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAYSAGA_FAULTS", "RAYSAGA_DB", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    with FakeServices() as services:
        killed = subprocess.run(
            [sys.executable, "-m", "examples.agents_research.workflow", "--executor", "inline", "--db", db,
             "--services-url", services.url, "--run-id", "turns51"], cwd=REPO, capture_output=True, text=True,
            timeout=120, env={**env, "RAYSAGA_FAULTS": "before_commit:research@0[2]"})  # researcher 2's answer
    assert killed.returncode == -9, killed.stdout + killed.stderr
    store = SqlStore(db)
    try:
        first_turns = {n.fan_index: n.status for n in store.nodes("turns51") if n.node_id == "research@0"}
    finally:
        store.close()
    assert first_turns == {0: NodeStatus.COMPLETED, 1: NodeStatus.COMPLETED}, first_turns
