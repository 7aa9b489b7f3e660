"""A run's node rows whole (``SqlStore.snapshot``, ``SqlStore.nodes``, ``node_states``): its rows
of ``raysaga_nodes`` and its item chunks read by the run's key, the chunks expanded here.

Through the view ``raysaga_node_rows`` the database expanded every chunk's items (``json_each``,
``json_array_elements``) and looked up, item by item, whether a row stands for it: reading a
10,000-item run cost ~+50% over the rows it had before chunks. Here the rows come as the view's
first part gives them (the same SQL: ``status`` and ``finished_at`` derived), and each chunk's
items are decoded by ``chunk_codec`` into the values the view computes (``item_values``: exact),
an item skipped when the run has a row for it (the row wins, as in the view). The records are
the view's, value for value; tests/state/test_whole_run_reads.py compares them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from sqlalchemy import Connection

from raysaga.state.chunk_codec import elements, item_values
from raysaga.state.decoding import reading
from raysaga.state.models import NodeRecord
from raysaga.state.run_sql import decoded
from raysaga.state.schema import item_chunks, node_rows, nodes, runs
from raysaga.state.statements import HotSql

#: The view's columns (``node_rows``), in its order.
_NAMES = tuple(node_rows.c.keys())
#: How the view's first part derives its columns from ``raysaga_nodes n`` (migration 0012).
_DERIVED = {"run_id": "r.run_id", "status": "COALESCE(n.status, 'completed')",
            "finished_at": "COALESCE(n.finished_at, n.started_at + n.duration)"}


@functools.cache
def _sql(dialect: str, outputs: bool) -> tuple[str, str]:
    """(the run's rows, as the view's first part gives them; its chunks), by run id."""
    mark = "?" if dialect == "sqlite" else "%s"
    columns = ", ".join(_DERIVED.get(n, f"n.{n}") if outputs or n != "output" else "NULL" for n in _NAMES)
    rows = (f"SELECT {columns} FROM {nodes.name} n JOIN {runs.name} r ON r.run_key = n.run_key "
            f"WHERE r.run_id = {mark}")
    chunks = (f"SELECT c.node_id, c.first_index, c.items, c.origin_run_id FROM {item_chunks.name} c "
              f"JOIN {runs.name} r ON r.run_key = c.run_key WHERE r.run_id = {mark}")
    return rows, chunks


def node_values(conn: Connection, run_id: str, *, outputs: bool = True) -> list[dict[str, Any]]:
    """The run's node rows as the view gives them (column -> value; ``output`` None unless
    ``outputs``): its rows, then its chunks' items (by node and index) that no row stands for.
    Call it inside ``decoding.reading``: a damaged row or chunk raises ``CorruptRecordError``."""
    rows_sql, chunks_sql = _sql(conn.dialect.name, outputs)
    hot = HotSql(conn)
    rows = decoded(conn, node_rows, hot.all(rows_sql, (run_id,)))
    chunks = sorted(hot.all(chunks_sql, (run_id,)), key=lambda c: (c[0], c[1]))
    if not chunks:
        return rows
    shown = {(r["node_id"], r["fan_index"]) for r in rows}  # a row wins over a chunk's entry
    for node_id, first, items, origin in chunks:
        for place, item in enumerate(elements(run_id, node_id, first, items)):
            if (node_id, first + place) not in shown:
                rows.append(item_values(run_id, node_id, first + place, item, origin, output=outputs))
    return rows


def node_records(conn: Connection, run_id: str, *, outputs: bool = True) -> list[NodeRecord]:
    """``node_values`` as records (a damaged one: ``CorruptRecordError`` naming the run)."""
    with reading(run_id, nodes.name):
        return [NodeRecord.model_validate(v) for v in node_values(conn, run_id, outputs=outputs)]


def by_start(records: list[NodeRecord]) -> list[NodeRecord]:
    """``records`` as ``SqlStore.nodes`` orders them (its SQL ordered so before): by ``started_at``,
    never-started last, then node id (code point order: SQLite's BINARY, PostgreSQL's "C"
    collation) and index; NaN after every number, as PostgreSQL sorts it."""
    def key(n: NodeRecord) -> tuple[bool, bool, float, str, int]:
        s = n.started_at
        nan = s is not None and math.isnan(s)
        return (s is None, nan, 0.0 if s is None or nan else s, n.node_id, n.fan_index)
    return sorted(records, key=key)
