"""Large run inputs and outputs as blobs: raysaga_runs.input_digest and output_digest.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    columns = {c["name"] for c in sa.inspect(bind).get_columns("raysaga_runs")}
    with op.batch_alter_table("raysaga_runs") as batch:
        for name in ("input_digest", "output_digest"):
            if name not in columns:
                batch.add_column(sa.Column(name, sa.String(80), nullable=True))
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 3 WHERE id = 1"))
