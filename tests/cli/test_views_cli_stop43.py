"""Stop 43, what ``raysaga status`` says of a node that failed: its duration was recorded only for
completed nodes, so a step that ran 0.2 s before it failed showed an empty "took" column (and
``duration: null`` in ``--json``) next to the time it started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import raysaga
from raysaga import RetryPolicy, Workflow
from raysaga.state import RunStatus
from tests.support.cli import invoke

failing = Workflow("failing43", version="1")

#: How long the step works before it fails (its workload, not a synchronisation).
WORK_S = 0.05


class FlakyError(Exception):
    """Transient by the step's policy: the first attempt is retried, the second fails for good."""


@failing.step(retry=RetryPolicy(max_attempts=2, base=0.001, cap=0.001, transient=(FlakyError,)))
def boom() -> int:
    time.sleep(WORK_S)
    raise FlakyError("the service said no")


def test_a_failed_node_shows_how_long_its_last_attempt_took(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    assert raysaga.run(failing, None, store=db, run_id="f", executor="inline").status == RunStatus.FAILED
    code, out, err = invoke("status", "f", "--db", db, "--json")
    assert code == 0, err
    node = {n["node"]: n for n in json.loads(out)["nodes"]}["boom"]
    assert node["status"] == "failed" and node["attempts"] == 2
    assert node["duration"] is not None and node["duration"] >= WORK_S * 0.9, node
    assert abs(node["started_at"] + node["duration"] - node["finished_at"]) < 1e-3, node
    code, out, err = invoke("status", "f", "--db", db)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("boom"))
    assert "ms" in row.split("failed", 1)[1], row  # the "took" column is filled
