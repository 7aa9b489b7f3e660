"""Prune counts each item of a run once, as the view shows it: an item a chunk holds and a row
written after the chunk (which the view shows instead of the chunk's entry) is one node in its
report (dry run and prune) and in its cap of rows per transaction, not two; on SQLite and
PostgreSQL."""

from __future__ import annotations

import importlib
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, select, text, update

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore
from raysaga.state.schema import runs

#: the module that defines ``raysaga.state.prune``
prune_module = importlib.import_module("raysaga.state.pruning")
T0 = 1_795_697_407.042_308_6


def _run(store: SqlStore, items: range, over: list[int]) -> str:
    """A run of chunked items of 'item' (``items``), then rows written over the entries ``over``
    (a failed attempt written by the driver after the chunk, and one by hand)."""
    run_id = "prune-" + uuid.uuid4().hex[:8]
    store.create_run(NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="p" * 64,
                            trace_id=uuid.uuid4().hex))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=[("item", i, 1, str(i), None, T0 + i, T0 + i + 0.5) for i in items]))
    if over:
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="item", fan_index=i, status=NodeStatus.FAILED, attempt=2,
                                                   error={"message": "no"}, started_at=T0) for i in over[1:]]))
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt) "
                              "SELECT run_key, 'item', :i, 'cancelled', 9 FROM raysaga_runs WHERE run_id = :r"),
                         {"i": over[0], "r": run_id})
    return run_id


def test_an_item_with_a_row_over_its_chunk_entry_is_counted_once(store: SqlStore,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shadowed = _run(store, range(200), [0, 5, 127, 128, 199])  # both chunks (0-127, 128-199), their edges
    plain = _run(store, range(30), [])
    shown = {r: len(store.nodes(r)) for r in (shadowed, plain)}
    assert shown == {shadowed: 200, plain: 30}
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id.in_(list(shown))).values(status="completed", updated_at=1.0))
    # the cap: the shadowed run (200 items, 200 + its events) goes alone when the cap is just above it
    with store.reader.connect() as conn:
        keys = list(conn.execute(select(runs.c.run_id, runs.c.run_key).where(runs.c.run_id.in_(list(shown)))).all())
        sizes = prune_module._sizes(conn, keys)
        events = {str(r): int(n) for r, n in conn.execute(text("SELECT run_id, count(*) FROM raysaga_events "
                                                               "GROUP BY run_id")).all()}
    assert {r.run_id: sizes[r.run_key] for r in keys} == {r: shown[r] + events[r] + 1 for r in shown}
    dry = prune_module.prune(store, 10, statuses=["completed"], dry_run=True, now=100.0)
    counted: list[int] = []
    one_batch = prune_module._one_batch

    def recorded(conn: Connection, report: Any, prunable: Any, batch_size: int) -> bool:
        before = report.nodes
        more: bool = one_batch(conn, report, prunable, batch_size)
        counted.append(report.nodes - before)
        return more

    monkeypatch.setattr(prune_module, "_one_batch", recorded)
    done = prune_module.prune(store, 10, statuses=["completed"], now=100.0)
    for report in (dry, done):
        assert (report.runs, report.nodes) == (2, 230), report
    assert sum(counted) == 230
    with store.reader.connect() as conn:
        assert conn.execute(select(runs.c.run_id).where(runs.c.run_id.in_(list(shown)))).all() == []
