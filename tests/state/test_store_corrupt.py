"""A corrupt row affects only its run: ``list`` shows the others and flags it; reading that run
raises one ``CorruptRecordError`` naming the run, the table and column and what is wrong.

The rows are damaged with plain SQL, as an outside tool would. PostgreSQL's json type refuses
text that is not JSON, so there the damage is what it accepts: an unknown status.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from raysaga.errors import CorruptRecordError
from raysaga.state import Batch, NewEvent, NewRun, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore


def make_run(store: SqlStore, tag: str) -> str:
    run_id = f"{tag}-{uuid.uuid4().hex[:10]}"
    store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                            trace_id=uuid.uuid4().hex, input={"n": 1}))
    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING),
                              nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, output={"ok": 1}),
                                     NodeWrite(node_id="b", status=NodeStatus.FAILED, error={"type": "X"})],
                              events=[NewEvent(kind="note", data={"k": 1})]))
    store.release(lease)
    return run_id


def damage(store: SqlStore, sql: str, run_id: str) -> None:
    with store.engine.begin() as conn:
        assert conn.execute(text(sql), {"r": run_id}).rowcount >= 1


def listed(store: SqlStore) -> dict[str, Any]:
    return {r.run_id: r for r in store.list_runs(limit=10_000)}


def test_unknown_status_is_flagged_in_list_and_refused_on_read(store: SqlStore) -> None:
    good, bad = make_run(store, "good"), make_run(store, "bad")
    damage(store, "UPDATE raysaga_runs SET status = 'bogus' WHERE run_id = :r", bad)

    runs = listed(store)
    assert runs[good].corrupt is None and runs[good].status == RunStatus.RUNNING
    assert runs[bad].status is None and "raysaga_runs.status" in runs[bad].corrupt
    assert "'bogus'" in runs[bad].corrupt
    for read in (store.get_run, store.snapshot):
        with pytest.raises(CorruptRecordError) as exc:
            read(bad)
        message = str(exc.value)
        assert bad in message and "raysaga_runs.status" in message and "'bogus'" in message
        assert "only this run is affected" in message and "ValidationError" not in message
        assert len(message.splitlines()) == 1
    assert store.get_run(good).status == RunStatus.RUNNING
    assert store.snapshot(good).run.run_id == good


# SQLite only: text that is not JSON, and bytes that are not UTF-8

#: The run ``:r``'s key: node rows carry it, not the run id (schema 8).
RUN_KEY = "(SELECT run_key FROM raysaga_runs WHERE run_id = :r)"
DAMAGE: dict[str, tuple[str, str, Callable[[SqlStore, str], Any]]] = {
    "node output": (f"UPDATE raysaga_nodes SET output = '{{\"ok\": ' WHERE run_key = {RUN_KEY} AND node_id = 'a'",
                    "raysaga_nodes.output", lambda s, r: s.nodes(r)),
    "node error": (f"UPDATE raysaga_nodes SET error = 'NaN' WHERE run_key = {RUN_KEY} AND node_id = 'b'",
                   "raysaga_nodes.error", lambda s, r: s.snapshot(r)),
    "event data": ("UPDATE raysaga_events SET data = 'not json' WHERE run_id = :r AND kind = 'note'",
                   "raysaga_events.data", lambda s, r: s.events(r)),
    "run input": ("UPDATE raysaga_runs SET input = '[1,' WHERE run_id = :r",
                  "raysaga_runs.input", lambda s, r: s.get_run(r)),
    "run input as bytes": ("UPDATE raysaga_runs SET input = X'00FF' WHERE run_id = :r",
                           "raysaga_runs.input", lambda s, r: s.get_run(r)),
}


@pytest.mark.parametrize("what", list(DAMAGE))
def test_a_column_that_is_not_json_fails_only_its_run(sqlite_url: str, what: str) -> None:
    sql, column, read = DAMAGE[what]
    store = SqlStore(sqlite_url)
    try:
        good, bad = make_run(store, "good"), make_run(store, "bad")
        damage(store, sql, bad)
        with pytest.raises(CorruptRecordError) as exc:
            read(store, bad)
        message = str(exc.value)
        assert bad in message and column in message and "only this run is affected" in message
        # the other run reads whole, and the list is unaffected
        assert read(store, good) is not None
        assert store.nodes(good) and store.events(good) and store.get_run(good).input == {"n": 1}
        assert set(listed(store)) == {good, bad}
    finally:
        store.close()


def test_text_that_is_not_utf8_is_flagged_in_list_and_refused_on_read(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        good, bad = make_run(store, "good"), make_run(store, "bad")
        damage(store, "UPDATE raysaga_runs SET workflow_name = CAST(X'FF61' AS TEXT) WHERE run_id = :r", bad)
        runs = listed(store)
        assert runs[good].corrupt is None and runs[good].workflow_name == "wf"
        assert "raysaga_runs.workflow_name" in runs[bad].corrupt and "UTF-8" in runs[bad].corrupt
        with pytest.raises(CorruptRecordError) as exc:
            store.get_run(bad)
        assert bad in str(exc.value) and "UTF-8" in str(exc.value)
        assert store.get_run(good).workflow_name == "wf"
    finally:
        store.close()


def test_an_unreadable_time_is_flagged_in_list(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        good, bad = make_run(store, "good"), make_run(store, "bad")
        damage(store, "UPDATE raysaga_runs SET updated_at = 'yesterday' WHERE run_id = :r", bad)
        runs = listed(store)
        assert runs[good].corrupt is None
        assert "raysaga_runs.updated_at" in runs[bad].corrupt
        with pytest.raises(CorruptRecordError, match="updated_at"):
            store.get_run(bad)
    finally:
        store.close()
