"""Migration 0014 (the partial index ``ix_raysaga_nodes_waiting``), up and down, on SQLite and
PostgreSQL, with runs and their node rows in the store: the upgrade adds the index over the rows
already there (the inbox finds the approval a schema-13 store held), the downgrade drops it and
keeps every row, and opening the store again upgrades it again."""

from __future__ import annotations

import json

from sqlalchemy import Engine, text

from raysaga.state import SqlStore
from raysaga.state.engine import make_engine
from raysaga.state.schema import SCHEMA_VERSION
from tests.state.test_migration_v0013_stop30 import _insert, _state
from tests.support.old_schema import downgrade, store_at

INDEX = "ix_raysaga_nodes_waiting"


def _index_sql(engine: Engine) -> str | None:
    """The index's definition as the database keeps it, or None."""
    sqlite = engine.dialect.name == "sqlite"
    query = ("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n" if sqlite
             else "SELECT indexdef FROM pg_indexes WHERE indexname = :n")
    with engine.connect() as conn:
        found = conn.execute(text(query), {"n": INDEX}).scalar_one_or_none()
    return None if found is None else str(found)


def _node(engine: Engine, run_id: str, node: str, index: int, status: str | None, output: object) -> None:
    cast = "CAST(:o AS JSON)" if engine.dialect.name == "postgresql" else ":o"
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, output) "
                          f"SELECT run_key, :n, :i, :s, 1, {cast} FROM raysaga_runs WHERE run_id = :r"),
                     {"n": node, "i": index, "s": status, "o": json.dumps(output), "r": run_id})


def _rows(engine: Engine) -> list[tuple[str, str, int, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT r.run_id, n.node_id, n.fan_index, n.status FROM raysaga_nodes n "
                                 "JOIN raysaga_runs r ON r.run_key = n.run_key ORDER BY r.run_id, n.node_id, "
                                 "n.fan_index")).all()
    return [(str(a), str(b), int(c), None if d is None else str(d)) for a, b, c, d in rows]


def _schema_13_store(url: str) -> list[tuple[str, str, int, str | None]]:
    """A schema-13 store as a raysaga of schema 13 left it: a run waiting for an approval (and a
    completed step before it), a sleeping one, a completed one; the index not there yet."""
    with store_at(url, "0013") as engine:
        assert _state(engine) == (13, ["0013"]) and _index_sql(engine) is None
        for run_id, status in (("asks", "waiting_human"), ("sleeps", "waiting_timer"), ("done", "completed")):
            _insert(engine, run_id, status, None)
        _node(engine, "asks", "before", -1, None, 1)
        _node(engine, "asks", "approve", -1, "waiting", {"approval": {"prompt": "ship it?", "asked_at": 5.0}})
        _node(engine, "sleeps", "nap", -1, "waiting", None)
        _node(engine, "done", "only", 3, None, 2)
        return _rows(engine)


def test_a_schema_13_store_with_waiting_rows_is_upgraded_and_its_inbox_read_by_the_index(empty_url: str) -> None:
    before = _schema_13_store(empty_url)
    store = SqlStore(empty_url)
    try:
        assert SCHEMA_VERSION == 15 and _state(store.engine) == (15, ["0015"])
        definition = _index_sql(store.engine)
        assert definition is not None and "(run_key)" in definition and "'waiting'" in definition, definition
        assert _rows(store.engine) == before
        assert [(w.run_id, w.node, w.request.prompt) for w in store.waiting_approvals()] == \
            [("asks", "approve", "ship it?")]
    finally:
        store.close()


def test_the_downgrade_drops_the_index_and_keeps_the_rows(empty_url: str) -> None:
    before = _schema_13_store(empty_url)
    SqlStore(empty_url).close()  # upgraded to 14
    downgrade(empty_url, "0013")
    engine = make_engine(empty_url)
    try:
        assert _state(engine) == (13, ["0013"]) and _index_sql(engine) is None
        assert _rows(engine) == before
    finally:
        engine.dispose()

    again = SqlStore(empty_url)  # opening it upgrades it again: the index is back
    try:
        assert _state(again.engine) == (15, ["0015"]) and _index_sql(again.engine) is not None
        assert [w.node for w in again.waiting_approvals()] == ["approve"]
    finally:
        again.close()
