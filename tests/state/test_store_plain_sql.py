"""The run's own statements as plain SQL (``raysaga.state.run_sql``) and the plain-SQL commit on
SQLite (``statements.sqlite_write``) read and write exactly what the Core statements did.

Records the store returns from a write (``create_run``, a commit's run update) equal what a
fresh read returns; a snapshot equals its rows read through SQLAlchemy Core and validated; a
transition is still checked against the stored status (now returned by the fence guard); and a
plain-SQL transaction that fails part-way writes nothing and leaves its connection usable.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, text

from raysaga.errors import CorruptRecordError, LeaseLostError, NotJSONableError
from raysaga.state import (
    Batch,
    EffectRecord,
    EffectStatus,
    EffectWrite,
    NewEvent,
    NewRun,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
    RunUpdate,
    SignalRecord,
    SqlStore,
)
from raysaga.state.decoding import run_record
from raysaga.state.schema import effects, node_rows, runs, signals
from raysaga.state.statements import driver_sql, sqlite_write

#: Values whose JSON text is easy to get subtly wrong: big and float-looking numbers, unicode, nesting.
AWKWARD = {"big": 12345678901234567891, "float": 2.0, "tiny": 1e-300, "text": "héllo ☃ \u2028", "none": None,
           "nested": [{"a": [1, 2.5, True, False]}, []]}


def new_run(store: SqlStore, **fields: Any) -> str:
    run_id = f"plain-{uuid.uuid4().hex[:12]}"
    values: dict[str, Any] = {"run_id": run_id, "workflow_name": "wf", "workflow_version": "3",
                              "definition_hash": "d" * 64, "trace_id": uuid.uuid4().hex, "input": AWKWARD,
                              "step_hashes": {"a": "0" * 16, "b": "1" * 16}, **fields}
    created = store.create_run(NewRun(**values))
    assert created == store.get_run(run_id) == core_run(store, run_id)
    return run_id


def core_run(store: SqlStore, run_id: str, *, lenient: bool = False) -> RunRecord:
    """The run read through SQLAlchemy Core, as the store read it before its plain SQL."""
    with store.reader.connect() as conn:
        return run_record(conn, conn.execute(select(runs).where(runs.c.run_id == run_id)).one(), lenient=lenient)


@pytest.mark.parametrize("fields", [
    {},
    {"input": None, "step_hashes": None},
    {"input": {"blob": "x" * 70_000}, "queue": "default", "deadline_at": 1e10, "retry_budget": 3,
     "token_budget": 1000, "cost_budget": 2.5, "workflow_ref": "mod:wf"},
], ids=["inline", "nulls", "input-in-a-blob"])
def test_create_run_returns_the_run_as_a_fresh_read_does(store: SqlStore, fields: dict[str, Any]) -> None:
    run_id = new_run(store, **fields)
    run = store.get_run(run_id)
    assert run.status == RunStatus.PENDING and run.version == 0 and run.event_seq == 1
    assert run.input == fields.get("input", AWKWARD)
    value = fields.get("input")
    assert (run.input_digest is not None) == (isinstance(value, dict) and "blob" in value)


def test_a_commits_run_update_returns_the_run_as_a_fresh_read_does(store: SqlStore) -> None:
    run_id = new_run(store)
    lease = store.claim(run_id, "driver", 30.0)
    running = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="go")))
    assert running == store.get_run(run_id) == core_run(store, run_id) and running is not None
    assert running.status == RunStatus.RUNNING and running.version == 1 and running.status_reason == "go"
    budgets = store.commit(lease, Batch(run=RunUpdate(token_budget=10, cost_budget=0.5, set_budgets=True,
                                                      tokens_delta=3)))
    assert budgets == store.get_run(run_id) == core_run(store, run_id) and budgets is not None
    assert (budgets.version, budgets.token_budget, budgets.cost_budget, budgets.tokens_used) == (1, 10, 0.5, 3)
    resting = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.WAITING_TIMER, wake_at=1e10, set_wake=True)))
    assert resting == store.get_run(run_id) == core_run(store, run_id) and resting is not None
    assert resting.wake_at == 1e10
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    done = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED, output=AWKWARD, set_output=True)))
    assert done == store.get_run(run_id) == core_run(store, run_id) and done is not None
    assert done.output == AWKWARD and done.wake_at is None and done.version == 4
    failed_id = new_run(store)
    other = store.claim(failed_id, "driver", 30.0)
    store.commit(other, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    failed = store.commit(other, Batch(run=RunUpdate(status=RunStatus.FAILED, error={"type": "Boom", "message": "x"},
                                                     set_error=True)))
    assert failed == store.get_run(failed_id, lenient=True) == core_run(store, failed_id, lenient=True)
    assert failed is not None and failed.error is not None


def test_a_snapshot_reads_rows_as_core_reads_them(store: SqlStore) -> None:
    run_id = new_run(store)
    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(
        run=RunUpdate(status=RunStatus.RUNNING),
        nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, attempt=2, output=AWKWARD, started_at=1.5,
                         finished_at=2.0, duration=0.5),
               NodeWrite(node_id="b", fan_index=3, status=NodeStatus.FAILED, error={"type": "X", "message": "☃"}),
               NodeWrite(node_id="c", status=NodeStatus.RETRYING, not_before=1e10)],
        effects=[EffectWrite(idempotency_key=uuid.uuid4().hex, node_id="a", effect_name="pay", args_digest="0" * 64,
                             status=EffectStatus.COMMITTED, result=AWKWARD, external_id="ch_1"),
                 EffectWrite(idempotency_key=uuid.uuid4().hex, node_id="b", fan_index=3, effect_name="mail",
                             args_digest="1" * 64, status=EffectStatus.PENDING)],
        events=[NewEvent(kind="note", data=AWKWARD)]))
    store.send_signal(run_id, "cancel", payload=AWKWARD)
    store.send_signal(run_id, "approve", node_id="b", payload=None)
    snap = store.snapshot(run_id)
    with store.reader.connect() as conn:
        def core(table: Any, model: Any, *order: Any) -> list[Any]:
            query = select(table).where(table.c.run_id == run_id)
            if table is signals:
                query = query.where(signals.c.consumed_at.is_(None))
            return [model.model_validate(r._asdict()) for r in conn.execute(query.order_by(*order)).all()]

        # node rows, by run id, through their view (schema 8: the table holds the run's integer key)
        assert snap.nodes == core(node_rows, NodeRecord, node_rows.c.node_id, node_rows.c.fan_index)
        assert sorted(snap.effects, key=lambda e: e.idempotency_key) == core(effects, EffectRecord,
                                                                             effects.c.idempotency_key)
        assert snap.signals == core(signals, SignalRecord, signals.c.id)
    assert snap.run == store.get_run(run_id) == core_run(store, run_id) and snap.run.input == AWKWARD
    assert [n.output for n in snap.nodes if n.node_id == "a"] == [AWKWARD]
    assert [s.payload for s in snap.signals] == [AWKWARD, None]


def test_a_transition_is_checked_against_the_stored_status_and_a_corrupt_one_is_refused(store: SqlStore) -> None:
    run_id = new_run(store)
    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE raysaga_runs SET status = 'bogus' WHERE run_id = :r"), {"r": run_id})
    before = _row(store, run_id)
    with pytest.raises(CorruptRecordError) as exc:
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED),
                                  nodes=[NodeWrite(node_id="z", status=NodeStatus.COMPLETED)]))
    assert run_id in str(exc.value) and "raysaga_runs.status" in str(exc.value) and "'bogus'" in str(exc.value)
    assert _row(store, run_id) == before and store.nodes(run_id) == []  # nothing written


def _row(store: SqlStore, run_id: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.run_id == run_id)).one()._asdict()


def _footprint(store: SqlStore, run_id: str) -> tuple[Any, ...]:
    return _row(store, run_id), store.nodes(run_id), store.events(run_id)


def test_a_plain_commit_that_fails_part_way_writes_nothing_and_its_connection_stays_usable(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        run_id = new_run(store)
        lease = store.claim(run_id, "driver", 30.0)
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        before = _footprint(store, run_id)
        # the fence guard has run (it reserved event seqs) when the node's output is refused
        with pytest.raises(NotJSONableError):
            store.commit(lease, Batch(nodes=[NodeWrite.model_construct(node_id="a", fan_index=-1, attempt=1,
                                                                       status=NodeStatus.COMPLETED, output={1, 2},
                                                                       output_digest=None, error=None,
                                                                       not_before=None, started_at=None,
                                                                       finished_at=None, duration=None)],
                                      events=[NewEvent(kind="note")]))
        assert _footprint(store, run_id) == before
        # a statement the database refuses: SQLAlchemy's error, and again nothing written
        with pytest.raises(sa_exc.OperationalError), sqlite_write(store.engine) as hot:
            assert hot.one(driver_sql("sqlite").guard, (1, 1.0, run_id, lease.fence)) is not None
            hot.one("SELECT no_such_column FROM raysaga_runs", ())
        assert _footprint(store, run_id) == before
        with pytest.raises(RuntimeError), sqlite_write(store.engine) as hot:
            hot.one(driver_sql("sqlite").guard, (1, 1.0, run_id, lease.fence))
            raise RuntimeError("the body fails")
        assert _footprint(store, run_id) == before
        # the pooled connection was given back with no transaction open: commits go on
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, output=AWKWARD)],
                                  events=[NewEvent(kind="note")]))
        assert [n.output for n in store.nodes(run_id)] == [AWKWARD]
        assert [e.kind for e in store.events(run_id)][-1] == "note"
        # and a stale fence still stops a plain commit before it writes
        store.claim(run_id, "other", 30.0, take_from="driver")
        after = _footprint(store, run_id)
        with pytest.raises(LeaseLostError):
            store.commit(lease, Batch(nodes=[NodeWrite(node_id="b", status=NodeStatus.COMPLETED)]))
        assert _footprint(store, run_id) == after
    finally:
        store.close()
