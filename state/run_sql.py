"""The run row's own statements as plain SQL built once per dialect, and its rows decoded.

Creating a run, reading it (alone or with its effects and signals: the snapshot a driver starts
from; its nodes are read by key, ``node_reads``), claiming and releasing its lease, and the run
update of a driver's commit. Each run pays these once or twice, so their cost is per-run fixed
cost: as SQLAlchemy Core a fresh engine compiles every statement on its first use (~13 of them
on a run's start and end, ~5% of a 200-step chain) and cache-keys each on every execution. Here
each is a string built once per process and run through ``HotSql`` (the DBAPI cursor on SQLite,
``exec_driver_sql`` elsewhere).

The SQL says exactly what the Core statements said (same columns, same conditions, same
``RETURNING``), and rows are decoded with the JSON columns' own result processors
(``JsonText``), so a value reads back as through Core: text that is not JSON still raises the
``CorruptRecordError`` naming its column, inside the caller's ``reading`` context.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Connection, Table

from raysaga.errors import RunNotFoundError
from raysaga.state.decoding import no_such_id, reading, record_of
from raysaga.state.models import RunRecord
from raysaga.state.schema import JsonText, effects, runs, signals
from raysaga.state.statements import HotSql, json_param

#: The run row's columns, in table order: what every run statement here selects or returns
#: (not ``run_key``: only node rows use it, schema 8).
RUN_COLUMNS: tuple[str, ...] = tuple(c.name for c in runs.c if c.name != "run_key")
R = TypeVar("R", bound=BaseModel)
_JSON_RUN_COLUMNS = frozenset(c.name for c in runs.c if isinstance(c.type, JsonText))


def _mark(dialect: str) -> str:
    return "?" if dialect == "sqlite" else "%s"


def _param(dialect: str, name: str) -> str:
    # PostgreSQL takes JSON text into a json column only with a cast; SQLite stores it as text
    mark = _mark(dialect)
    return f"CAST({mark} AS JSON)" if dialect != "sqlite" and name in _JSON_RUN_COLUMNS else mark


def _names(table: Table) -> list[str]:
    return list(RUN_COLUMNS) if table is runs else table.c.keys()


def _select(table: Table) -> str:
    return f"SELECT {', '.join(_names(table))} FROM {table.name}"


@dataclass(frozen=True)
class RunSql:
    """The run's fixed statements for one dialect (qmark or format parameters)."""

    select_run: str
    lease_state: str
    """(lease_owner, status) of the run: who held it before a claim."""
    claim: str
    """Takes a free (never taken, released or expired) lease: fence + 1, one event seq reserved."""
    claim_taking: str
    """``claim``, or the lease of one owner proven gone (``take_from``)."""
    release: str
    effects: str
    signals: str
    """The run's unconsumed signals, oldest first."""


@functools.cache
def run_sql(dialect: str) -> RunSql:
    m = _mark(dialect)
    claim = (f"UPDATE {runs.name} SET lease_owner = {m}, lease_expires_at = {m}, fence = fence + 1, "
             f"event_seq = event_seq + 1, updated_at = {m} "
             f"WHERE run_id = {m} AND (lease_owner IS NULL OR lease_expires_at < {m}")
    returning = ") RETURNING fence, event_seq"
    return RunSql(
        select_run=f"{_select(runs)} WHERE run_id = {m}",
        lease_state=f"SELECT lease_owner, status FROM {runs.name} WHERE run_id = {m}",
        claim=claim + returning,
        claim_taking=f"{claim} OR lease_owner = {m}{returning}",
        release=(f"UPDATE {runs.name} SET lease_owner = NULL, lease_expires_at = NULL "
                 f"WHERE run_id = {m} AND fence = {m}"),
        effects=f"{_select(effects)} WHERE run_id = {m}",
        signals=f"{_select(signals)} WHERE run_id = {m} AND consumed_at IS NULL ORDER BY id",
    )


@functools.cache
def insert_run_sql(dialect: str, names: tuple[str, ...]) -> str:
    """INSERT of a run row with the columns ``names`` (the others NULL), returning the row."""
    return (f"INSERT INTO {runs.name} ({', '.join(names)}) VALUES ({', '.join(_param(dialect, n) for n in names)}) "
            f"RETURNING {', '.join(RUN_COLUMNS)}")


@functools.cache
def update_run_sql(dialect: str, names: tuple[str, ...], bump_version: bool) -> str:
    """UPDATE of the columns ``names`` of the run row under a lease's fence (``version + 1``
    with ``bump_version``: a transition), returning the row."""
    sets = [f"{n} = {_param(dialect, n)}" for n in names] + (["version = version + 1"] if bump_version else [])
    m = _mark(dialect)
    return (f"UPDATE {runs.name} SET {', '.join(sets)} WHERE run_id = {m} AND fence = {m} "
            f"RETURNING {', '.join(RUN_COLUMNS)}")


def run_params(values: dict[str, Any]) -> tuple[Any, ...]:
    """The parameters of ``values`` (column -> value) for ``insert_run_sql`` / ``update_run_sql``."""
    return tuple(json_param(v) if k in _JSON_RUN_COLUMNS else v for k, v in values.items())


# ---------------------------------------------------------------- rows back into values

_Processors = list[tuple[int, Callable[[Any], Any]]]
_PROCESSORS: dict[tuple[str, str], _Processors] = {}


def _processors(conn: Connection, table: Table) -> _Processors:
    """The result processors Core would apply to ``table``'s columns on this dialect: its JSON
    columns' (``JsonText``: JSON text back into values on SQLite, as psycopg already returns them
    on PostgreSQL). The other column types need none on either dialect."""
    key = (table.name, conn.dialect.name)
    found = _PROCESSORS.get(key)
    if found is None:
        found = []
        for i, column in enumerate(table.c[name] for name in _names(table)):
            if isinstance(column.type, JsonText):
                process = column.type.dialect_impl(conn.dialect).result_processor(conn.dialect, None)
                if process is not None:
                    found.append((i, process))
        _PROCESSORS[key] = found
    return found


def decoded(conn: Connection, table: Table, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows of ``_select(table)`` as column -> value, decoded as Core decodes them (call it inside
    ``reading``: a JSON column that is not JSON raises ``CorruptRecordError``)."""
    names = _names(table)
    processors = _processors(conn, table)
    out = []
    for row in rows:
        values = list(row)
        for i, process in processors:
            values[i] = process(values[i])
        out.append(dict(zip(names, values, strict=True)))
    return out


def run_of(conn: Connection, run_id: str, row: Sequence[Any] | None, *, lenient: bool) -> RunRecord:
    """A run row (all ``RUN_COLUMNS``) as its record; ``RunNotFoundError`` for None."""
    if row is None:
        raise RunNotFoundError(run_id)
    with reading(run_id, runs.name):
        (values,) = decoded(conn, runs, [row])
    return record_of(conn, values, lenient=lenient)


def read_run(conn: Connection, run_id: str, *, lenient: bool = False) -> RunRecord:
    """The run row as its record (input and output read from their blobs when kept there)."""
    no_such_id(conn.dialect.name, run_id)
    with reading(run_id, runs.name):
        row = HotSql(conn).one(run_sql(conn.dialect.name).select_run, (run_id,))
    return run_of(conn, run_id, row, lenient=lenient)


def read_records(conn: Connection, run_id: str, table: Table, statement: str, model: type[R]) -> list[R]:
    """The rows of one of the run's tables (``statement`` selects all its columns) as ``model``s."""
    with reading(run_id, table.name):
        return [model.model_validate(v) for v in decoded(conn, table, HotSql(conn).all(statement, (run_id,)))]


__all__ = ["RUN_COLUMNS", "RunSql", "decoded", "insert_run_sql", "read_records", "read_run", "run_of", "run_params",
           "run_sql", "update_run_sql"]
