"""Schema 9's smaller store, on SQLite and PostgreSQL: a completed node row stores its status as
NULL and every reader (and plain SQL, through the view) still sees 'completed'; a new SQLite file
has 1 KiB pages and no free pages, and lacks the objects schema 9 dropped; an existing file keeps
its page size; an existing schema-8 store with rows in it is converted in place."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Connection, inspect, select, text

from raysaga.errors import UserError
from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore, queries
from raysaga.state.engine import NEW_FILE_PAGE_SIZE, PAGE_SIZE_ENV
from raysaga.state.fork_rows import run_key_of
from raysaga.state.models import BreakerRecord, BreakerState
from raysaga.state.rate_limits import RateRule
from raysaga.state.schema import SCHEMA_VERSION, item_chunks, nodes
from tests.support.old_schema import store_at

HASH = "e" * 64
SMALL_TABLES = ("raysaga_breakers", "raysaga_rate_limits")


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash=HASH,
                  trace_id=uuid.uuid4().hex)


def _stored_status(store: SqlStore, run_id: str) -> dict[tuple[str, int], str | None]:
    """(node_id, fan_index) -> ``raysaga_nodes.status`` as the table holds it; an item a chunk holds
    (schema 12: ``raysaga_item_chunks``, no status stored) as None."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(nodes.c.node_id, nodes.c.fan_index, nodes.c.status)
                            .where(nodes.c.run_key == run_key_of(run_id))).all()
        chunks = conn.execute(select(item_chunks.c.node_id, item_chunks.c.first_index, item_chunks.c.item_count)
                              .where(item_chunks.c.run_key == run_key_of(run_id))).all()
    chunked = {(node_id, first + i): None for node_id, first, count in chunks for i in range(count)}
    return {**chunked, **{(r[0], r[1]): r[2] for r in rows}}


def test_a_completed_row_stores_no_status_and_every_reader_says_completed(store: SqlStore) -> None:
    run_id = "small-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=[("item", i, 1, f"{i}", None, 10.0 + i, 10.5 + i) for i in range(3)], nodes=[
        NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1, output=[0, 1, 2, 3]),
        NodeWrite(node_id="item", fan_index=3, status=NodeStatus.FAILED, attempt=2, error={"message": "no"}),
        NodeWrite(node_id="sink", status=NodeStatus.PENDING)]))
    assert _stored_status(store, run_id) == {("plan", -1): None, ("item", 0): None, ("item", 1): None,
                                             ("item", 2): None, ("item", 3): "failed", ("sink", -1): "pending"}
    want = {("plan", -1): NodeStatus.COMPLETED, **{("item", i): NodeStatus.COMPLETED for i in range(3)},
            ("item", 3): NodeStatus.FAILED, ("sink", -1): NodeStatus.PENDING}
    assert {(n.node_id, n.fan_index): n.status for n in store.nodes(run_id)} == want
    assert {(n.node_id, n.fan_index): n.status for n in store.snapshot(run_id).nodes} == want
    assert {(n.node_id, n.fan_index): n.status for n in store.node_states(run_id)} == want
    rows = store.node_rows(run_id, list(want))
    assert {(r["node_id"], r["fan_index"]): r["status"] for r in rows} == {k: v.value for k, v in want.items()}
    assert [r["fan_index"] for r in queries.iter_nodes(store, run_id, ["item"]) if r["status"] == "completed"] == [
        0, 1, 2]
    # the pending row turns completed: an upsert writes NULL over the text
    store.commit(lease, Batch(nodes=[NodeWrite(node_id="sink", status=NodeStatus.COMPLETED, attempt=1, output=3)]))
    assert _stored_status(store, run_id)[("sink", -1)] is None
    with store.engine.begin() as conn:
        # plain SQL reads the view as before schema 9, status included
        got = conn.execute(text("SELECT node_id, fan_index FROM raysaga_node_rows WHERE run_id = :r "
                                "AND status = 'completed' ORDER BY node_id, fan_index"), {"r": run_id}).all()
        assert [tuple(r) for r in got] == [("item", 0), ("item", 1), ("item", 2), ("plan", -1), ("sink", -1)]
        # a row written by hand with the text reads the same
        conn.execute(text("UPDATE raysaga_nodes SET status = 'completed' WHERE node_id = 'plan' AND run_key = "
                          "(SELECT run_key FROM raysaga_runs WHERE run_id = :r)"), {"r": run_id})
    assert {(n.node_id, n.fan_index): n.status for n in store.nodes(run_id)}[("plan", -1)] is NodeStatus.COMPLETED
    # a fork's copied rows keep what the table held, and read completed
    child = "child-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(child).model_copy(update={"parent_run_id": run_id}), [("item", 1), ("plan", -1)],
                   {"from": "item"})
    assert _stored_status(store, child) == {("item", 1): None, ("plan", -1): "completed"}
    assert {n.status for n in store.nodes(child)} == {NodeStatus.COMPLETED}


def _objects(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0]: " ".join(str(r[1]).split()) for r in conn.execute("SELECT name, sql FROM sqlite_master")}
    finally:
        conn.close()


def _pragma(path: Path, name: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])
    finally:
        conn.close()


def test_a_new_sqlite_file_has_small_pages_no_free_pages_and_only_the_objects_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    store = SqlStore(f"sqlite:///{path}")
    try:
        assert store.engine.dialect.name == "sqlite"
    finally:
        store.close()
    assert (_pragma(path, "page_size"), _pragma(path, "freelist_count")) == (NEW_FILE_PAGE_SIZE, 0) == (1024, 0)
    found = _objects(path)
    assert "ix_raysaga_runs_status" in found  # counting runs by status scans it (the narrowest)
    for table in SMALL_TABLES:
        assert found[table].endswith("WITHOUT ROWID") and f"sqlite_autoindex_{table}_1" not in found
    assert "sqlite_autoindex_alembic_version_1" not in found
    assert found["raysaga_node_rows"].split(" UNION ALL ")[0].count("COALESCE(") == 2  # the node rows' part
    # the empty store: ~41 one-KiB pages (schema 8's were 39 of 4 KiB: 159,744 bytes)
    assert path.stat().st_size <= 48 * 1024


def test_the_page_size_of_new_files_can_be_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAGE_SIZE_ENV, "4096")
    path = tmp_path / "big-pages.db"
    SqlStore(f"sqlite:///{path}").close()
    assert (_pragma(path, "page_size"), _pragma(path, "freelist_count")) == (4096, 0)
    for wrong in ("1000", "256", "131072", "4k"):
        monkeypatch.setenv(PAGE_SIZE_ENV, wrong)
        with pytest.raises(UserError, match=PAGE_SIZE_ENV):
            SqlStore(f"sqlite:///{tmp_path / 'never.db'}")
    assert not (tmp_path / "never.db").exists()


def test_an_existing_file_keeps_its_page_size(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)  # a file made before schema 9: SQLite's default 4 KiB pages, WAL
    conn.execute("PRAGMA page_size=4096")
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.close()
    store = SqlStore(f"sqlite:///{path}")
    try:
        store.create_run(_new("kept"))
        lease = store.claim("kept", "me", 30)
        store.commit(lease, Batch(items=[("item", 0, 1, "1", None, 1.0, 2.0)]))
        assert [n.status for n in store.nodes("kept")] == [NodeStatus.COMPLETED]
    finally:
        store.close()
    assert _pragma(path, "page_size") == 4096


def _schema_8(url: str) -> None:
    """A schema-8 store holding two runs with node rows, a breaker and a rate limit, as schema 8 wrote them."""
    with store_at(url, "0008") as engine, engine.begin() as conn:
        for run_id, at in (("old-a", 1.0), ("old-b", 2.0)):
            conn.execute(text(
                "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
                "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
                "updated_at) VALUES (:r, 'wf', '1', :h, 'running', 3, 1, 4, 0, 0, 0.0, 't', :at, :at)"),
                {"r": run_id, "h": HASH, "at": at})
        keys = {r[0]: r[1] for r in conn.execute(text("SELECT run_id, run_key FROM raysaga_runs"))}
        conn.execute(text(
            "INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, output, started_at, "
            "finished_at, duration, origin_run_id) VALUES "
            "(:a, 'plan', -1, 'completed', 1, '[1,2]', 1.5, 2.5, 1.0, NULL), "
            "(:a, 'item', 0, 'completed', 1, NULL, 3.0, NULL, 0.25, NULL), "
            "(:a, 'item', 1, 'failed', 3, NULL, 3.0, NULL, NULL, 'parent'), "
            "(:b, 'plan', -1, 'running', 1, NULL, 1.0, NULL, NULL, NULL)"),
            {"a": keys["old-a"], "b": keys["old-b"]})
        conn.execute(text("INSERT INTO raysaga_breakers (name, state, failures, opened_at, version, updated_at) "
                          "VALUES ('mail', 'open', 5, 7.5, 4, 7.5)"))
        conn.execute(text("INSERT INTO raysaga_rate_limits (name, blocked_until, version, updated_at) "
                          "VALUES ('model', 9.0, 2, 8.0)"))


def test_an_existing_schema_8_store_with_rows_is_converted_in_place(empty_url: str) -> None:
    _schema_8(empty_url)
    store = SqlStore(empty_url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT version FROM raysaga_schema")).scalar_one() == SCHEMA_VERSION == 15
            _check_layout(conn)
        # SQLite copied 'completed' as NULL; PostgreSQL kept its rows as they were (no rewrite)
        completed = None if store.engine.dialect.name == "sqlite" else "completed"
        got = {(n.node_id, n.fan_index): n for n in store.nodes("old-a")}
        assert {k: n.status for k, n in got.items()} == {("plan", -1): NodeStatus.COMPLETED,
                                                         ("item", 0): NodeStatus.COMPLETED,
                                                         ("item", 1): NodeStatus.FAILED}
        assert _stored_status(store, "old-a") == {("plan", -1): completed, ("item", 0): completed,
                                                  ("item", 1): "failed"}
        assert (got[("plan", -1)].output, got[("plan", -1)].finished_at) == ([1, 2], 2.5)
        assert (got[("item", 0)].finished_at, got[("item", 0)].duration) == (3.25, 0.25)
        assert (got[("item", 1)].attempt, got[("item", 1)].origin_run_id) == (3, "parent")
        assert [(n.node_id, n.status) for n in store.nodes("old-b")] == [("plan", NodeStatus.RUNNING)]
        # the breaker and the rate limit kept their rows, and still take compare-and-sets
        mail = store.breaker_get("mail")
        assert (mail.state, mail.failures, mail.opened_at, mail.version) == (BreakerState.OPEN, 5, 7.5, 4)
        assert store.breaker_cas(BreakerRecord(name="mail", state=BreakerState.HALF_OPEN, failures=5, opened_at=7.5,
                                               version=5), 4)
        assert not store.breaker_cas(BreakerRecord(name="mail", version=6), 4)
        assert store.breaker_get("mail").state is BreakerState.HALF_OPEN
        assert store.rate_acquire(RateRule(name="model", requests=1), now=8.5, hold=30).grant is None  # blocked
        assert store.rate_acquire(RateRule(name="model", requests=1), now=9.5, hold=30).grant is not None
        # the old run's node turns completed: written NULL now on both
        lease = store.claim("old-b", "me", 30)
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1,
                                                   output="b")]))
        assert _stored_status(store, "old-b") == {("plan", -1): None}
        assert [(n.status, n.output) for n in store.nodes("old-b")] == [(NodeStatus.COMPLETED, "b")]
    finally:
        store.close()
    again = SqlStore(empty_url)  # opening it again changes nothing
    try:
        with again.engine.connect() as conn:
            _check_layout(conn)
        assert len(again.nodes("old-a")) == 3
    finally:
        again.close()


def _check_layout(conn: Connection) -> None:
    insp = inspect(conn)
    assert {c["name"]: c["nullable"] for c in insp.get_columns("raysaga_nodes")}["status"] is True
    assert insp.get_pk_constraint("raysaga_nodes")["constrained_columns"] == ["run_key", "node_id", "fan_index"]
    [fk] = insp.get_foreign_keys("raysaga_nodes")
    assert (fk["constrained_columns"], fk["options"].get("ondelete")) == (["run_key"], "CASCADE")
    assert "ix_raysaga_runs_status" in {i["name"] for i in insp.get_indexes("raysaga_runs")}
    assert "ix_raysaga_nodes_output_digest" in {i["name"] for i in insp.get_indexes("raysaga_nodes")}
    assert not [t for t in insp.get_table_names() if t.endswith("__v8")]
    for table in SMALL_TABLES:
        assert insp.get_pk_constraint(table)["constrained_columns"] == ["name"]
    if conn.dialect.name == "sqlite":
        ddl = {r[0]: " ".join(str(r[1]).split()) for r in conn.execute(text("SELECT name, sql FROM sqlite_master"))}
        assert all(ddl[t].endswith("WITHOUT ROWID") for t in ("raysaga_nodes", *SMALL_TABLES))
        assert not [n for n in ddl if n.startswith("sqlite_autoindex_raysaga_breakers")
                    or n.startswith("sqlite_autoindex_raysaga_rate_limits")]
