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


napping = Workflow("napping43", version="1")


@napping.step()
def first() -> int:
    return 1


napping.sleep("nap", seconds=3600, after=["first"])


@napping.step(after=["nap"])
def last() -> int:
    return 2


def test_a_wait_cut_short_by_the_deadline_keeps_when_it_started(tmp_path: Path) -> None:
    """A sleep (or approval) stopped by the run's deadline or a failure was written ``cancelled``
    without its start: the "started" column went blank for a node that had waited 0.3 s."""
    db = f"sqlite:///{tmp_path / 'n.db'}"
    record = raysaga.run(napping, None, store=db, run_id="n", executor="inline",
                         options=raysaga.RunOptions(deadline=0.3))
    assert (record.status, record.status_reason) == (RunStatus.FAILED, "deadline")
    code, out, err = invoke("status", "n", "--db", db, "--json")
    assert code == 0, err
    nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
    nap = nodes["nap"]
    assert nap["status"] == "cancelled" and nap["started_at"] is not None, nap
    # it started when it began to wait (after `first`), and waited until the deadline stopped it
    # (not a fixed 0.25 s: on a loaded machine `first` took part of the run's 0.3 s)
    assert nodes["first"]["finished_at"] <= nap["started_at"] < nap["finished_at"], nodes
    assert record.deadline_at is not None and nap["finished_at"] >= record.deadline_at - 0.01, (nap, record.deadline_at)


def test_a_deadline_is_shown_for_a_run_it_may_still_stop_or_that_it_stopped(tmp_path: Path) -> None:
    """The second review: a run that completed in time said "deadline at … : passed" once that time
    went by, and one that failed for a bug seconds before it read as stopped by its deadline."""
    from raysaga.orchestrator.status_text import run_times

    db = f"sqlite:///{tmp_path / 'd.db'}"
    done = raysaga.run(napping, None, store=db, run_id="d", executor="inline",
                       options=raysaga.RunOptions(deadline=0.3))
    assert done.deadline_at is not None
    later = done.deadline_at + 5
    assert [line for line in run_times(done, later) if "deadline" in line] != []  # it stopped this one
    for status, reason in ((RunStatus.COMPLETED, None), (RunStatus.FAILED, "critical step 'x' failed: boom")):
        ended = done.model_copy(update={"status": status, "status_reason": reason})
        assert [line for line in run_times(ended, later) if "deadline" in line] == [], status
    live = done.model_copy(update={"status": RunStatus.WAITING_TIMER, "status_reason": None})
    assert any("deadline" in line and "passed" in line for line in run_times(live, later))
