"""Initial schema: runs, nodes, effects ledger, events, blobs, signals.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from raysaga.state.schema import blobs, effects, events, nodes, runs, schema_info, signals

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The tables as version 1 defined them. A later migration alters them with op.* calls;
# it never edits this file.
_TABLES = (schema_info, runs, nodes, effects, events, blobs, signals)


def upgrade() -> None:
    bind = op.get_bind()
    for table in _TABLES:
        table.create(bind, checkfirst=True)
    bind.execute(sa.delete(schema_info))
    bind.execute(sa.insert(schema_info).values(id=1, version=1))
