"""The waiting node rows by run: a partial index, ``ix_raysaga_nodes_waiting``.

The approvals inbox (``raysaga inbox``, the dashboard's, ``Client.inbox``: ``decisions.waiting``
without a run id) looks for the node rows ``waiting``: a handful (approvals asked, sleeps) among
every completed row the store keeps. It read them through the view ``raysaga_node_rows`` with
``status = 'waiting'``, which neither database can answer from an index (the view's status is
``COALESCE(status, 'completed')``): both read every row of ``raysaga_nodes`` (SQLite
materialising the view), 7 ms (SQLite) and 10 ms (PostgreSQL) for 100,000 completed rows. Now the
inbox reads ``raysaga_nodes`` itself (a waiting node is always a row of it) with the index's own
predicate, so it is an index lookup whatever the store holds; the index holds an entry per waiting
row only, so the commits that write completed rows pay nothing for it.

A ``CREATE INDEX``: it reads the node table once (on PostgreSQL blocking writes to it meanwhile;
6 ms on SQLite, 9 to 17 ms on PostgreSQL per 100,000 rows on a 2-core VM) and rewrites nothing.
The downgrade drops it.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from raysaga.state.schema import WAITING_ROWS

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_INDEX = "ix_raysaga_nodes_waiting"


def upgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {_INDEX} ON raysaga_nodes (run_key) WHERE {WAITING_ROWS}")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 14 WHERE id = 1"))


def downgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(f"DROP INDEX IF EXISTS {_INDEX}")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 13 WHERE id = 1"))
