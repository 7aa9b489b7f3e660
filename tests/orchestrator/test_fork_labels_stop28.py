"""A fork keeps its parent's labels (``raysaga.fork`` and ``raysaga fork``): the store copies them
with the run row (``state/fork_rows``), so a team that finds its runs by label finds the forks."""

from __future__ import annotations

import uuid

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.state import RunStatus, SqlStore


def _flow() -> Workflow:
    wf = Workflow(f"fork_labels_stop28_{uuid.uuid4().hex[:8]}")

    @wf.step()
    def plan() -> int:
        return 1

    @wf.step()
    def work(plan: int) -> int:
        return plan + 1

    return wf


def test_a_fork_keeps_its_parents_labels(store_url: str) -> None:
    tag = uuid.uuid4().hex[:10]
    wf = _flow()
    parent = raysaga.run(wf, store=store_url, executor="inline", options=RunOptions(labels={"t": tag, "team": "a"}))
    assert parent.status == RunStatus.COMPLETED
    child = raysaga.fork(wf, parent.run_id, from_node="work", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED and child.parent_run_id == parent.run_id
    assert child.labels == {"t": tag, "team": "a"}
    store = SqlStore(store_url)
    try:
        found = sorted(r.run_id for r in store.list_runs(labels={"t": tag}))
    finally:
        store.close()
    assert found == sorted([parent.run_id, child.run_id])
