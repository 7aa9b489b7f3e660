"""Schema 14: the approvals inbox (``decisions.waiting``) reads the waiting node rows through the
partial index ``ix_raysaga_nodes_waiting`` instead of every node row through the view.

Two things are checked on SQLite and PostgreSQL: what it returns is what the view-based query
gave (kept here as the oracle) over a store mixing waiting approvals (plain and fan-out items,
decided or not, with approvers), sleeps, completed rows and chunks, in runs active and at rest;
and each of its reads of ``raysaga_nodes`` is planned through the index (``EXPLAIN QUERY PLAN`` /
``EXPLAIN``), with 20,000 completed rows beside the few waiting ones."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select, text

from raysaga.state import Batch, NodeStatus, NodeWrite, SqlStore, decisions
from raysaga.state.decisions import WaitingApproval, request_of, settles
from raysaga.state.decoding import reading
from raysaga.state.models import NodeRecord
from raysaga.state.schema import node_columns, node_rows, nodes, runs
from tests.state.test_view_readers_stop30 import _items, _new

INDEX = "ix_raysaga_nodes_waiting"
ACTIVE = ("running", "waiting_human", "waiting_timer", "paused")



@pytest.fixture
def store(own_store_url: str) -> Iterator[SqlStore]:
    """A database of this file's own: it leaves waiting approvals that a later test's whole-store
    inbox (``waiting_approvals()`` with no run) would show."""
    opened = SqlStore(own_store_url)
    yield opened
    opened.close()

def _through_view(store: SqlStore, approver: str | None, run_id: str | None) -> list[WaitingApproval]:
    """The inbox as schema 13 read it: the view's waiting rows joined to their runs."""
    query = (select(*node_columns, runs.c.workflow_name).join(runs, runs.c.run_id == node_rows.c.run_id)
             .where(node_rows.c.status == "waiting", runs.c.status.in_(ACTIVE)))
    if run_id is not None:
        query = query.where(node_rows.c.run_id == run_id)
    found: list[WaitingApproval] = []
    with store.engine.connect() as conn:
        for row in conn.execute(query).all():
            values = row._asdict()
            workflow = values.pop("workflow_name")
            with reading(values["run_id"], nodes.name):
                record = NodeRecord.model_validate(values)
            request = request_of(record)
            if request is None:
                continue
            deciders = request.deciders()
            if approver is not None and deciders is not None and approver not in deciders:
                continue
            so_far = decisions._decisions(conn, record.run_id, record.node_id, record.fan_index)
            if settles(request, so_far) is not None:
                continue
            found.append(WaitingApproval(run_id=record.run_id, workflow=workflow, node=record.node_id,
                                         fan_index=record.fan_index, request=request,
                                         approvals=[d.by for d in so_far if d.verdict == "approve"]))
    return sorted(found, key=lambda w: (w.request.asked_at, w.run_id, w.node))


def _ask(node: str, index: int, asked_at: float, approvers: list[str] | None = None, quorum: int = 1) -> NodeWrite:
    request = {"prompt": f"{node}[{index}]?", "asked_at": asked_at, "approvers": approvers, "quorum": quorum}
    return NodeWrite(node_id=node, fan_index=index, status=NodeStatus.WAITING, attempt=1,
                     output={decisions.REQUEST_KEY: request}, started_at=asked_at)


def _sleep(node: str) -> NodeWrite:
    return NodeWrite(node_id=node, status=NodeStatus.WAITING, attempt=1, not_before=2e9, started_at=1.0)


def _run(store: SqlStore, status: str, writes: list[NodeWrite], rng: random.Random, items: int = 0) -> str:
    run_id = f"inbox-{uuid.uuid4().hex[:10]}"
    store.create_run(_new(run_id))
    if items:
        _items(store, run_id, rng, list(range(items)), effect_odds=0.0)  # chunks and rows, completed
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(nodes=writes))
    store.release(lease)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE raysaga_runs SET status = :s WHERE run_id = :r"), {"s": status, "r": run_id})
    return run_id


def _mixed(store: SqlStore) -> list[str]:
    rng = random.Random(7)
    made = [
        _run(store, "waiting_human", [_ask("approve", -1, 10.0), _sleep("nap")], rng, items=120),
        _run(store, "running", [_ask("review", 3, 11.0, ["ann"]), _ask("review", 5, 12.0, ["bob"], quorum=2)], rng,
             items=60),
        _run(store, "paused", [_ask("sign", -1, 9.0, ["ann", "bob"], quorum=2)], rng),
        _run(store, "waiting_timer", [_sleep("later")], rng),
        _run(store, "completed", [_ask("stale", -1, 1.0)], rng),  # at rest: not decidable, not shown
        _run(store, "failed", [_ask("stale", -1, 2.0)], rng, items=40),
        _run(store, "pending", [], rng, items=30),
    ]
    store.decide(made[2], "sign", "approve", by="ann")  # one of a quorum of two: still waiting
    store.decide(made[1], "review", "approve", by="ann", fan_index=3)  # settled: not shown
    return made


def test_the_inbox_is_what_the_view_gave(store: SqlStore) -> None:
    made = _mixed(store)
    for approver in (None, "ann", "bob", "nobody"):
        for run_id in (None, *made, "no-such-run"):
            got = store.waiting_approvals(approver, run_id)
            assert got == _through_view(store, approver, run_id), (approver, run_id)
    everyone = store.waiting_approvals()
    # against the test's own store only: the PostgreSQL database is the session's
    mine = [(w.run_id, w.node, w.fan_index, w.approvals) for w in everyone if w.run_id in made]
    assert mine == [(made[2], "sign", -1, ["ann"]), (made[0], "approve", -1, []), (made[1], "review", 5, [])]


def _plans(store: SqlStore) -> list[tuple[str, str]]:
    """(statement, plan) of each read the inbox makes of ``raysaga_nodes``."""
    sent: list[tuple[str, Any]] = []

    def catch(conn: object, cursor: object, statement: str, parameters: Any, *args: object) -> None:
        sent.append((statement, parameters))

    event.listen(store.reader, "before_cursor_execute", catch)
    try:
        assert store.waiting_approvals()
    finally:
        event.remove(store.reader, "before_cursor_execute", catch)
    sqlite = store.engine.dialect.name == "sqlite"
    found: list[tuple[str, str]] = []
    with store.engine.connect() as conn:
        for statement, parameters in sent:
            if "raysaga_nodes" not in statement and "raysaga_node_rows" not in statement:
                continue  # the runs alone, or an approval's decisions (signals, by key)
            rows = conn.exec_driver_sql(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + statement,
                                        parameters).all()
            found.append((statement, "\n".join(str(r[-1]) for r in rows)))
    return found


def test_the_inbox_reads_the_waiting_rows_through_the_index(store: SqlStore) -> None:
    """With 20,000 completed rows (statistics gathered: a planner picks the cheapest way, and the
    index must be it) each read of the node table goes through the index; none scans the table,
    none reads the view."""
    rng = random.Random(3)
    made = _mixed(store)
    key = _run(store, "running", [_ask("big", 20_000, 13.0)], rng)
    with store.engine.begin() as conn:
        run_key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == key)).scalar_one()
        conn.execute(nodes.insert(), [{"run_key": run_key, "node_id": "big", "fan_index": i, "status": None,
                                       "attempt": 1, "output": json.dumps(i), "started_at": 1.0, "finished_at": 2.0}
                                      for i in range(20_000)])
        conn.exec_driver_sql("ANALYZE")
    plans = _plans(store)
    assert plans, "the inbox read no node rows"
    for statement, plan in plans:
        assert "raysaga_node_rows" not in statement, statement
        assert INDEX in plan, f"{statement}\n{plan}"
        if store.engine.dialect.name == "sqlite":
            assert not any(line.startswith("SCAN raysaga_nodes") and INDEX not in line for line in plan.splitlines())
        else:
            assert "Seq Scan on raysaga_nodes" not in plan, plan
    assert {w.run_id for w in store.waiting_approvals()} >= {made[0], made[1], made[2], key}


@pytest.mark.parametrize("run_status", ["waiting_human", "completed"])
def test_one_runs_inbox_reads_that_runs_rows_by_key(store: SqlStore, run_status: str) -> None:
    """``waiting_approvals(run_id=...)`` (the dashboard's run page) reads that run's rows by its
    ``run_key`` as before (SQLite: the primary key's range, or the index's), never the table."""
    rng = random.Random(5)
    run_id = _run(store, run_status, [_ask("approve", -1, 10.0)], rng, items=200)
    sent: list[tuple[str, Any]] = []

    def catch(conn: object, cursor: object, statement: str, parameters: Any, *args: object) -> None:
        sent.append((statement, parameters))

    event.listen(store.reader, "before_cursor_execute", catch)
    try:
        got = store.waiting_approvals(run_id=run_id)
    finally:
        event.remove(store.reader, "before_cursor_execute", catch)
    assert [w.node for w in got] == (["approve"] if run_status == "waiting_human" else [])
    if store.engine.dialect.name != "sqlite":
        return  # PostgreSQL's plan for one run depends on its statistics; the inbox's is checked above
    with store.engine.connect() as conn:
        for statement, parameters in sent:
            if "FROM raysaga_nodes" in statement and "raysaga_runs.status" not in statement:
                plan = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
                assert any(line.startswith("SEARCH raysaga_nodes") and "(run_key=?)" in line for line in plan), plan
                assert not any(line.startswith("SCAN raysaga_nodes") for line in plan), plan
