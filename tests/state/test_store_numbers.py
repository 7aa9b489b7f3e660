"""Stored numbers come back exactly: the same type and the same repr, in every JSON column.

SQLite gave JSON columns NUMERIC affinity, so a bare number was rewritten on insert
(``12345678901234567891`` became ``1.2345678901234567e+19``, ``2.0`` became ``2``, ``1e16`` an
int). Checked here on both dialects for every JSON column, bare and nested; the migration of a
schema-3 SQLite file to TEXT columns (keeping rows, and without cascading away any child row);
and end to end through a SIGKILL and a resume, where a dependent step reads its inputs back
from the store.

This module is also a flows module for ``tests.support.crash_driver --flows tests.state.test_store_numbers``.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from raysaga import Workflow

#: Every number here once came back changed from SQLite (or is an edge of JSON's number syntax).
NUMBERS: list[Any] = [
    12345678901234567891, -12345678901234567891, 2**63, -(2**63) - 1, 10**30,
    2.0, -2.0, 1e16, 1e-7, -0.0, 0.0, 0.1000000000000000055511151231257827, 1.5e300, 0.30000000000000004, 7, 0,
]
BIG_INPUT = 98765432109876543210
#: This module, as the crash driver imports it (``--flows``).
FLOWS_MODULE = "tests.state.test_store_numbers"


def shape(value: Any) -> str:
    """Type and repr, all the way down: ``2 == 2.0`` and ``-0.0 == 0.0`` in Python, not here."""
    return repr(_typed(value))


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, repr(value))


# ---------------------------------------------------------------------- the flow (crash_driver)

numbers_flow = Workflow("store-numbers")


@numbers_flow.step()
def produce(input: Any) -> Any:
    return {"numbers": NUMBERS, "input": input}


@numbers_flow.step()
def bare(produce: Any) -> Any:
    return produce["input"]  # a bare number as a node's whole output


@numbers_flow.step()
def echo(produce: Any, bare: Any) -> Any:
    return {"shapes": [shape(v) for v in produce["numbers"]], "bare": shape(bare), "values": produce}


FLOWS = {"numbers": numbers_flow}


# ---------------------------------------------------------------------- every column, both dialects


def _new_run(run_id: str, value: Any) -> Any:
    from raysaga.state import NewRun

    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, input=value)


@pytest.mark.parametrize("nested", [False, True], ids=["bare", "nested"])
def test_every_json_column_keeps_numbers_exactly(store: Any, nested: bool) -> None:
    from raysaga.state import (
        Batch,
        EffectStatus,
        EffectWrite,
        NewEvent,
        NodeStatus,
        NodeWrite,
        RunStatus,
        RunUpdate,
    )

    for i, number in enumerate(NUMBERS):
        value = {"v": number, "list": [number, {"deep": number}]} if nested else number
        error = {"detail": value}  # an error at rest is a JSON object (ErrorRecord): the number sits in it
        run_id = f"num-{uuid.uuid4().hex[:10]}-{i}"
        created = store.create_run(_new_run(run_id, value))
        lease = store.claim(run_id, "driver", 30.0)
        store.commit(lease, Batch(
            run=RunUpdate(status=RunStatus.RUNNING),
            nodes=[NodeWrite(node_id="ok", status=NodeStatus.COMPLETED, output=value),
                   NodeWrite(node_id="bad", status=NodeStatus.FAILED, error=error)],
            effects=[EffectWrite(idempotency_key=f"k-{run_id}", node_id="ok", effect_name="e", args_digest="a",
                                 status=EffectStatus.COMMITTED, result=value)],
            events=[NewEvent(kind="custom", data=value)],
        ))
        store.send_signal(run_id, "approve", "ok", payload=value)
        store.memory_cas(lease, "key", value, 0, "writer-1")
        done = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.FAILED, output=value, set_output=True,
                                                       error=error, set_error=True)))
        assert done is not None

        want = shape(value)
        run = store.get_run(run_id)
        snap = store.snapshot(run_id)
        nodes = {n.node_id: n for n in store.nodes(run_id)}
        got = {
            "create_run input": created.input,
            "run input": run.input, "run output": run.output, "run error": run.error and run.error["detail"],
            "commit's record output": done.output,
            "snapshot input": snap.run.input,
            "node output": nodes["ok"].output, "node error": nodes["bad"].error and nodes["bad"].error["detail"],
            "snapshot node output": {n.node_id: n for n in snap.nodes}["ok"].output,
            "effect result": store.effects(run_id)[0].result,
            "event data": next(e.data for e in store.events(run_id) if e.kind == "custom"),
            "signal payload": store.pending_signals(run_id)[0].payload,
            "memory value": store.memory_get(run_id, "key").value,
        }
        wrong = {where: shape(v) for where, v in got.items() if shape(v) != want}
        assert wrong == {}, f"{number!r} stored as {want}"


# ---------------------------------------------------------------------- migration of a schema-3 file


def test_schema_3_sqlite_file_is_converted_keeping_every_row(tmp_path: Path) -> None:
    """A file made by the previous raysaga (JSON-declared columns, coerced numbers already in it)
    is upgraded in place: TEXT columns, every row of every table kept (dropping the runs table
    would have cascaded away its nodes and events), and new writes exact."""
    from sqlalchemy import text

    from raysaga.state import SqlStore, migrate
    from raysaga.state.schema import SCHEMA_VERSION
    from tests.support.old_schema import store_at

    db = tmp_path / "old.db"
    url = f"sqlite:///{db}"
    with store_at(url, "0003") as engine, engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
            "version, fence, event_seq, input, output, retries_used, tokens_used, cost_used, trace_id, "
            "created_at, updated_at) VALUES ('old', 'wf', '1', :h, 'completed', 3, 1, 2, :inp, :out, 0, 0, 0.0, "
            "'t', 1.0, 2.0)"), {"h": "d" * 64, "inp": '{"kept": [1, 2.5]}', "out": "0.30000000000000004"})
        conn.execute(text("INSERT INTO raysaga_nodes (run_id, node_id, fan_index, status, attempt, output) "
                          "VALUES ('old', 'a', -1, 'completed', 1, :o)"), {"o": '{"x": 2.0}'})
        conn.execute(text("INSERT INTO raysaga_events (run_id, seq, at, kind, data) "
                          "VALUES ('old', 1, 1.0, 'run_created', :d)"), {"d": "12345678901234567891"})
    with sqlite3.connect(db) as raw:  # what the old schema did to a bare number
        assert raw.execute("SELECT typeof(data) FROM raysaga_events").fetchone()[0] == "real"
        assert raw.execute("SELECT typeof(output) FROM raysaga_runs").fetchone()[0] == "real"

    store = SqlStore(url)
    try:
        assert migrate.current_version(store.engine) == SCHEMA_VERSION
        with sqlite3.connect(db) as raw:
            for table, column in [("raysaga_runs", "input"), ("raysaga_runs", "output"), ("raysaga_runs", "error"),
                                  ("raysaga_nodes", "output"), ("raysaga_nodes", "error"),
                                  ("raysaga_effects", "result"), ("raysaga_events", "data"),
                                  ("raysaga_signals", "payload"), ("raysaga_memory", "value")]:
                declared = {r[1]: r[2] for r in raw.execute(f"PRAGMA table_info({table})")}
                assert declared[column] == "TEXT", (table, column)
            indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
            assert {"ix_raysaga_runs_created", "ix_raysaga_runs_status_created",
                    "ix_raysaga_nodes_output_digest"} <= indexes
        old = store.get_run("old")
        assert shape(old.input) == shape({"kept": [1, 2.5]})
        assert shape(old.output) == shape(0.30000000000000004)  # a float SQLite kept: its exact value
        assert shape([n.output for n in store.nodes("old")]) == shape([{"x": 2.0}])  # text was never touched
        assert shape(store.events("old")[0].data) == shape(1.2345678901234567e19)  # already coerced: as stored
        created = store.create_run(_new_run("new", 12345678901234567891))
        assert shape(created.input) == shape(12345678901234567891)
        assert shape(store.get_run("new").input) == shape(12345678901234567891)
    finally:
        store.close()


# ---------------------------------------------------------------------- through a SIGKILL


def test_numbers_survive_a_sigkill_and_resume(store_url: str, tmp_path: Path) -> None:
    """The dependent ``echo`` sees exactly what ``produce`` and ``bare`` returned, when it runs in
    the same process (golden) and when it runs after a SIGKILL, reading them from the store."""
    import signal

    from raysaga.state import RunStatus, SqlStore
    from tests.support import crash_driver as harness

    run_id = f"n-{uuid.uuid4().hex[:10]}"  # the PostgreSQL database is shared by the session
    golden_db = f"sqlite:///{tmp_path / 'golden.db'}"
    golden = harness.run_driver("numbers", golden_db, run_id, flows=FLOWS_MODULE, run_input=BIG_INPUT)
    assert golden.returncode == 0, golden.describe()

    killed = harness.run_driver("numbers", store_url, run_id, flows=FLOWS_MODULE, run_input=BIG_INPUT,
                                faults="after_commit:bare", lease_ttl=0.5)
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    store = SqlStore(store_url)
    try:
        assert {n.node_id for n in store.nodes(run_id)} == {"produce", "bare"}
        harness.wait_lease_expired(store, run_id)
    finally:
        store.close()
    resumed = harness.run_driver("numbers", store_url, run_id, flows=FLOWS_MODULE, resume=True,
                                 lease_ttl=0.5)
    assert resumed.returncode == 0, resumed.describe()

    outputs = {}
    for url in (golden_db, store_url):
        s = SqlStore(url)
        try:
            record = s.get_run(run_id)
            assert record.status == RunStatus.COMPLETED
            outputs[url] = record.output
        finally:
            s.close()
    expected = {"shapes": [shape(v) for v in NUMBERS], "bare": shape(BIG_INPUT),
                "values": {"numbers": NUMBERS, "input": BIG_INPUT}}
    assert outputs[store_url]["echo"]["shapes"] == expected["shapes"]
    assert outputs[store_url]["echo"]["bare"] == expected["bare"]
    assert shape(outputs[store_url]) == shape(outputs[golden_db]) == shape({"echo": expected})
    assert json.dumps(outputs[store_url], sort_keys=True) == json.dumps(outputs[golden_db], sort_keys=True)
