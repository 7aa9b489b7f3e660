"""Third adversarial round, declaring waits: an approval nobody can ever approve.

``approvers=["alice", "alice"], quorum=2`` passed the definition's check (2 names for a quorum
of 2), but a quorum counts distinct approvers and alice's second approval is refused ("already
approved"): the run waited ``waiting_human`` for ever (only a rejection or a timeout could end
it). Now the definition is refused, naming the duplicate.
"""

from __future__ import annotations

from typing import Any

import pytest

import raysaga
from raysaga import Client, RunOptions, Workflow
from raysaga.errors import WorkflowDefinitionError
from raysaga.state import RunStatus


@pytest.mark.parametrize(("approvers", "quorum"), [(["alice", "alice"], 2), (["alice", "bob", "alice"], 3)])
def test_a_quorum_only_repeated_names_could_reach_is_refused(approvers: list[str], quorum: int) -> None:
    wf = Workflow("stop28_quorum")

    @wf.step()
    def first(input: Any) -> Any:
        return input

    with pytest.raises(WorkflowDefinitionError, match="named more than once: alice"):
        @wf.approval(approvers=approvers, quorum=quorum)
        def review(first: Any) -> str:
            return "ship it?"


def test_a_quorum_of_distinct_names_still_approves(sqlite_url: str) -> None:
    """A name repeated within a quorum distinct names reach is accepted, and the quorum approves."""
    wf = Workflow("stop28_quorum_ok")

    @wf.step()
    def first(input: Any) -> Any:
        return input

    @wf.approval(approvers=["alice", "bob", "alice"], quorum=2)
    def review(first: Any) -> str:
        return "ship it?"

    @wf.step()
    def ship(review: raysaga.Approval) -> list[str]:
        return sorted(review.by)

    run = raysaga.run(wf, 1, store=sqlite_url, executor="inline", options=RunOptions(release_after=0))
    assert run.status == RunStatus.WAITING_HUMAN
    with Client(sqlite_url) as client:
        client.approve(run.run_id, "review", by="alice")
        client.approve(run.run_id, "review", by="bob")
    done = raysaga.resume(wf, run.run_id, store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"ship": ["alice", "bob"]}
