"""What ``raysaga approve`` says happens next, when that is not what the run's lease suggests (stop 51).

1. The run's driver was SIGKILLed holding a long lease (an approval with a timeout keeps its
   driver): "the run's live driver takes the decision at its next heartbeat", and no driver came;
   ``status`` meanwhile said the driver is gone. It now says so, and what takes the run over.
2. A decision retried with its ``--decision-id`` on a run that has since completed: "a worker
   takes the run up now, or `raysaga resume RUN`", and the resume said there was nothing to resume.

Real inline runs on a real SQLite file; the killed driver's lease is held by the owner id of a
process that has exited (``worker_procs.dead_owner``: what a SIGKILL leaves, without the wait).
"""

from __future__ import annotations

import uuid

import raysaga
from raysaga import Approval, Workflow
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke
from tests.support.worker_procs import dead_owner


def _flow() -> Workflow:
    wf = Workflow(f"stop51_next_{uuid.uuid4().hex[:6]}")

    @wf.approval(approvers=["alice"])
    def review(input: int) -> str:
        return f"pay {input}?"

    @wf.step()
    def pay(review: Approval) -> str:
        return f"paid by {review.by}"

    del pay
    return wf


def test_approving_a_run_whose_driver_is_gone_says_so(sqlite_url: str) -> None:
    wf = _flow()
    assert raysaga.run(wf, 3, store=sqlite_url, run_id="g", executor="inline").status == RunStatus.WAITING_HUMAN
    store = SqlStore(sqlite_url)
    store.claim("g", dead_owner(), 600)  # its driver died holding a long lease
    store.close()
    code, out, err = invoke("approve", "g", "review", "--by", "alice", "--db", sqlite_url)
    assert code == 0, err
    assert "its driver is gone (" in out and "`raysaga resume g` takes it over at once" in out, out
    assert "live driver" not in out


def test_a_decision_retried_on_a_completed_run_says_it_ended(sqlite_url: str) -> None:
    wf = _flow()
    raysaga.run(wf, 3, store=sqlite_url, run_id="c", executor="inline")
    args = ("approve", "c", "review", "--by", "alice", "--decision-id", "D1", "--db", sqlite_url)
    assert invoke(*args)[0] == 0
    assert raysaga.resume(wf, "c", store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    code, out, err = invoke(*args)  # the same decision again: taken as the one already recorded
    assert code == 0, err
    assert "the run is completed already: nothing more happens" in out, out
    assert "takes the run up now" not in out
