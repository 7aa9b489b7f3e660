"""Third adversarial round, ``prune`` against big runs: the write lock a batch holds.

A batch was ``batch_size`` runs (500) whatever their size: 500 runs of 10,000-item fan-outs are
5 M node rows deleted in one transaction, the store's write lock held for ~13 s on SQLite (1 M
rows: a concurrent lease claim waited 2.6 s, measured on a 2-core VM), longer than the drivers'
lease renewals can wait. Now a batch stops at ``ROWS_PER_BATCH`` node and event rows (a run is
always deleted whole, at least one a batch), and the prune goes on in the next transaction.
"""

from __future__ import annotations

import importlib
import uuid
from typing import Any

import pytest
from sqlalchemy import select, update

import raysaga
from raysaga import Workflow
from raysaga.state import RunStatus, SqlStore
from raysaga.state.pruning import PruneReport, prune
from raysaga.state.schema import runs

#: the module itself (``raysaga.state.prune`` is the function): its batch cap and its batches
prune_module = importlib.import_module("raysaga.state.pruning")


def _wide(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.step()
    def items(input: int) -> list[int]:
        return list(range(input))

    @wf.step(map_over="items")
    def square(items: int) -> int:
        return items * items

    return wf


def test_a_batch_of_big_runs_is_split_by_rows_and_every_run_goes(store_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wf = _wide(f"stop28_prune_{uuid.uuid4().hex[:6]}")
    ids = [raysaga.run(wf, 40, store=store_url, run_id=f"big{i}-{uuid.uuid4().hex[:6]}", executor="inline").run_id
           for i in range(3)]
    store = SqlStore(store_url)
    try:
        assert all(store.get_run(r).status == RunStatus.COMPLETED for r in ids)
        rows = len(store.nodes(ids[0])) + len(store.events(ids[0]))
        assert rows > 40
        # one of these runs fits, two do not (raising=False: the cap did not exist before this round)
        monkeypatch.setattr(prune_module, "ROWS_PER_BATCH", rows + 5, raising=False)
        with store.engine.begin() as conn:  # aged: only these runs are old enough (the database may be shared)
            conn.execute(update(runs).where(runs.c.run_id.in_(ids)).values(updated_at=1.0))
        deleted: list[set[str]] = []
        one_batch = prune_module._one_batch

        def recorded(conn: Any, report: PruneReport, prunable: Any, batch_size: int) -> bool:
            before = {r.run_id for r in store.list_runs(limit=10_000, workflow=wf.name)}
            more: bool = one_batch(conn, report, prunable, batch_size)
            deleted.append(before - {r for (r,) in conn.execute(select(runs.c.run_id))})
            return more

        monkeypatch.setattr(prune_module, "_one_batch", recorded)
        report = prune(store, 1, statuses=["completed"], now=100.0)
        mine = [d & set(ids) for d in deleted if d & set(ids)]
        assert all(len(d) == 1 for d in mine), f"a batch held more rows than the cap: {mine}"
        assert set().union(*mine) == set(ids) and report.runs == 3
        assert store.list_runs(limit=10_000, workflow=wf.name) == []
    finally:
        store.close()
