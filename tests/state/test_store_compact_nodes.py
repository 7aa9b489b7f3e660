"""Schema 7's smaller node rows, on SQLite and PostgreSQL: a completed fan-out item is stored with
``finished_at`` NULL and its duration, and every reader gives ``finished_at`` back to the bit; a
row whose timestamps would not round-trip is stored whole; on SQLite ``raysaga_nodes`` is a
``WITHOUT ROWID`` table, also after an existing schema-6 file with runs in it is upgraded."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import Connection, select, text

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore, queries
from raysaga.state.fork_rows import run_key_of
from raysaga.state.schema import SCHEMA_VERSION, nodes
from tests.support.old_schema import store_at

T0 = 1_795_697_407.042_308_6
#: (node_id, fan_index, attempt, output JSON text, digest, started_at, finished_at): the item rows,
#: odd indexes only: consecutive ones would be written as a chunk (schema 12, test_item_chunks.py)
ITEMS = [("item", 2 * i + 1, 1, None if i % 2 else f'{{"i":{i}}}', None, T0 + i * 1e-4,
          T0 + i * 1e-4 + 3.1e-6 * (i + 1)) for i in range(50)]
#: timestamps far apart (a worker clock gone wrong): started + (finished - started) is not finished
ODD = ("item", 50, 2, "7", None, 684787713.5377197, 1704904018694.3918)


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="0" * 64,
                  trace_id=uuid.uuid4().hex)


def _stored(store: SqlStore, run_id: str) -> dict[int, tuple[float | None, float | None]]:
    """fan_index -> (finished_at, duration) as the table holds them."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(nodes.c.fan_index, nodes.c.finished_at, nodes.c.duration)
                            .where(nodes.c.run_key == run_key_of(run_id), nodes.c.fan_index >= 0)).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def test_item_rows_are_stored_compactly_and_every_reader_gives_finished_at_back(store: SqlStore) -> None:
    assert ODD[5] + (ODD[6] - ODD[5]) != ODD[6], "the odd row must be one that would not round-trip"
    run_id = "compact-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=[*ITEMS, ODD], nodes=[
        NodeWrite(node_id="waits", fan_index=-1, status=NodeStatus.COMPLETED, attempt=1, started_at=T0,
                  finished_at=T0 + 5.0)]))  # a NodeWrite keeps its columns as given (no duration here)

    stored = _stored(store, run_id)
    for node_id, index, _, _, _, started, finished in ITEMS:
        assert stored[index] == (None, finished - started), (node_id, index)
    assert stored[50] == (ODD[6], ODD[6] - ODD[5])  # written whole

    Times = tuple[float | None, float | None, float | None]
    want: dict[int, Times] = {index: (started, finished, finished - started)
                              for _, index, _, _, _, started, finished in [*ITEMS, ODD]}
    want[-1] = (T0, T0 + 5.0, None)

    def check(rows: list[tuple[int, float | None, float | None, float | None]], where: str) -> None:
        got = {index: (started, finished, duration) for index, started, finished, duration in rows}
        assert got == want, where

    check([(n.fan_index, n.started_at, n.finished_at, n.duration) for n in store.snapshot(run_id).nodes], "snapshot")
    check([(n.fan_index, n.started_at, n.finished_at, n.duration) for n in store.nodes(run_id)], "nodes")
    check([(n.fan_index, n.started_at, n.finished_at, n.duration) for n in store.node_states(run_id)], "node_states")
    for reader, rows in [
        ("iter_nodes", list(queries.iter_nodes(store, run_id, ["item", "waits"]))),
        ("node_rows", store.node_rows(run_id, [("item", i) for i in range(101)] + [("waits", -1)])),
        ("fan_items", [*store.fan_items(run_id, "item", limit=500), store.node_row(run_id, "waits", -1) or {}]),
    ]:
        check([(r["fan_index"], r["started_at"], r["finished_at"], r["duration"]) for r in rows], reader)
    row = store.node_row(run_id, "item", ITEMS[3][1])
    assert row is not None and row["finished_at"] == ITEMS[3][6]
    # a fork copies the compact row as it is, and reads it back the same
    child = "child-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(child).model_copy(update={"parent_run_id": run_id}), [("item", 5)], {"from": "item"})
    (copied,) = [n for n in store.nodes(child) if n.fan_index == 5]
    assert (copied.started_at, copied.finished_at, copied.duration) == want[5]


def test_an_existing_schema_6_file_with_runs_is_rebuilt_without_rowid(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with store_at(url, "0006") as engine, engine.begin() as conn:  # rows written as schema 6 wrote them
        assert "WITHOUT ROWID" not in _ddl(conn)
        conn.execute(text(
            "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
            "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, updated_at) "
            "VALUES ('old', 'wf', '1', :h, 'completed', 3, 1, 4, 0, 0, 0.0, 't', 1.0, 2.0)"), {"h": "d" * 64})
        conn.execute(text(
            "INSERT INTO raysaga_nodes (run_id, node_id, fan_index, status, attempt, output, output_digest, "
            "started_at, finished_at, duration, origin_run_id) VALUES "
            "('old', 'plan', -1, 'completed', 1, '[1,2]', NULL, 1.5, 2.5, 1.0, NULL), "
            "('old', 'item', 0, 'completed', 1, NULL, :d, 3.0, 3.25, 0.25, NULL), "
            "('old', 'item', 1, 'failed', 3, NULL, NULL, 3.0, NULL, NULL, 'parent')"), {"d": "sha256:" + "a" * 64})

    store = SqlStore(url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT version FROM raysaga_schema")).scalar_one() == SCHEMA_VERSION == 15
            assert _ddl(conn).endswith("WITHOUT ROWID")
            index = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'ix_raysaga_nodes_output_digest'"))
            assert "WHERE output_digest IS NOT NULL" in index.scalar_one()
            assert conn.execute(text("SELECT count(*) FROM sqlite_master WHERE name LIKE 'raysaga_nodes__%'")) \
                .scalar_one() == 0
        got = {(n.node_id, n.fan_index): n for n in store.nodes("old")}
        assert got[("plan", -1)].output == [1, 2]
        assert (got[("item", 0)].output_digest, got[("item", 0)].finished_at, got[("item", 0)].duration) == (
            "sha256:" + "a" * 64, 3.25, 0.25)
        assert (got[("item", 1)].status, got[("item", 1)].attempt, got[("item", 1)].origin_run_id) == (
            NodeStatus.FAILED, 3, "parent")
        # the rebuilt table keeps its foreign key: deleting the run deletes its rows
        with store.engine.begin() as conn:
            conn.execute(text("DELETE FROM raysaga_runs WHERE run_id = 'old'"))
            assert conn.execute(text("SELECT count(*) FROM raysaga_nodes")).scalar_one() == 0
    finally:
        store.close()
    # opening it again changes nothing
    again = SqlStore(url)
    try:
        with again.engine.connect() as conn:
            assert _ddl(conn).endswith("WITHOUT ROWID")
    finally:
        again.close()


def _ddl(conn: Connection) -> str:
    found = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'raysaga_nodes'"))
    return " ".join(str(found.scalar_one()).split())
