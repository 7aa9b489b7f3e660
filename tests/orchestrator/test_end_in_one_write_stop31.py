"""A run's end is one write: the last step's outcome, the run's terminal state and the release of
its lease commit together (each was a transaction of its own, two fsyncs a run for nothing). A
rest for a human lets go of the lease in the write that rests the run, the same way. Checked on a
real SQLite file, through a store that records what each transaction carried.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Approval, Ask, RunStatus, Workflow
from raysaga.state import Batch, Lease, RunRecord, SqlStore

wf = Workflow("end_in_one_write")


@wf.step
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.map("plan")
def square(plan: int) -> int:
    return plan * plan


@wf.step
def total(square: list[int]) -> int:
    return sum(square)


class Refund(BaseModel):
    amount: int


asks = Workflow("end_in_one_write_ask")


@asks.step
def reserve(input: Refund) -> int:
    return input.amount


@asks.approval(approvers=["alice"])
def review(reserve: int) -> Ask:
    return Ask(prompt=f"Refund {reserve}?")


@asks.step
def pay(reserve: int, review: Approval) -> int:
    return reserve


class Recording(SqlStore):
    """A real SQLite store that remembers each commit's batch and each separate release."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[Batch] = []
        self.releases: list[Lease] = []

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        self.batches.append(batch)
        return super().commit(lease, batch)

    def release(self, lease: Lease) -> None:
        self.releases.append(lease)
        super().release(lease)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Recording]:
    opened = Recording(f"sqlite:///{tmp_path / 'r.db'}")
    yield opened
    opened.close()


@pytest.mark.parametrize("executor", ["inline", "ray"])
def test_the_last_outcome_the_end_and_the_release_are_one_write(store: Recording, executor: str,
                                                                request: pytest.FixtureRequest) -> None:
    ex: Any = "inline"
    if executor == "ray":
        from raysaga.orchestrator.executor import RayExecutor

        ex = RayExecutor(address=request.getfixturevalue("ray_session"))
    record = raysaga.run(wf, 5, store=store, executor=ex)
    assert record.status == RunStatus.COMPLETED and record.output == {"total": 30}
    last = store.batches[-1]
    assert last.run is not None and last.run.status == RunStatus.COMPLETED and last.run.release_lease
    assert [(n.node_id, n.status.value) for n in last.nodes] == [("total", "completed")]
    assert store.releases == []  # no transaction of its own after the end
    assert record.lease_owner is None
    kept = store.get_run(record.run_id)
    assert kept.lease_owner is None and kept.lease_expires_at is None and kept.status == RunStatus.COMPLETED
    kinds = [e.kind for e in store.events(record.run_id)]
    assert kinds[-2:] == ["node_completed", "run_completed"]  # in this order, in one transaction
    assert not any(b.run is not None and b.run.release_lease for b in store.batches[:-1])


def test_a_rest_for_a_human_lets_go_in_the_write_that_rests(store: Recording) -> None:
    rested = raysaga.run(asks, {"amount": 7}, store=store, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    last = store.batches[-1]
    assert last.run is not None and last.run.status == RunStatus.WAITING_HUMAN and last.run.release_lease
    assert store.releases == []
    assert store.get_run(rested.run_id).lease_owner is None
    # and whoever comes next can claim it: the decision completes the run
    raysaga.Client(store).approve(rested.run_id, "review", by="alice")
    done = raysaga.resume(asks, rested.run_id, store=store, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"pay": 7}
    assert store.releases == [] and store.get_run(done.run_id).lease_owner is None


def test_a_stop_short_of_the_end_still_releases_on_its_own(store: Recording) -> None:
    """Anything but an end or a rest hands the run back as before: a failure releases after."""
    failing = Workflow("end_in_one_write_fails")

    @failing.step(retry=raysaga.RetryPolicy(max_attempts=1))
    def boom(input: int) -> int:
        raise ValueError("no")

    record = raysaga.run(failing, 1, store=store, executor="inline")
    assert record.status == RunStatus.FAILED
    assert store.get_run(record.run_id).lease_owner is None
