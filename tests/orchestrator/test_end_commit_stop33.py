"""The last plain step's outcome is committed with the run's end, one transaction (the driver's
``_loop``: a batch the next attempts may overlap, with nothing left in flight or to start, waits
for ``_finish``). A crash before that write re-runs the step, as a crash before its own commit
did; an effect's result keeps its own commit before the end (it is durable before anything else).
Checked on the session's local Ray cluster with the store's commits recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, StepContext, Workflow
from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import Batch, Lease, RunRecord, SqlStore

cloudpickle = pytest.importorskip("ray.cloudpickle")

plain = Workflow("end_commit_plain_stop33")


@plain.step
def first(input: int) -> int:
    return input + 1


@plain.step
def last(first: int) -> int:
    return first * 10


effect = Workflow("end_commit_effect_stop33")


@effect.step
def prepare(input: int) -> int:
    return input


@effect.step(effect=True)
def charge(ctx: StepContext, prepare: int) -> str:
    return f"charged-{prepare}"


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Recording(SqlStore):
    """The store, with each committed batch kept (what the test is about: which writes share one)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[Batch] = []

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        record = super().commit(lease, batch)
        self.batches.append(batch)
        return record


def _drive(wf: Workflow, where: Path, ray_address: str) -> tuple[RunRecord, list[Batch]]:
    store = Recording(f"sqlite:///{where / 'r.db'}")
    try:
        record = raysaga.run(wf, 4, store=store, executor=RayExecutor(address=ray_address))
        return record, store.batches
    finally:
        store.close()


def _completed(batch: Batch) -> set[str]:
    return {w.node_id for w in batch.node_writes() if w.status is not None and w.status.value == "completed"}


def test_the_last_plain_outcome_shares_the_end_commit(tmp_path: Path, ray_session: str) -> None:
    record, batches = _drive(plain, tmp_path, ray_session)
    assert record.status == RunStatus.COMPLETED and record.output == {"last": 50}
    end = batches[-1]
    assert end.run is not None and end.run.status == RunStatus.COMPLETED
    assert "last" in _completed(end), "the last step's outcome had a commit of its own before the end's"
    assert not any("last" in _completed(b) for b in batches[:-1])


def test_an_effects_result_is_durable_before_the_end(tmp_path: Path, ray_session: str) -> None:
    record, batches = _drive(effect, tmp_path, ray_session)
    assert record.status == RunStatus.COMPLETED and record.output == {"charge": "charged-4"}
    end = batches[-1]
    assert end.run is not None and end.run.status == RunStatus.COMPLETED
    holding: list[Any] = [b for b in batches[:-1] if "charge" in _completed(b)]
    assert holding and holding[0].effects, "the effect's result was not committed on its own, before the end"
