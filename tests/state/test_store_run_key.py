"""Schema 8, on SQLite and PostgreSQL: node rows carry their run's integer ``run_key``, not its id;
every run gets a key of its own however its row is inserted; plain SQL reads node rows by run id
through the view ``raysaga_node_rows``; deleting a run deletes its rows; and an existing schema-7
store with runs and node rows in it is converted in place, its rows read back as they were."""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, Engine, func, insert, inspect, select, text

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore
from raysaga.state.schema import SCHEMA_VERSION, item_chunks, node_rows, nodes, runs
from tests.support.old_schema import store_at

HASH = "d" * 64
DIGEST = "sha256:" + "a" * 64


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash=HASH,
                  trace_id=uuid.uuid4().hex)


def _keys(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {r[0]: r[1] for r in conn.execute(select(runs.c.run_id, runs.c.run_key))}


def test_node_rows_carry_the_run_key_and_read_back_by_run_id(store: SqlStore) -> None:
    assert SCHEMA_VERSION == 15
    assert "run_id" not in {c["name"] for c in inspect(store.engine).get_columns("raysaga_nodes")}
    ids = [f"w-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    for run_id in ids:
        store.create_run(_new(run_id))
    # a run row inserted any other way (Core, no run_key given) gets a key too
    bare = f"bare-{uuid.uuid4().hex[:12]}"
    with store.engine.begin() as conn:
        conn.execute(insert(runs).values(run_id=bare, workflow_name="w", workflow_version="1", definition_hash=HASH,
                                         status="pending", version=0, fence=0, event_seq=0, retries_used=0,
                                         tokens_used=0, cost_used=0.0, trace_id="t", created_at=1.0, updated_at=1.0))
    keys = _keys(store.engine)
    assert all(isinstance(keys[r], int) for r in [*ids, bare]) and len(set(keys.values())) == len(keys)
    for run_id in ids:  # two runs, same node names: each reads its own rows
        lease = store.claim(run_id, "me", 30)
        store.commit(lease, Batch(items=[("item", i, 1, f'"{run_id}"', None, 1.0 + i, 2.0 + i) for i in range(3)],
                                  nodes=[NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, output=run_id)]))
    for run_id in ids:
        got = store.nodes(run_id)
        assert {(n.run_id, n.node_id, n.fan_index, n.output) for n in got} == {
            (run_id, "plan", -1, run_id), *((run_id, "item", i, run_id) for i in range(3))}
        assert [n.finished_at for n in got if n.fan_index >= 0] == [2.0, 3.0, 4.0]
    with store.engine.connect() as conn:  # the tables hold the key (items a chunk holds, schema 12: each
        # counted); the view shows the run id
        held: dict[int, int] = {}
        for table, count in ((nodes, func.count()), (item_chunks, func.sum(item_chunks.c.item_count))):
            for key, n in conn.execute(select(table.c.run_key, count).where(table.c.run_key.in_(
                    [keys[r] for r in ids])).group_by(table.c.run_key)).all():
                held[key] = held.get(key, 0) + int(n)
        assert sorted(held.items()) == sorted((keys[r], 4) for r in ids)
        rows = conn.execute(text("SELECT node_id, fan_index, finished_at FROM raysaga_node_rows WHERE run_id = :r "
                                 "ORDER BY node_id, fan_index"), {"r": ids[1]}).all()
        assert [tuple(r) for r in rows] == [("item", 0, 2.0), ("item", 1, 3.0), ("item", 2, 4.0), ("plan", -1, None)]
        assert {c["name"] for c in inspect(conn).get_columns(node_rows.name)} == set(node_rows.c.keys())
    # a fork's copied rows are its own (its key), marked with the run that executed them
    child = f"w-{uuid.uuid4().hex[:12]}"
    store.fork_run(_new(child).model_copy(update={"parent_run_id": ids[0]}), [("item", 1)], {"from": "item"})
    [copied] = store.nodes(child)
    assert (copied.run_id, copied.fan_index, copied.output, copied.origin_run_id) == (child, 1, ids[0], ids[0])
    # deleting a run deletes its node rows (ON DELETE CASCADE on run_key), and only its own
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM raysaga_runs WHERE run_id = :r"), {"r": ids[0]})
    assert store.nodes(ids[0]) == [] and len(store.nodes(ids[1])) == 4 and len(store.nodes(child)) == 1
    with store.engine.connect() as conn:
        assert conn.execute(select(nodes.c.run_key).where(nodes.c.run_key == keys[ids[0]])).first() is None


def _schema_7(url: str) -> None:
    """A schema-7 store holding two runs with node rows, written as schema 7 wrote them."""
    with store_at(url, "0007") as engine, engine.begin() as conn:
        for run_id, at in (("old-a", 1.0), ("old-b", 2.0)):
            conn.execute(text(
                "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
                "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
                "updated_at) VALUES (:r, 'wf', '1', :h, 'completed', 3, 1, 4, 0, 0, 0.0, 't', :at, :at)"),
                {"r": run_id, "h": HASH, "at": at})
        conn.execute(text(
            "INSERT INTO raysaga_nodes (run_id, node_id, fan_index, status, attempt, output, output_digest, "
            "started_at, finished_at, duration, origin_run_id) VALUES "
            "('old-a', 'plan', -1, 'completed', 1, '[1,2]', NULL, 1.5, 2.5, 1.0, NULL), "
            "('old-a', 'item', 0, 'completed', 1, NULL, :d, 3.0, NULL, 0.25, NULL), "
            "('old-a', 'item', 1, 'failed', 3, NULL, NULL, 3.0, NULL, NULL, 'parent'), "
            "('old-b', 'plan', -1, 'completed', 1, '\"b\"', NULL, 1.0, 2.0, 1.0, NULL)"), {"d": DIGEST})


def test_an_existing_schema_7_store_with_rows_is_converted_in_place(empty_url: str) -> None:
    _schema_7(empty_url)
    store = SqlStore(empty_url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT version FROM raysaga_schema")).scalar_one() == SCHEMA_VERSION == 15
            _check_layout(conn)
        keys = _keys(store.engine)
        assert set(keys) == {"old-a", "old-b"} and keys["old-a"] != keys["old-b"]
        got = {(n.node_id, n.fan_index): n for n in store.nodes("old-a")}
        assert set(got) == {("plan", -1), ("item", 0), ("item", 1)}
        assert (got[("plan", -1)].output, got[("plan", -1)].finished_at) == ([1, 2], 2.5)
        assert (got[("item", 0)].output_digest, got[("item", 0)].finished_at, got[("item", 0)].duration) == (
            DIGEST, 3.25, 0.25)  # a compact row (schema 7): finished_at derived
        assert (got[("item", 1)].status, got[("item", 1)].attempt, got[("item", 1)].origin_run_id) == (
            NodeStatus.FAILED, 3, "parent")
        assert [(n.node_id, n.output) for n in store.nodes("old-b")] == [("plan", "b")]
        # a run created after the upgrade gets a key no old run has, and its commit writes rows
        store.create_run(_new("new"))
        lease = store.claim("new", "me", 30)
        store.commit(lease, Batch(items=[("item", 0, 1, "1", None, 5.0, 6.0)]))
        assert _keys(store.engine)["new"] not in keys.values()
        assert [(n.run_id, n.finished_at) for n in store.nodes("new")] == [("new", 6.0)]
        # prune still deletes a run's node rows, and only its own
        report = store.prune(0, statuses=["completed"])
        assert (report.runs, report.nodes) == (2, 4)
        assert store.nodes("old-a") == [] and len(store.nodes("new")) == 1
    finally:
        store.close()
    again = SqlStore(empty_url)  # opening it again changes nothing
    try:
        with again.engine.connect() as conn:
            _check_layout(conn)
        assert len(again.nodes("new")) == 1
    finally:
        again.close()


def _check_layout(conn: Connection) -> None:
    """The rebuilt node table: keyed by run_key, its partial index kept, nothing left over."""
    insp = inspect(conn)
    assert next(c["name"] for c in insp.get_columns("raysaga_nodes")) == "run_key"
    assert insp.get_pk_constraint("raysaga_nodes")["constrained_columns"] == ["run_key", "node_id", "fan_index"]
    [fk] = insp.get_foreign_keys("raysaga_nodes")
    assert (fk["constrained_columns"], fk["referred_columns"], fk["options"].get("ondelete")) == (
        ["run_key"], ["run_key"], "CASCADE")
    assert "raysaga_nodes__v7" not in insp.get_table_names() and node_rows.name in insp.get_view_names()
    index = {i["name"]: i for i in insp.get_indexes("raysaga_nodes")}["ix_raysaga_nodes_output_digest"]
    assert index["column_names"] == ["output_digest"]
    if conn.dialect.name == "sqlite":
        ddl = conn.execute(text("SELECT group_concat(sql, ' ') FROM sqlite_master WHERE tbl_name = 'raysaga_nodes'"))
        found = " ".join(str(ddl.scalar_one()).split())
        assert "WITHOUT ROWID" in found and "WHERE output_digest IS NOT NULL" in found
    else:
        where = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_raysaga_nodes_output_digest'"))
        assert "WHERE (output_digest IS NOT NULL)" in where.scalar_one()
