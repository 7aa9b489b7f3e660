"""Fleet-wide rate limits: a row per declared limit (admissions serialise on it; a 429's
retry-after blocks it) and a row per admitted call while it counts against the limit.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "raysaga_rate_limits",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("blocked_until", sa.Double, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        if_not_exists=True,
    )
    op.create_table(
        "raysaga_rate_grants",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("granted_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.Column("ended_at", sa.Double, nullable=True),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        if_not_exists=True,
    )
    op.create_index("ix_raysaga_rate_grants_name_ended", "raysaga_rate_grants", ["name", "ended_at"],
                    if_not_exists=True)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 5 WHERE id = 1"))
