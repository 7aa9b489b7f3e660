"""Completed fan-out items by the run of consecutive indexes: ``raysaga_item_chunks``.

A 10,000-item fan-out wrote 10,000 node rows, one insert each, a third of its driver's time on
a 2-core VM. The items a Ray task ran together complete together, so the driver writes each run
of consecutive completed plain items as one row: ``items``, a JSON array of ``[start, duration,
output]`` (and the attempt, when not 1), the times in whole ticks of 2**-22 s (exact: see
``statements.TICKS_PER_SECOND``), ``output`` the item's JSON text as a JSON string (stored text is
never re-rendered, so it reads back exactly) or null. ``schema.item_chunks`` says more.

The view ``raysaga_node_rows``, which every reader reads, shows each chunk's items as rows of
their own (SQLite: ``json_each``; PostgreSQL: ``json_array_elements ... WITH ORDINALITY``), the
same columns and values a row of ``raysaga_nodes`` gives; where ``raysaga_nodes`` holds a row for
the same item, that row wins. Nothing is rewritten: older stores keep their rows, new fan-outs
write chunks. A plain ``CREATE TABLE`` and the view again: the upgrade costs the same for a store
of any size.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

#: The view's columns after ``run_id``, in order, as schema 9 made them from ``raysaga_nodes n``.
_NODE_COLUMNS = ("node_id", "fan_index", "status", "attempt", "not_before", "output", "output_digest", "error",
                 "started_at", "finished_at", "duration", "origin_run_id")
_DERIVED = {"finished_at": "COALESCE(n.finished_at, n.started_at + n.duration)",
            "status": "COALESCE(n.status, 'completed')"}
_ROWS = ("SELECT r.run_id AS run_id, "
         + ", ".join(f"{_DERIVED.get(c, 'n.' + c)} AS {c}" for c in _NODE_COLUMNS)
         + " FROM raysaga_nodes n JOIN raysaga_runs r ON r.run_key = n.run_key")
#: The same columns, of a chunk's item: ``{i}`` is the item's 0-based place in the array; the
#: others its fields (0 start, 1 duration, both in ticks of 2**-22 s, whole numbers; 2 output; 3
#: attempt or absent: 1) as SQL values. A tick count divided by 4194304.0 is the time to the bit;
#: ``duration`` is ``finished - started``, as the driver computes it for a row.
_ITEM = ("SELECT r.run_id, c.node_id, c.first_index + {i}, 'completed', "
         # an element that is not an array (a chunk changed by hand) reads attempt NULL: refused as corrupt
         "CASE {kind} WHEN 'array' THEN COALESCE({attempt}, 1) END, NULL, {output}, "
         # the sum in integers (exact), then the one conversion to a float (exact: it was one)
         "NULL, NULL, CAST({start} AS DOUBLE PRECISION) / 4194304.0, "
         "CAST({start} + {took} AS DOUBLE PRECISION) / 4194304.0, "
         "CAST({start} + {took} AS DOUBLE PRECISION) / 4194304.0 - CAST({start} AS DOUBLE PRECISION) / 4194304.0, "
         "c.origin_run_id "
         "FROM raysaga_item_chunks c JOIN raysaga_runs r ON r.run_key = c.run_key{each} "
         "WHERE NOT EXISTS (SELECT 1 FROM raysaga_nodes n WHERE n.run_key = c.run_key "
         "AND n.node_id = c.node_id AND n.fan_index = c.first_index + {i})")
_SQLITE_ITEM = _ITEM.format(i="e.key", start="json_extract(e.value, '$[0]')", took="json_extract(e.value, '$[1]')",
                            output="json_extract(e.value, '$[2]')", attempt="json_extract(e.value, '$[3]')",
                            kind="e.type", each=", json_each(c.items) e")
_POSTGRES_ITEM = _ITEM.format(i="(e.i - 1)::integer", start="(e.v ->> 0)::bigint", took="(e.v ->> 1)::bigint",
                              output="(e.v ->> 2)::json", attempt="(e.v ->> 3)::integer", kind="json_typeof(e.v)",
                              each=" CROSS JOIN LATERAL json_array_elements(c.items) WITH ORDINALITY AS e(v, i)")


def view_sql(dialect: str) -> str:
    """The view ``raysaga_node_rows`` of schema 12 on ``dialect``."""
    item = _SQLITE_ITEM if dialect == "sqlite" else _POSTGRES_ITEM
    return f"CREATE VIEW raysaga_node_rows AS {_ROWS} UNION ALL {item}"


def upgrade() -> None:
    bind = op.get_bind()
    run = bind.exec_driver_sql
    sqlite = bind.dialect.name == "sqlite"
    run("CREATE TABLE raysaga_item_chunks (run_key BIGINT NOT NULL, node_id VARCHAR(200) NOT NULL, "
        f"first_index INTEGER NOT NULL, item_count INTEGER NOT NULL, items {'TEXT' if sqlite else 'JSON'} NOT NULL, "
        "origin_run_id VARCHAR(200), "
        "CONSTRAINT raysaga_item_chunks_pkey PRIMARY KEY (run_key, node_id, first_index), "
        "FOREIGN KEY (run_key) REFERENCES raysaga_runs (run_key) ON DELETE CASCADE)"
        + (" WITHOUT ROWID" if sqlite else ""))
    run("DROP VIEW raysaga_node_rows")
    run(view_sql(bind.dialect.name))
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 12 WHERE id = 1"))
