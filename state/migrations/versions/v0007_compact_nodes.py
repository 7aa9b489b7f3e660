"""Smaller node rows: ``raysaga_nodes`` without a rowid on SQLite, and compact item rows.

- SQLite: the table is rebuilt ``WITHOUT ROWID``, so its rows live in the primary key's b-tree.
  A rowid table stored the key (``run_id, node_id, fan_index``) twice, in the table and in its
  automatic index: ~40 of a fan-out item row's ~130 bytes. The rebuild copies every row inside
  the database, in the migration's transaction (a crash leaves the old table whole), by hand
  rather than with alembic's batch mode, which would reflect the partial index without its
  ``WHERE``. Dropping the child table with foreign keys on deletes nothing elsewhere: no table
  references ``raysaga_nodes``. PostgreSQL has no rowid: its heap table stays as it is.
- Both: a completed plain fan-out item is written with ``finished_at`` NULL and its duration
  (``statements.item_rows``); readers derive it (since schema 8, the view ``raysaga_node_rows``
  does). Rows written before keep ``finished_at``: nothing to convert.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TABLE = "raysaga_nodes"
_NEW = "raysaga_nodes__v7"
_INDEX = ("CREATE INDEX IF NOT EXISTS ix_raysaga_nodes_output_digest ON raysaga_nodes (output_digest) "
          "WHERE output_digest IS NOT NULL")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _without_rowid(bind)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 7 WHERE id = 1"))


def _without_rowid(bind: sa.Connection) -> None:
    found = bind.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                 (_TABLE,)).scalar_one()
    ddl = " ".join(str(found).split())  # SQLite keeps the DDL as written (ADD COLUMN appends to it)
    if ddl.upper().endswith("WITHOUT ROWID"):
        return
    prefix = ddl[:ddl.index("(")]
    if prefix.split()[-1].strip('"') != _TABLE:
        raise RuntimeError(f"unexpected DDL of {_TABLE}: {ddl[:80]!r}")
    columns = ", ".join(f'"{row[1]}"' for row in bind.exec_driver_sql(f'PRAGMA table_info("{_TABLE}")'))
    bind.exec_driver_sql(f'CREATE TABLE "{_NEW}" {ddl[len(prefix):]} WITHOUT ROWID')
    bind.exec_driver_sql(f'INSERT INTO "{_NEW}" ({columns}) SELECT {columns} FROM "{_TABLE}"')
    bind.exec_driver_sql(f'DROP TABLE "{_TABLE}"')  # its indexes go with it
    bind.exec_driver_sql(f'ALTER TABLE "{_NEW}" RENAME TO "{_TABLE}"')
    bind.exec_driver_sql(_INDEX)
