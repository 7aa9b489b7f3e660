"""A run that rests (a long sleep, an approval without a timeout) is woken at its deadline.

Found in review (stop 41): the resting run's ``wake_at`` was the sleep's end (or none, for an
approval), so no worker took it up at its deadline: a 2 s deadline overshot by the whole hour.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.state import RunStatus, open_store


def _sleeper() -> Workflow:
    wf = Workflow("deadline_sleeper")

    @wf.step()
    def first(input: int) -> int:
        return input

    wf.sleep("nap", seconds=3600, after=["first"])

    @wf.step(after=["nap"])
    def last(first: int) -> int:
        return first

    return wf


def _approver() -> Workflow:
    wf = Workflow("deadline_approver")

    @wf.step()
    def first(input: int) -> int:
        return input

    @wf.approval(approvers=["boss"])
    def sign_off(first: int) -> str:
        return "go?"

    return wf


@pytest.mark.parametrize("make, status", [(_sleeper, RunStatus.WAITING_TIMER), (_approver, RunStatus.WAITING_HUMAN)])
def test_a_resting_run_is_due_again_at_its_deadline(tmp_path: Path, make, status) -> None:  # type: ignore[no-untyped-def]
    wf = make()
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    hashes = {wf.name: wf.definition_hash}
    record = raysaga.run(wf, 1, store=store, executor="inline", options=RunOptions(deadline=3, release_after=0.5))
    assert record.status == status  # it rests: its deadline is further off than release_after
    assert record.deadline_at is not None
    assert record.wake_at == pytest.approx(record.deadline_at, abs=0.01)  # not the hour's end, nor never
    early = store.claim_next("early", 10, hashes)
    if early is not None:  # only once the deadline has passed (a slow machine): let it go again
        assert time.time() >= record.deadline_at
        store.release(early.lease)
    while time.time() <= record.deadline_at:  # the subject is the wall clock: wait for the deadline
        time.sleep(0.05)
    claim = store.claim_next("worker", 10, hashes)  # a worker finds it due, as ``raysaga worker`` would
    assert claim is not None and claim.lease.run_id == record.run_id
    store.release(claim.lease)
    ended = raysaga.run(wf, run_id=record.run_id, store=store, executor="inline")
    assert ended.status == RunStatus.FAILED
    assert ended.error is not None and "deadline" in str(ended.error)
