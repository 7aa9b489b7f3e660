"""A run's end lets go of its lease in the write that ends it (the release was a transaction of its
own after it: a completed run held a lease for that long, and it cost an fsync a run). A rest for
a human lets go of it in the write that rests the run, the same way. And its start:
``raysaga.run`` creates the run claimed and running in one transaction (``create_claimed``), where
the insert, the claim and the move to ``running`` were three, with the same rows and events.
Checked on a real SQLite file, through a store that records what each transaction carried.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Approval, Ask, RunStatus, Workflow
from raysaga.state import Batch, Lease, NewRun, RunRecord, SqlStore

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
        self.claims: list[str] = []
        self.created: list[str] = []

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        self.batches.append(batch)
        return super().commit(lease, batch)

    def release(self, lease: Lease) -> None:
        self.releases.append(lease)
        super().release(lease)

    def claim(self, run_id: str, owner: str, ttl: float, *, take_from: str | None = None) -> Lease:
        self.claims.append(run_id)
        return super().claim(run_id, owner, ttl, take_from=take_from)

    def create_claimed(self, new: NewRun, owner: str, ttl: float) -> tuple[RunRecord, Lease]:
        self.created.append(new.run_id)
        return super().create_claimed(new, owner, ttl)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Recording]:
    opened = Recording(f"sqlite:///{tmp_path / 'r.db'}")
    yield opened
    opened.close()


@pytest.mark.parametrize("executor", ["inline", "ray"])
def test_the_end_and_the_release_are_one_write(store: Recording, executor: str,
                                                                request: pytest.FixtureRequest) -> None:
    ex: Any = "inline"
    if executor == "ray":
        from raysaga.orchestrator.executor import RayExecutor

        ex = RayExecutor(address=request.getfixturevalue("ray_session"))
    record = raysaga.run(wf, 5, store=store, executor=ex)
    assert record.status == RunStatus.COMPLETED and record.output == {"total": 30}
    last = store.batches[-1]
    assert last.run is not None and last.run.status == RunStatus.COMPLETED and last.run.release_lease
    if executor == "inline":  # the last step's outcome is committed before the end (it ran at submit)
        assert [(n.node_id, n.status.value) for n in store.batches[-2].nodes] == [("total", "completed")]
    else:  # on Ray it shares the end's write since stop 33 (Driver._loop; test_end_commit_stop33)
        assert [(n.node_id, n.status.value) for n in last.nodes] == [("total", "completed")]
        assert not any(n.node_id == "total" for b in store.batches[:-1] for n in b.nodes)
    assert store.releases == []  # no transaction of its own after the end
    assert record.lease_owner is None
    kept = store.get_run(record.run_id)
    assert kept.lease_owner is None and kept.lease_expires_at is None and kept.status == RunStatus.COMPLETED
    assert [e.kind for e in store.events(record.run_id)][-2:] == ["node_completed", "run_completed"]
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


def test_a_new_run_starts_claimed_and_running_in_one_write(store: Recording) -> None:
    record = raysaga.run(wf, 3, store=store, executor="inline")
    assert record.status == RunStatus.COMPLETED
    assert store.created == [record.run_id] and store.claims == []  # no claim of its own
    assert not any(b.run is not None and b.run.status == RunStatus.RUNNING for b in store.batches)
    log = [(e.seq, e.kind, e.data) for e in store.events(record.run_id)]
    owner = log[1][2]["owner"]
    assert log[:3] == [(1, "run_created", {"workflow": wf.name}), (2, "lease_claimed", {"owner": owner, "fence": 1}),
                       (3, "run_running", {"reason": None})]  # what the three transactions wrote
    # a run created for later (submit, create_run) is pending and unclaimed, as before
    later = raysaga.create_run(wf, 3, store=store)
    assert later.status == RunStatus.PENDING and later.lease_owner is None and later.fence == 0
    done = raysaga.resume(wf, later.run_id, store=store, executor="inline")
    assert done.status == RunStatus.COMPLETED and store.claims == [later.run_id]
    kinds = [(e.seq, e.kind) for e in store.events(later.run_id)][:3]
    assert kinds == [(1, "run_created"), (2, "lease_claimed"), (3, "run_running")]


def test_a_run_id_taken_meanwhile_takes_the_resume_path(store: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two drivers started together with one run id: the one whose insert loses claims the run
    as a resume does (here the other creates it between this one's look-up and its insert)."""
    create_claimed = store.create_claimed

    def raced(new: NewRun, owner: str, ttl: float) -> tuple[RunRecord, Lease]:
        raysaga.create_run(wf, 2, store=store, run_id=new.run_id)  # the other one's insert, first
        return create_claimed(new, owner, ttl)

    monkeypatch.setattr(store, "create_claimed", raced)
    record = raysaga.run(wf, 2, store=store, executor="inline", run_id="taken-1")
    assert record.run_id == "taken-1" and record.status == RunStatus.COMPLETED and record.output == {"total": 1}
    assert store.created == ["taken-1"] and store.claims == ["taken-1"]  # refused, then claimed as a resume
